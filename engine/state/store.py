"""The StateManager's store: every job's model state in three tiers under canonical keys.

- **device**: resident in a WPG. The store owns no device memory; it records which models each WPG
  holds, for accounting and setup-cost estimates.
- **host**: one file per blob in a shared-memory folder of the node (``/dev/shm``). WPG ranks map
  the files themselves (``engine.state.rank_client``), so tensors never pass through the manager.
- **disk**: safetensors files under ``<root>/blobs`` written by ``materialize``, and the read-only
  weight files of registered base models, read through a memory map.

A key ``(model, name, shard)`` names one slice of one logical tensor of one model (a deployment, or
a base model; ``name`` is the canonical Hugging Face tensor name, optimizer state is
``"<param>::<field>"``, ``shard`` a ``ShardSpec``); it points to a *blob*: one tensor's bytes.
``models[model]`` maps each ``(name, shard)`` to its blob. A blob whose content hash
is known (``h-`` ids: registered base weights) is shared by every key with that content, so the
base model under N jobs' frozen references is held once per tier; blobs a trainer wrote (``u-``
ids) are not hashed, since trained weights differ anyway and hashing would slow every offload.
Blobs are reference-counted by keys and freed, in every tier, when the last key goes.

Durability: ``materialize(model)`` writes the model's blobs and then its manifest (fsynced, renamed
into place); a store started on the same root reads the manifests back, so a crash after
``materialize`` loses none of that state. The host tier is volatile and starts empty.

Thread-safe: the Ray actor (``engine.state.manager``) calls it from several threads. Metadata
changes happen under one lock; disk reads and writes happen outside it on pinned blobs.
"""

from __future__ import annotations

import fcntl
import functools
import hashlib
import itertools
import json
import math
import mmap
import os
import shutil
import struct
import tempfile
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

import torch

from engine.errors import StateError, UnknownKey
from engine.state.layout import WHOLE, ShardSpec

TRANSITIONS = ("disk->host", "host->device", "device->host", "host->disk")
_CHUNK = 64 << 20  # bytes per read/write/hash call


# -- keys, metadata, errors ------------------------------------------------------------------------


@dataclass(frozen=True)
class TensorMeta:
    dtype: str  # torch dtype name without the "torch." prefix
    shape: tuple[int, ...]
    # derived once: a swap asks for them several times per tensor
    torch_dtype: torch.dtype = field(init=False, repr=False, compare=False)
    nbytes: int = field(init=False, repr=False, compare=False)

    def __post_init__(self):
        dtype = _torch_dtype(self.dtype)
        object.__setattr__(self, "torch_dtype", dtype)
        object.__setattr__(self, "nbytes", dtype.itemsize * math.prod(self.shape))
        object.__setattr__(self, "_hash", hash((self.dtype, self.shape)))

    def __hash__(self) -> int:
        return self._hash

    def __reduce__(self):  # the derived fields are not sent: a str's hash differs between processes
        return TensorMeta, (self.dtype, self.shape)

    @classmethod
    def of(cls, t: torch.Tensor) -> TensorMeta:
        return _meta(str(t.dtype).removeprefix("torch."), tuple(t.shape))

    def describe(self) -> str:
        return f"{self.dtype}{list(self.shape)}"


_DTYPES: dict[str, torch.dtype] = {}


def _torch_dtype(name: str) -> torch.dtype:
    """``torch.<name>``, looked up once per name (a swap asks for it per tensor)."""
    dtype = _DTYPES.get(name)
    if dtype is None:
        dtype = getattr(torch, name)
        if not isinstance(dtype, torch.dtype):
            raise Mismatch(f"{name!r} is not a torch dtype")
        _DTYPES[name] = dtype
    return dtype


class Mismatch(StateError, ValueError):
    """A tensor's shape or dtype is not what the reader or writer expects."""


class OverBudget(StateError, MemoryError):
    """The host tier cannot make room for a request even after evicting all it may."""


def shard_shape(whole: tuple[int, ...], spec: ShardSpec) -> tuple[int, ...]:
    """The shape of slice ``spec`` of a tensor of shape ``whole``."""
    if spec == WHOLE:
        return tuple(whole)
    shape = list(whole)
    shape[spec.dim] //= spec.count
    return tuple(shape)


def _shards_by_name(keys: dict[tuple[str, ShardSpec], str]) -> dict[str, list[ShardSpec]]:
    out: dict[str, list[ShardSpec]] = defaultdict(list)
    for name, shard in keys:
        out[name].append(shard)
    return out


# -- blobs -----------------------------------------------------------------------------------------

ABSENT, LOADING, WRITING, READY = "absent", "loading", "writing", "ready"


