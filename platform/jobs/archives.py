"""A job's artifacts (its final weights, a Hugging Face folder) streamed to a download: one file, or
the whole folder as one ZIP archive, read a megabyte at a time as the answer is sent, so a model of
any size is never held in memory. Both are async iterators: Django's ASGI handler reads a
synchronous one (a ``FileResponse``'s) whole before sending its first byte. The archive's files are
stored (not compressed: safetensors barely compress) under one top folder, which ``transformers``
loads once unpacked."""

from __future__ import annotations

import io
import time
import zipfile
from collections.abc import AsyncIterator, Iterable, Iterator
from pathlib import Path

from asgiref.sync import sync_to_async

CHUNK_BYTES = 1 << 20


class _Sink(io.RawIOBase):
    """Where the archive is written: not seekable (``zipfile`` then writes sizes after each file),
    its bytes taken out as they come."""

    def __init__(self) -> None:
        self._chunks: list[bytes] = []

    def writable(self) -> bool:
        return True

    def write(self, data) -> int:
        self._chunks.append(bytes(data))
        return len(data)

    def take(self) -> bytes:
        out = b"".join(self._chunks)
        self._chunks.clear()
        return out


def zip_chunks(folder: Path, root: str) -> Iterator[bytes]:
    """The ZIP archive of ``folder``'s files (sorted, hidden ones left out) under ``root/``."""
    sink = _Sink()
    with zipfile.ZipFile(sink, "w", compression=zipfile.ZIP_STORED) as archive:
        for path in sorted(p for p in folder.iterdir() if p.is_file() and not p.name.startswith(".")):
            info = zipfile.ZipInfo(f"{root}/{path.name}", date_time=time.localtime(path.stat().st_mtime)[:6])
            with path.open("rb") as source, archive.open(info, "w", force_zip64=True) as target:
                while chunk := source.read(CHUNK_BYTES):
                    target.write(chunk)
                    yield sink.take()
            yield sink.take()
    yield sink.take()  # the central directory, written as the archive closes


async def zip_stream(folder: Path, root: str) -> AsyncIterator[bytes]:
    """``zip_chunks`` for an ASGI answer: each chunk made on a worker thread, sent as it is made (a
    synchronous iterator would be read whole before the first byte went out)."""
    chunks = zip_chunks(folder, root)
    while (chunk := await sync_to_async(next, thread_sensitive=False)(chunks, None)) is not None:
        if chunk:
            yield chunk


async def file_stream(path: Path) -> AsyncIterator[bytes]:
    """A file's bytes for an ASGI answer, a megabyte at a time, each read on a worker thread."""
    with path.open("rb") as source:  # closed when sent, or when the client goes (the generator closes)
        while chunk := await sync_to_async(source.read, thread_sensitive=False)(CHUNK_BYTES):
            yield chunk


def tensorboard_archive(runs: Iterable[tuple[dict, list[dict]]], root: str, *, by_id: bool = False) -> bytes:
    """Each run's metrics (a job dict and its ``{"step", "data"}`` rows) as a TensorBoard event
    file, zipped under ``root/<run name>/`` (``by_id``: ``root/<run name>-<id>/``, for many jobs, whose
    names may repeat); one file at a time, so a folder holds only the run being written."""
    import tempfile

    from plexrl_client.trackers import run_folder, tensorboard_files

    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as archive:
        for job, steps in runs:
            folder = run_folder(job, by_id=by_id)
            with tempfile.TemporaryDirectory(prefix="plexrl-tensorboard-") as tmp:
                written = tensorboard_files(job, steps, Path(tmp) / folder)
                archive.write(written, f"{root}/{folder}/{written.name}")
    return out.getvalue()