@dataclass(frozen=True)
class DiskLoc:
    path: str
    offset: int  # byte offset of the tensor's data in the file
    owned: bool  # a blob file this store wrote (deleted with the blob); else a registered model file


@dataclass(slots=True)
class Blob:
    id: str
    meta: TensorMeta
    refs: int = 0  # keys pointing at it
    host: str = ABSENT
    file: str | None = None  # its host file while LOADING, WRITING or READY (None for 0 bytes)
    disk: DiskLoc | None = None
    used: int = 0  # logical clock of the last read or write (eviction order)
    pins: int = 0  # readers between plan and done, writers between reserve and commit

    @property
    def busy(self) -> bool:
        """Being loaded or written: readers of its bytes wait (``StateStore._settled``)."""
        return self.host in (LOADING, WRITING)


# A read's plan, in plain tuples: a swap plans about a hundred tensors, and plain tuples cost nothing
# to build and pickle in C (a named tuple or dataclass costs a Python call each way; the specs and
# metadata inside are few distinct objects, which pickle sends once each).
Piece = tuple[str, "str | None", TensorMeta, ShardSpec]
"""``(blob, host file, meta, stored shard)``: one stored slice a reader copies from (no host file
for an empty tensor)."""
ReadItem = tuple[str, ShardSpec, tuple[Piece, ...]]
"""``(name, wanted shard, pieces)``: a slice the reader asked for and the stored slices covering it."""


@dataclass
class _Reservation:
    model: str
    entries: list[tuple[tuple[str, ShardSpec], str]]  # (name, shard) -> blob it will point to
    new_blobs: list[str]
    nbytes: int  # of the new blobs
    remove: list[tuple[str, ShardSpec]]
    pinned: list[str]


@functools.lru_cache(maxsize=65536)
def _meta(dtype: str, shape: tuple[int, ...]) -> TensorMeta:
    return TensorMeta(dtype, shape)  # a model's layers share their shapes: one object each


def safetensors_index(path: Path) -> dict[str, tuple[TensorMeta, int]]:
    """``{name: (meta, absolute data offset)}`` of a safetensors file, from its header only."""
    with open(path, "rb") as f:
        (header_len,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(header_len))
    out = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        meta = TensorMeta(_SAFETENSORS_DTYPES[entry["dtype"]], tuple(entry["shape"]))
        out[name] = (meta, 8 + header_len + entry["data_offsets"][0])
    return out


_SAFETENSORS_DTYPES = {"F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16",
                       "I64": "int64", "I32": "int32", "I16": "int16", "I8": "int8", "U8": "uint8",
                       "BOOL": "bool"}
_SAFETENSORS_NAMES = {v: k for k, v in _SAFETENSORS_DTYPES.items()}


def _write_safetensors_blob(path: Path, meta: TensorMeta, src: memoryview) -> int:
    """Write one tensor named ``t`` as a safetensors file, fsynced; returns the data offset."""
    header = json.dumps({"t": {"dtype": _SAFETENSORS_NAMES[meta.dtype], "shape": list(meta.shape),
                               "data_offsets": [0, meta.nbytes]}}).encode()
    header += b" " * (-len(header) % 8)  # data starts 8-byte aligned
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(header)))
        f.write(header)
        for i in range(0, len(src), _CHUNK):
            f.write(src[i:i + _CHUNK])
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return 8 + len(header)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _content_id(meta: TensorMeta, data: memoryview) -> str:
    h = hashlib.blake2b(digest_size=16)
    h.update(f"{meta.dtype}{meta.shape}".encode())
    for i in range(0, len(data), _CHUNK):
        h.update(data[i:i + _CHUNK])
    return "h-" + h.hexdigest()


def _map_file(path: str | Path, size: int, *, write: bool) -> mmap.mmap:
    with open(path, "r+b" if write else "rb") as f:
        return mmap.mmap(f.fileno(), size, access=mmap.ACCESS_WRITE if write else mmap.ACCESS_READ)


def _lock_path(host_dir: Path) -> Path:
    return host_dir.with_name(host_dir.name + ".lock")


def _lock_host_dir(host_dir: Path) -> int | None:
    """Hold ``<host_dir>.lock`` (an flock) while this store lives: the kernel lets go of it when
    the process dies, however it dies, which tells a later store the folder is garbage. Returns
    the descriptor, or None if another live store holds it (a test's second store on one folder)."""
    lock = _lock_path(host_dir)
    while True:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return None
        try:
            if os.stat(lock).st_ino == os.fstat(fd).st_ino:
                return fd
        except FileNotFoundError:
            pass
        os.close(fd)  # a sweep removed the file between our open and lock: take the new one


def _remove_stale_host_dirs(parent: Path) -> None:
    """Shared memory outlives processes: remove the host folders (and sockets) of stores whose
    process died without ``close`` (killed, out of memory, a Ray session torn down). Only folders
    with a lock file are considered; one is stale when nobody holds its lock."""
    for lock in parent.glob("*.lock"):
        folder = lock.with_name(lock.name.removesuffix(".lock"))
        try:
            fd = os.open(lock, os.O_RDWR)
        except FileNotFoundError:
            continue
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue  # alive
            shutil.rmtree(folder, ignore_errors=True)
            for sock in parent.glob(f"{folder.name}-*.sock"):
                sock.unlink(missing_ok=True)
            lock.unlink(missing_ok=True)
        finally:
            os.close(fd)


def default_host_dir(node: str = "local") -> Path:
    shm = Path("/dev/shm")  # noqa: S108 - the node's shared memory, in a folder of this user
    base = shm if shm.is_dir() and os.access(shm, os.W_OK) else Path(tempfile.gettempdir())
    return base / f"plexrl-{os.getuid()}" / node


def default_host_budget() -> int:
    """Half of the node's memory, at most what the shared-memory folder can hold."""
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    budget = total // 2
    try:
        stat = os.statvfs(default_host_dir().parent.parent)
        budget = min(budget, stat.f_bavail * stat.f_frsize)
    except OSError:
        pass
    return budget


# -- the store -------------------------------------------------------------------------------------


class StateStore:
    def __init__(self, root: Path, host_dir: Path, host_budget: int | None = None):
        self.root = Path(root)
        self.host_dir = Path(host_dir)
        self.host_budget = default_host_budget() if host_budget is None else int(host_budget)
        self._lock = threading.Lock()
        self._settle = threading.Condition(self._lock)  # notified when a blob stops being busy
        self._clock = 0
        # Host files are named once and keep their name for life (a freed blob's file goes to the
        # pool under the same name): a rank's kept mappings are found by name without a stat, and
        # a name is never given to another file, this store instance's prefix included.
        self._instance = uuid.uuid4().hex[:12]
        self._names = itertools.count()
        self.unlinks = 0  # host files deleted so far: a rank drops its mappings when it changes
        self.blobs: dict[str, Blob] = {}
        self.models: dict[str, dict[tuple[str, ShardSpec], str]] = {}  # model -> (name, shard) -> blob
        self.host_bytes = 0  # READY + WRITING + LOADING blobs (reserved bytes count at once)
        # Host files of freed blobs, by size, kept for the next blob of that size: a job swapped
        # out again writes into pages that are already mapped in, instead of faulting in and
        # zeroing fresh ones. They count against the budget and are the first thing evicted.
        self.pool: dict[int, list[str]] = defaultdict(list)
        self.pool_bytes = 0
        self.soon: set[str] = set()  # models a prefetch hint says are needed next
        self.resident: dict[str, dict[str, int]] = defaultdict(dict)  # wpg -> model -> bytes
        self.transfers: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0, 0.0, 0])
        self._reservations: dict[str, _Reservation] = {}
        self.durable: dict[str, dict[tuple[str, ShardSpec], str]] = {}  # model -> its manifest's keys
        self._reads: dict[str, list[str]] = {}
        for sub in ("blobs", "manifests"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        self.host_dir.parent.mkdir(parents=True, exist_ok=True)
        self._host_lock = _lock_host_dir(self.host_dir)
        _remove_stale_host_dirs(self.host_dir.parent)
        for sock in self.host_dir.parent.glob(f"{self.host_dir.name}-*.sock"):  # a dead predecessor's
            sock.unlink(missing_ok=True)
        shutil.rmtree(self.host_dir, ignore_errors=True)  # the host tier is volatile: never trusted
        self.host_dir.mkdir(parents=True, exist_ok=True)
        self._recover()

    # -- bookkeeping helpers (call with the lock held) -----------------------------------------
    @property
    def epoch(self) -> tuple[str, int]:
        """Changes whenever a host file is deleted (or the store restarts): a rank whose kept
        mappings are of an older epoch looks for mappings of deleted files (``HostMaps.sweep``)."""
        return self._instance, self.unlinks

    def _new_name(self) -> str:
        return f"{self._instance}-{next(self._names)}"

    def _settled(self, blobs: Iterable[Blob]) -> None:
        """Wait (with the lock held) until none of ``blobs`` is being loaded or written."""
        blobs = list(blobs)
        self._settle.wait_for(lambda: not any(b.busy for b in blobs))

    def _keys_of(self, model: str) -> dict[tuple[str, ShardSpec], str]:
        try:
            return self.models[model]
        except KeyError:
            raise UnknownKey(f"no state for model {model!r}") from None

    def _point(self, model: str, name: str, shard: ShardSpec, blob_id: str) -> None:
        keys = self.models.setdefault(model, {})
        old = keys.get((name, shard))
        self.blobs[blob_id].refs += 1
        keys[(name, shard)] = blob_id
        if old is not None:
            self._decref(old)

    def _unpoint(self, model: str, name: str, shard: ShardSpec) -> None:
        old = self.models[model].pop((name, shard))
        self._decref(old)

    def _decref(self, blob_id: str) -> None:
        blob = self.blobs[blob_id]
        blob.refs -= 1
        if blob.refs == 0 and blob.pins == 0:
            self._free(blob)

    def _new_host_file(self, blob: Blob) -> str | None:
        """Give a blob about to be written a host file: a pooled file of its size, else a new one
        (an empty tensor has none)."""
        n = blob.meta.nbytes
        if not n:
            path = None
        elif self.pool[n]:
            path = self.pool[n].pop()
            self.pool_bytes -= n
        else:
            path = str(self.host_dir / self._new_name())
            with open(path, "wb") as f:
                f.truncate(n)
        blob.file = path
        return path

    def _drop_host_file(self, blob: Blob) -> None:
        """A blob leaves the host tier: its file (same name) waits in the pool for the next blob
        of its size."""
        n = blob.meta.nbytes
        if blob.file is not None:
            self.pool[n].append(blob.file)
            self.pool_bytes += n
            blob.file = None
        self.host_bytes -= n

    def _unlink(self, path: str) -> None:
        os.unlink(path)
        self.unlinks += 1

    def _free(self, blob: Blob) -> None:
        if blob.host in (READY, WRITING):
            self._drop_host_file(blob)
        if blob.disk is not None and blob.disk.owned:
            Path(blob.disk.path).unlink(missing_ok=True)
        del self.blobs[blob.id]

    def _unpin(self, blob_ids: Iterable[str]) -> None:
        for b in blob_ids:
            blob = self.blobs[b]
            blob.pins -= 1
            if blob.refs == 0 and blob.pins == 0:
                self._free(blob)

    def record(self, model: str, transition: str, nbytes: int, seconds: float) -> None:
        """Account one transition's bytes and seconds (ranks report device <-> host copies)."""
        if transition not in TRANSITIONS:
            raise ValueError(f"unknown transition {transition!r}; known: {', '.join(TRANSITIONS)}")
        with self._lock:
            self._add_transfer(model, transition, nbytes, seconds)

    def _add_transfer(self, model: str, transition: str, nbytes: int, seconds: float) -> None:
        entry = self.transfers[(model, transition)]  # call with the lock held
        entry[0] += int(nbytes)
        entry[1] += float(seconds)
        entry[2] += 1

    # -- registering and forking ---------------------------------------------------------------
    def register_model(self, model: str, folder: Path) -> dict[str, int]:
        """Make a Hugging Face model folder's weights the disk state of ``model`` (idempotent).

        The files stay where they are (read-only, never deleted); each tensor's content hash is
        computed once, so identical weights registered under several names share one blob."""
        files = sorted(Path(folder).glob("*.safetensors"))
        if not files:
            raise UnknownKey(f"no *.safetensors weights in {folder}")
        with self._lock:
            if model in self.models:
                return {"tensors": len(self.models[model]), "bytes": self._model_bytes(model)}
        entries = []
        for f in files:
            index = safetensors_index(f)
            with open(f, "rb") as fh:
                mm = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) if f.stat().st_size else None
                try:
                    for name, (meta, offset) in index.items():
                        view = memoryview(mm)[offset:offset + meta.nbytes] if mm else memoryview(b"")
                        entries.append((name, meta, _content_id(meta, view), DiskLoc(str(f), offset, False)))
                        view.release()
                finally:
                    if mm is not None:
                        mm.close()
        with self._lock:
            if model in self.models:  # registered by a concurrent call meanwhile
                return {"tensors": len(self.models[model]), "bytes": self._model_bytes(model)}
            for name, meta, blob_id, loc in entries:
                blob = self.blobs.setdefault(blob_id, Blob(blob_id, meta))
                if blob.disk is None:
                    blob.disk = loc
                self._point(model, name, WHOLE, blob_id)
            return {"tensors": len(entries), "bytes": self._model_bytes(model)}

    def fork(self, src: str, dst: str) -> None:
        """``dst`` starts as ``src``: its keys point to the same blobs (no bytes are copied)."""
        with self._lock:
            keys = dict(self._keys_of(src))
            if dst in self.models:
                raise StateError(f"model {dst!r} already has state")
            for (name, shard), blob_id in keys.items():
                self._point(dst, name, shard, blob_id)

    def has_model(self, model: str) -> bool:
        with self._lock:
            return model in self.models

    def keys(self, model: str) -> dict[tuple[str, ShardSpec], TensorMeta]:
        with self._lock:
            return {k: self.blobs[b].meta for k, b in self._keys_of(model).items()}

    def _model_bytes(self, model: str) -> int:
        return sum(self.blobs[b].meta.nbytes for b in self.models.get(model, {}).values())

    # -- reading (disk -> host, then the reader copies host -> device) --------------------------
    def _pieces_for(self, model: str, name: str, want: ShardSpec,
                    index: dict[str, dict[ShardSpec, str]]) -> list[tuple[ShardSpec, str]]:
        """The fewest stored slices of ``name`` that cover ``want``: the slice itself, the whole
        tensor (the reader takes a view), the stored shards it is made of, or all of them.
        ``index``: the model's keys grouped by name."""
        stored = index.get(name)
        if not stored:
            raise UnknownKey(f"model {model!r} has no tensor {name!r}")
        if want in stored:
            return [(want, stored[want])]
        if WHOLE in stored:
            return [(WHOLE, stored[WHOLE])]
        for dim, count in sorted({(s.dim, s.count) for s in stored}):
            parts = [ShardSpec(dim, i, count) for i in range(count)]
            if not all(p in stored for p in parts):
                continue
            if want.dim == dim and count % want.count == 0:
                per = count // want.count
                parts = parts[want.index * per:(want.index + 1) * per]
            return [(p, stored[p]) for p in parts]
        raise UnknownKey(f"model {model!r} has no complete set of shards of {name!r}")

    def plan_read(
        self, model: str, wants: Sequence[tuple[str, ShardSpec]],
    ) -> tuple[str, list[ReadItem], tuple[str, int]]:
        """Make the stored slices that cover ``wants`` present in the host tier (loading them from
        disk, evicting others if the budget needs it) and pin them until ``done_read(token)``.
        Returns ``(token, items, epoch)``; the reader maps each piece's host file and copies from
        it (``epoch``: see ``StateStore.epoch``)."""
        # A swap plans about a hundred tensors, mostly each asked for as stored: that case is a
        # dict lookup, and the per-name index that resharding needs is built only when asked for.
        with self._lock:
            keys = self._keys_of(model)
            blobs = self.blobs
            index: dict[str, dict[ShardSpec, str]] | None = None
            covering = []
            for name, want in wants:
                b = keys.get((name, want))
                if b is None:
                    if index is None:
                        index = defaultdict(dict)
                        for (n, shard), stored in keys.items():
                            index[n][shard] = stored
                    covering.append((name, want, self._pieces_for(model, name, want, index)))
                else:
                    covering.append((name, want, ((want, b),)))
            needed = list(dict.fromkeys(b for _, _, parts in covering for _, b in parts))
            held = [blobs[b] for b in needed]
            for blob in held:
                blob.pins += 1
            to_load = [blob for blob in held if blob.host == ABSENT]
            if to_load:
                try:
                    self._make_room(sum(b.meta.nbytes for b in to_load), protect=set(needed))
                except StateError:
                    self._unpin(needed)
                    raise
                for blob in to_load:
                    blob.host = LOADING
                    self.host_bytes += blob.meta.nbytes
            waits = [blob for blob in held if blob.busy]
        started, loaded = time.perf_counter(), 0
        try:
            for blob in to_load:
                self._load_from_disk(blob)
                loaded += blob.meta.nbytes
        except BaseException:
            with self._lock:
                for blob in to_load:
                    if blob.host == LOADING:
                        self._drop_host_file(blob)  # its file (if it got one) goes to the pool
                        blob.host = ABSENT
                self._settle.notify_all()
                self._unpin(needed)
            raise
        if to_load:
            self.record(model, "disk->host", loaded, time.perf_counter() - started)
        with self._lock:
            if waits:
                self._settled(waits)
                failed = [b for b in waits if b.host != READY]  # another reader's load failed
                if failed:
                    self._unpin(needed)
                    raise StateError(f"{model}: blob {failed[0].id} could not be loaded from disk; "
                                     "read again to retry")
            items = []
            clock = self._clock
            for name, want, parts in covering:
                pieces = []
                for shard, b in parts:
                    blob = blobs[b]
                    clock += 1  # used now: last in eviction order
                    blob.used = clock
                    pieces.append((b, blob.file, blob.meta, shard))
                items.append((name, want, tuple(pieces)))
            self._clock = clock
            token = uuid.uuid4().hex
            self._reads[token] = needed
            return token, items, self.epoch

    def _load_from_disk(self, blob: Blob) -> None:
        if blob.disk is None:
            raise StateError(f"blob {blob.id} is in no tier")  # pragma: no cover - invariant
        with self._lock:
            path = self._new_host_file(blob)
        n = blob.meta.nbytes
        if n:
            mm = _map_file(path, n, write=True)
            try:
                with open(blob.disk.path, "rb") as src:
                    src.seek(blob.disk.offset)
                    view = memoryview(mm)
                    done = 0
                    while done < n:
                        got = src.readinto(view[done:min(n, done + _CHUNK)])
                        if not got:
                            raise StateError(f"{blob.disk.path} ends before blob {blob.id}")
                        done += got
                    view.release()
            finally:
                mm.close()
        with self._lock:
            blob.host = READY
            self._settle.notify_all()

    def done_read(self, token: str, record: tuple[str, int, float] | None = None) -> None:
        """Unpin what ``plan_read`` pinned; ``record``: ``(model, bytes, seconds)`` the reader
        copied to its device (a host -> device transition)."""
        with self._lock:
            self._unpin(self._reads.pop(token, []))
        if record is not None:
            self.record(record[0], "host->device", record[1], record[2])

    # -- writing (device -> host) ----------------------------------------------------------------
    def reserve(
        self, model: str, writes: Sequence[tuple[str, ShardSpec, TensorMeta]],
        keeps: Sequence[tuple[str, ShardSpec, str]] = (), remove: Sequence[tuple[str, ShardSpec]] = (),
    ) -> tuple[str, list[str | None], tuple[str, int]]:
        """Start writing part of ``model``'s state: ``writes`` get new host files (their paths are
        returned, in order, then the ``epoch``; None for an empty tensor), ``keeps`` re-point keys to blobs the writer
        read and did not change (no bytes move), ``remove`` deletes keys. Nothing is visible until
        ``commit(token)``; ``abort(token)`` undoes the reservation."""
        for name, _, meta in writes:
            if not isinstance(meta, TensorMeta):
                raise Mismatch(f"{name}: bad tensor metadata {meta!r}")
        with self._lock:
            for name, _, blob_id in keeps:
                if blob_id not in self.blobs:
                    raise UnknownKey(f"{name}: no blob {blob_id} to keep")
            known = self.models.get(model, {})
            for name, shard in remove:
                if (name, shard) not in known:
                    raise UnknownKey(f"model {model!r} has no key {name!r} {shard} to remove")
            size = sum(meta.nbytes for _, _, meta in writes)
            self._make_room(size, protect={b for _, _, b in keeps})
            entries, new_blobs, paths = [], [], []
            blobs, new_file = self.blobs, self._new_host_file
            for name, shard, meta in writes:
                blob_id = "u-" + self._new_name()
                blob = blobs[blob_id] = Blob(blob_id, meta, host=WRITING, pins=1)
                new_blobs.append(blob_id)
                entries.append(((name, shard), blob_id))
                paths.append(new_file(blob))
            self.host_bytes += size
            pinned = []
            for name, shard, blob_id in keeps:
                blobs[blob_id].pins += 1
                pinned.append(blob_id)
                entries.append(((name, shard), blob_id))
            token = uuid.uuid4().hex
            self._reservations[token] = _Reservation(model, entries, new_blobs, size,
                                                     [(n, s) for n, s in remove], pinned)
            return token, paths, self.epoch

    def commit(self, token: str, seconds: float | None = None) -> None:
        """Make a reservation's keys point at what was written. A key of another layout of the
        same tensor (another shard count or dim) is replaced by the new one. ``seconds``: how long
        the writer took (recorded as a device -> host transition of the written bytes)."""
        with self._lock:
            res = self._reservations.pop(token, None)
            if res is None:
                raise StateError(f"no reservation {token!r}")
            if seconds is not None:
                self._add_transfer(res.model, "device->host", res.nbytes, seconds)
            blobs, clock = self.blobs, self._clock
            for b in res.new_blobs:
                blob = blobs[b]
                blob.host = READY
                clock += 1
                blob.used = clock
            self._clock = clock
            self._settle.notify_all()
            model = res.model
            keys = self.models.setdefault(model, {})
            for key in res.remove:
                if key in keys:
                    self._unpoint(model, *key)
            # A tensor's keys are all of one layout. A key the model has already is of that
            # layout (the common case: a swap writes back what it read); a new one replaces the
            # tensor's keys of any other layout.
            shards: dict[str, list[ShardSpec]] | None = None
            for key, blob_id in res.entries:
                old = keys.get(key)
                if old is None:
                    name, shard = key
                    if shards is None:
                        shards = _shards_by_name(keys)
                    for other in shards.get(name, ()):
                        if (other.dim, other.count) != (shard.dim, shard.count):
                            self._unpoint(model, name, other)
                    shards[name] = [shard]  # later entries of this name keep what this one set
                blobs[blob_id].refs += 1
                keys[key] = blob_id
                if old is not None:
                    self._decref(old)
            self._unpin(res.new_blobs + res.pinned)

    def abort(self, token: str) -> None:
        with self._lock:
            res = self._reservations.pop(token, None)
            if res is not None:
                self._unpin(res.new_blobs + res.pinned)

    # -- host budget -----------------------------------------------------------------------------
    def _make_room(self, nbytes: int, protect: set[str]) -> None:
        """Evict host copies until ``nbytes`` more fit the budget, or raise OverBudget having
        evicted nothing. Order: blobs with a disk copy (free to drop, cheap to reload) before those
        that must be written first; models not announced by a prefetch hint first; least recently
        used first."""
        free = self.host_budget - self.host_bytes - self.pool_bytes
        if nbytes <= free:
            return
        soon_blobs = {b for m in self.soon for b in self.models.get(m, {}).values()}
        candidates = [
            b for b in self.blobs.values()
            if b.host == READY and b.pins == 0 and b.id not in protect and b.meta.nbytes
        ]
        if free + self.pool_bytes + sum(b.meta.nbytes for b in candidates) < nbytes:
            raise OverBudget(
                f"host tier: {nbytes} bytes requested, {max(free, 0)} free of a {self.host_budget}-byte "
                f"budget and {self.pool_bytes + sum(b.meta.nbytes for b in candidates)} evictable"
            )
        for size, files in self.pool.items():  # spare files cost nothing to drop
            while files and free < nbytes:
                self._unlink(files.pop())
                self.pool_bytes -= size
                free += size
        candidates.sort(key=lambda b: (b.disk is None, b.id in soon_blobs, b.used))
        for blob in candidates:
            if free >= nbytes:
                break
            if blob.disk is None:
                self._write_blob_file(blob)
            self._unlink(blob.file)  # not pooled: room is what is short
            blob.file = None
            blob.host = ABSENT
            self.host_bytes -= blob.meta.nbytes
            free += blob.meta.nbytes

    def hint(self, models: Iterable[str]) -> None:
        """Prefetch hint: these models are needed next (evicted last; see ``_make_room``)."""
        with self._lock:
            self.soon = set(models)

    # -- disk (host -> disk) ---------------------------------------------------------------------
    def _write_blob_file(self, blob: Blob) -> int:
        """Write a host blob to its own safetensors file (fsynced); returns bytes written."""
        path = self.root / "blobs" / f"{blob.id}.safetensors"
        n = blob.meta.nbytes
        if n:
            mm = _map_file(blob.file, n, write=False)
            try:
                offset = _write_safetensors_blob(path, blob.meta, memoryview(mm))
            finally:
                mm.close()
        else:
            offset = _write_safetensors_blob(path, blob.meta, memoryview(b""))
        blob.disk = DiskLoc(str(path), offset, True)
        return n

    def materialize(self, model: str) -> dict[str, Any]:
        """Write ``model``'s state to disk: every blob without a disk copy, then the manifest. When
        this returns, a crash of the store loses nothing of the model's state as of the call."""
        started = time.perf_counter()
        with self._lock:
            keys = dict(self._keys_of(model))
            ids = list(dict.fromkeys(keys.values()))
            for b in ids:
                self.blobs[b].pins += 1
        written, durable = 0, False
        try:
            for b in ids:
                blob = self.blobs[b]
                with self._lock:
                    self._settled([blob])
                if blob.disk is None:
                    written += self._write_blob_file(blob)
            manifest = {
                "model": model,
                "tensors": [
                    {"name": name, "shard": [shard.dim, shard.index, shard.count], "blob": b,
                     "dtype": self.blobs[b].meta.dtype, "shape": list(self.blobs[b].meta.shape),
                     "path": self.blobs[b].disk.path, "offset": self.blobs[b].disk.offset,
                     "owned": self.blobs[b].disk.owned}
                    for (name, shard), b in keys.items()
                ],
            }
            path = self._manifest_path(model)
            tmp = path.with_name(path.name + ".tmp")
            with open(tmp, "w") as f:
                json.dump(manifest, f)
                f.flush()
                os.fsync(f.fileno())
            _fsync_dir(self.root / "blobs")
            os.replace(tmp, path)
            _fsync_dir(path.parent)
            durable = True
        finally:
            with self._lock:
                if durable:
                    self._hold_durable(model, keys)
                self._unpin(ids)
        seconds = time.perf_counter() - started
        self.record(model, "host->disk", written, seconds)
        return {"bytes": written, "seconds": seconds, "tensors": len(keys)}

    def _hold_durable(self, model: str, keys: dict[tuple[str, ShardSpec], str]) -> None:
        """The blobs of a model's manifest stay (on disk at least) while the manifest names them,
        even after the live state moved on: they are what a restart recovers."""
        for b in keys.values():
            self.blobs[b].refs += 1
        previous = self.durable.pop(model, {})
        self.durable[model] = dict(keys)
        for b in previous.values():
            self._decref(b)

    def _manifest_path(self, model: str) -> Path:
        return self.root / "manifests" / (quote(model, safe="") + ".json")

    def _recover(self) -> None:
        """Rebuild keys and blobs from the manifests ``materialize`` wrote (host tier empty)."""
        for path in sorted((self.root / "manifests").glob("*.json")):
            manifest = json.loads(path.read_text())
            for t in manifest["tensors"]:
                meta = TensorMeta(t["dtype"], tuple(t["shape"]))
                blob = self.blobs.setdefault(t["blob"], Blob(t["blob"], meta))
                if blob.disk is None:
                    blob.disk = DiskLoc(t["path"], t["offset"], t["owned"])
                self._point(manifest["model"], t["name"], ShardSpec(*t["shard"]), t["blob"])
            self._hold_durable(manifest["model"], self.models.get(manifest["model"], {}))
        live = {b.disk.path for b in self.blobs.values() if b.disk is not None}
        for f in (self.root / "blobs").iterdir():  # written by a materialize that never finished
            if str(f) not in live:
                f.unlink()

    # -- dropping --------------------------------------------------------------------------------
    def drop(self, model: str) -> None:
        """Forget ``model``'s state in every tier (blobs other models share stay)."""
        with self._lock:
            keys = self._keys_of(model)
            for name, shard in list(keys):
                self._unpoint(model, name, shard)
            del self.models[model]
            for b in self.durable.pop(model, {}).values():
                self._decref(b)
            self.soon.discard(model)
            for held in self.resident.values():
                held.pop(model, None)
        self._manifest_path(model).unlink(missing_ok=True)

    def close(self) -> None:
        """Remove the host tier's folder (shared memory outlives processes; disk state stays)."""
        with self._lock:
            shutil.rmtree(self.host_dir, ignore_errors=True)
            self.unlinks += 1  # every host file is gone
            self.pool.clear()
            self.pool_bytes = 0
            if self._host_lock is not None:
                _lock_path(self.host_dir).unlink(missing_ok=True)
                os.close(self._host_lock)
                self._host_lock = None

    # -- device tier bookkeeping and accounting --------------------------------------------------
    def set_resident(self, wpg: str, model: str, nbytes: int | None) -> None:
        """Record that ``wpg`` holds ``model`` on its devices (``nbytes``) or no longer does (None)."""
        with self._lock:
            if nbytes is None:
                self.resident[wpg].pop(model, None)
            else:
                self.resident[wpg][model] = int(nbytes)

    def bandwidth(self, transition: str) -> float | None:
        """Measured bytes per second of a transition over every model so far (None: none yet)."""
        with self._lock:
            nbytes = sum(v[0] for (_, t), v in self.transfers.items() if t == transition)
            seconds = sum(v[1] for (_, t), v in self.transfers.items() if t == transition)
        return nbytes / seconds if seconds > 0 else None

    def estimate_load_seconds(self, model: str, wpg: str) -> float:
        """Setup cost of making ``model`` resident on ``wpg``: zero if it is; else its bytes over
        the measured host->device bandwidth, plus disk->host for the part not in host memory."""
        with self._lock:
            if model in self.resident.get(wpg, {}):
                return 0.0
            blobs = [self.blobs[b] for b in set(self._keys_of(model).values())]
        total = sum(b.meta.nbytes for b in blobs)
        cold = sum(b.meta.nbytes for b in blobs if b.host == ABSENT)
        seconds = 0.0
        for transition, nbytes in (("host->device", total), ("disk->host", cold)):
            bw = self.bandwidth(transition)
            if nbytes and bw:
                seconds += nbytes / bw
        return seconds

    def stats(self) -> dict[str, Any]:
        with self._lock:
            host = [b for b in self.blobs.values() if b.host == READY]
            disk = [b for b in self.blobs.values() if b.disk is not None]
            per_model: dict[str, dict[str, dict[str, float]]] = defaultdict(dict)
            for (model, transition), (nbytes, seconds, count) in self.transfers.items():
                per_model[model][transition] = {"bytes": nbytes, "seconds": seconds, "count": count}
            logical = {m: sum(self.blobs[b].meta.nbytes for b in keys.values()) for m, keys in self.models.items()}
            return {
                "host": {"bytes": self.host_bytes, "blobs": len(host), "budget": self.host_budget,
                         "spare_bytes": self.pool_bytes},
                "disk": {"bytes": sum(b.meta.nbytes for b in disk), "blobs": len(disk)},
                "device": {wpg: dict(held) for wpg, held in self.resident.items() if held},
                "models": logical,
                "transfers": dict(per_model),
            }
