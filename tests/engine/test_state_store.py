"""The StateManager's store in-process: tiers, canonical keys and resharding, dedup, budget and
eviction, durability, errors that leave nothing behind, accounting. No Ray."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from engine.state.layout import WHOLE, ShardSpec
from engine.state.rank_client import StateClient
from engine.state.store import Mismatch, OverBudget, StateError, StateStore, TensorMeta, UnknownKey


def _weights(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        "model.embed_tokens.weight": torch.randn(16, 8, generator=g),
        "model.layers.0.self_attn.q_proj.weight": torch.randn(8, 8, generator=g),
        "model.norm.weight": torch.randn(8, generator=g),
    }


@pytest.fixture
def base_dir(tmp_path) -> Path:
    folder = tmp_path / "base"
    folder.mkdir()
    save_file(_weights(0), folder / "model.safetensors")
    return folder


def _store(tmp_path, budget: int | None = 1 << 30) -> StateStore:
    return StateStore(tmp_path / "state", tmp_path / "shm", host_budget=budget)


def _host_files(store: StateStore) -> set[str]:
    """The host tier's blob files (spare files kept for reuse are not state)."""
    spare = {Path(f).name for files in store.pool.values() for f in files}
    return {p.name for p in store.host_dir.iterdir()} - spare


def _all(store: StateStore, model: str) -> list[tuple[str, ShardSpec]]:
    return sorted(store.keys(model), key=str)


def test_register_fork_and_read_back_the_base_bytes(tmp_path, base_dir):
    store = _store(tmp_path)
    info = store.register_model("base", base_dir)
    assert info == {"tensors": 3, "bytes": (16 * 8 + 8 * 8 + 8) * 4}
    store.fork("base", "job-a/policy")
    out, clean = StateClient(store, "wpg").read("job-a/policy", _all(store, "job-a/policy"))
    for (name, _), t in out.items():
        assert torch.equal(t, _weights(0)[name])
    assert set(clean) == set(out)  # every key was read from exactly its own blob
    assert store.stats()["transfers"]["job-a/policy"]["disk->host"]["bytes"] == info["bytes"]


def test_four_jobs_on_one_base_hold_one_copy_per_tier(tmp_path, base_dir):
    store = _store(tmp_path)
    store.register_model("base", base_dir)
    client = StateClient(store, "wpg")
    for i in range(4):
        store.register_model(f"job-{i}/reference", base_dir)  # hashed again: the same content
        client.read(f"job-{i}/reference", _all(store, f"job-{i}/reference"))
    stats = store.stats()
    one_copy = store.stats()["models"]["base"]
    assert stats["host"]["bytes"] == one_copy
    assert stats["host"]["blobs"] == 3
    assert stats["disk"]["blobs"] == 3
    assert sum(stats["models"].values()) == 5 * one_copy  # what separate copies would take
    # the shared blobs live until the last owner goes
    for i in range(4):
        store.drop(f"job-{i}/reference")
    store.drop("base")
    assert store.stats()["host"]["bytes"] == 0
    assert not _host_files(store)
    assert base_dir.joinpath("model.safetensors").is_file()  # a registered model's files stay


def test_write_replaces_keys_and_keep_moves_no_bytes(tmp_path, base_dir):
    store = _store(tmp_path)
    store.register_model("base", base_dir)
    store.fork("base", "job/policy")
    client = StateClient(store, "wpg")
    keys = _all(store, "job/policy")
    tensors, clean = client.read("job/policy", keys)
    norm = ("model.norm.weight", WHOLE)
    trained = {k: t + 1 for k, t in tensors.items() if k != norm}
    moment = {("model.norm.weight::exp_avg", WHOLE): torch.full((8,), 0.5)}
    result = client.write("job/policy", {**trained, **moment}, keeps={norm: clean[norm]})
    assert result["bytes"] == (16 * 8 + 8 * 8 + 8) * 4  # the kept norm moved no bytes
    again, _ = client.read("job/policy", [*keys, *moment])
    for k in keys:
        expected = tensors[k] if k == norm else tensors[k] + 1
        assert torch.equal(again[k], expected)
    assert torch.equal(again[next(iter(moment))], torch.full((8,), 0.5))
    # the base is untouched, and the norm is still one blob shared by both models
    base, _ = client.read("base", keys)
    assert all(torch.equal(base[k], tensors[k]) for k in keys)
    assert store.models["base"][norm] == store.models["job/policy"][norm]
    # remove drops a key (an optimizer moment that is gone)
    client.write("job/policy", {}, remove=list(moment))
    assert ("model.norm.weight::exp_avg", WHOLE) not in store.keys("job/policy")


def test_readers_get_the_slices_their_layout_needs(tmp_path):
    store = _store(tmp_path)
    client = StateClient(store, "wpg")
    full = torch.arange(8 * 6, dtype=torch.float32).reshape(8, 6)
    tp2 = {("w", ShardSpec(0, r, 2)): full.chunk(2, 0)[r] for r in range(2)}
    for key, t in tp2.items():  # each tensor-parallel rank offloads its own shard
        client.write("m", {key: t})
    assert set(store.keys("m")) == set(tp2)
    out, clean = client.read("m", [("w", WHOLE), ("w", ShardSpec(0, 1, 2)), ("w", ShardSpec(0, 3, 4)),
                                   ("w", ShardSpec(1, 0, 2))])
    assert torch.equal(out[("w", WHOLE)], full)
    assert torch.equal(out[("w", ShardSpec(0, 1, 2))], full[4:])
    assert torch.equal(out[("w", ShardSpec(0, 3, 4))], full[6:])
    assert torch.equal(out[("w", ShardSpec(1, 0, 2))], full[:, :3])
    assert set(clean) == {("w", ShardSpec(0, 1, 2))}
    # TP=1 writes the whole tensor back: the TP=2 shards are replaced, not left beside it
    client.write("m", {("w", WHOLE): full * 2})
    assert set(store.keys("m")) == {("w", WHOLE)}
    out, _ = client.read("m", [("w", ShardSpec(0, 0, 2))])
    assert torch.equal(out[("w", ShardSpec(0, 0, 2))], full[:4] * 2)
    # and TP=2 again, in one write: the whole tensor goes, both shards stay
    client.write("m", {("w", ShardSpec(0, r, 2)): (full * 3).chunk(2, 0)[r] for r in range(2)})
    assert set(store.keys("m")) == set(tp2)
    out, _ = client.read("m", [("w", WHOLE)])
    assert torch.equal(out[("w", WHOLE)], full * 3)


def test_errors_leave_no_partial_state(tmp_path, base_dir):
    store = _store(tmp_path, budget=1000)
    store.register_model("base", base_dir)
    client = StateClient(store, "wpg")
    before = (store.stats(), _host_files(store), dict(store.models))

    with pytest.raises(UnknownKey, match="no state for model 'nope'"):
        client.read("nope", [("x", WHOLE)])
    with pytest.raises(UnknownKey, match=r"has no tensor 'model\.missing'"):
        client.read("base", [("model.norm.weight", WHOLE), ("model.missing", WHOLE)])
    with pytest.raises(OverBudget, match="host tier: 2048 bytes requested"):
        client.write("job/policy", {("big", WHOLE): torch.zeros(512)})
    with pytest.raises(UnknownKey, match="no key 'gone'"):
        client.write("base", {("model.norm.weight", WHOLE): torch.zeros(8)}, remove=[("gone", WHOLE)])
    assert (store.stats(), _host_files(store), dict(store.models)) == before

    target = {("model.norm.weight", WHOLE): torch.zeros(9)}
    with pytest.raises(Mismatch, match=r"stored as float32\[8\], the reader holds float32\[9\]"):
        client.read("base", list(target), into=target)
    target = {("model.norm.weight", WHOLE): torch.zeros(8, dtype=torch.float16)}
    with pytest.raises(Mismatch, match=r"float16\[8\]"):
        client.read("base", list(target), into=target)
    # a failed read unpins what it pinned: everything can still be evicted and dropped
    assert all(b.pins == 0 for b in store.blobs.values())
    with pytest.raises(StateError, match="already has state"):
        store.fork("base", "base")


def test_eviction_prefers_cheap_blobs_and_spills_dirty_ones_to_disk(tmp_path, base_dir):
    base_bytes = (16 * 8 + 8 * 8 + 8) * 4
    store = _store(tmp_path, budget=base_bytes + 64 * 4)
    store.register_model("base", base_dir)
    client = StateClient(store, "wpg")
    client.read("base", _all(store, "base"))  # host: the base (clean: it has a disk copy)
    client.write("job/policy", {("moment", WHOLE): torch.arange(64.0)})  # fills the budget (dirty)
    assert store.stats()["host"]["bytes"] == base_bytes + 256
    # room for 128 floats: the clean base blobs go first (biggest LRU first fits), the dirty stays
    client.write("job/other", {("x", WHOLE): torch.ones(128)})
    moment_blob = store.blobs[store.models["job/policy"][("moment", WHOLE)]]
    assert moment_blob.host == "ready"
    assert moment_blob.disk is None
    # now only the dirty blob can make room: it is written to disk before its host copy goes
    client.write("job/third", {("y", WHOLE): torch.ones(64 + 16 * 8)})
    assert moment_blob.host == "absent"
    assert moment_blob.disk is not None
    out, _ = client.read("job/policy", [("moment", WHOLE)])  # back from disk, byte for byte
    assert torch.equal(out[("moment", WHOLE)], torch.arange(64.0))


def test_prefetch_hint_keeps_the_next_job_in_host_memory(tmp_path):
    store = _store(tmp_path, budget=2 * 1024 + 512)
    client = StateClient(store, "wpg")
    for job in ("a", "b"):
        client.write(job, {("w", WHOLE): torch.ones(256)})
        store.materialize(job)
    store.hint(["a"])  # a is next: b is evicted although a is older
    client.write("c", {("w", WHOLE): torch.ones(256)})
    assert store.blobs[store.models["a"][("w", WHOLE)]].host == "ready"
    assert store.blobs[store.models["b"][("w", WHOLE)]].host == "absent"


def test_materialize_survives_a_restart(tmp_path, base_dir):
    store = _store(tmp_path)
    store.register_model("base", base_dir)
    store.fork("base", "job/policy")
    client = StateClient(store, "wpg")
    trained = {("model.norm.weight", WHOLE): torch.full((8,), 3.0),
               ("model.norm.weight::exp_avg_sq", WHOLE): torch.full((8,), 0.25)}
    client.write("job/policy", trained)
    client.write("job/unsaved", {("w", WHOLE): torch.ones(4)})
    info = store.materialize("job/policy")
    assert info["bytes"] == 2 * 8 * 4
    assert info["tensors"] == 4
    keys = store.keys("job/policy")
    # the job trains on without materializing again: the materialized state must stay recoverable
    client.write("job/policy", {("model.norm.weight", WHOLE): torch.full((8,), 4.0)})
    assert len(os.listdir(tmp_path / "state" / "blobs")) == 2  # the manifest's blobs are kept
    # a crash: the store's memory and its host tier are gone; a new one starts on the same root
    del store
    restarted = _store(tmp_path)
    assert not _host_files(restarted)
    assert restarted.keys("job/policy") == keys
    out, _ = StateClient(restarted, "wpg").read("job/policy", sorted(keys, key=str))
    for key, t in trained.items():
        assert torch.equal(out[key], t)
    assert torch.equal(out[("model.embed_tokens.weight", WHOLE)], _weights(0)["model.embed_tokens.weight"])
    assert not restarted.has_model("job/unsaved")  # never materialized: not durable, as documented
    # a blob file without a manifest (a materialize cut short) is cleaned up at start
    stray = tmp_path / "state" / "blobs" / "u-stray.safetensors"
    stray.write_bytes(b"x")
    _store(tmp_path)
    assert not stray.exists()


def test_drop_frees_every_tier(tmp_path):
    store = _store(tmp_path)
    client = StateClient(store, "wpg")
    client.write("job/policy", {("w", WHOLE): torch.ones(100)})
    store.materialize("job/policy")
    disk_files = set(os.listdir(tmp_path / "state" / "blobs"))
    assert len(disk_files) == 1
    store.drop("job/policy")
    assert not os.listdir(tmp_path / "state" / "blobs")
    assert not os.listdir(tmp_path / "state" / "manifests")
    assert not _host_files(store)
    assert store.stats()["host"]["bytes"] == 0
    assert store.stats()["host"]["spare_bytes"] == 400  # its file waits for the next 400-byte blob


def test_freed_host_files_are_reused_and_evicted_first(tmp_path):
    store = _store(tmp_path, budget=3 * 400)
    client = StateClient(store, "wpg")
    client.write("job/policy", {("w", WHOLE): torch.ones(100)})
    client.write("job/policy", {("w", WHOLE): torch.full((100,), 2.0)})  # the first blob is freed
    assert store.stats()["host"]["spare_bytes"] == 400
    client.write("job/policy", {("w", WHOLE): torch.full((100,), 3.0)})  # ... and its file reused
    assert store.stats()["host"]["spare_bytes"] == 400  # one freed, one taken
    assert len(list(store.host_dir.iterdir())) == 2
    out, _ = client.read("job/policy", [("w", WHOLE)])
    assert torch.equal(out[("w", WHOLE)], torch.full((100,), 3.0))
    # a request that needs the room drops spare files before evicting any blob
    client.write("job/other", {("x", WHOLE): torch.ones(200)})
    assert store.stats()["host"] == {"bytes": 1200, "blobs": 2, "budget": 1200, "spare_bytes": 0}
    with pytest.raises(OverBudget):
        client.write("job/third", {("y", WHOLE): torch.ones(301)})  # more than the whole budget
    store.close()
    assert not store.host_dir.exists()


def test_accounting_and_setup_estimates(tmp_path):
    store = _store(tmp_path)
    client = StateClient(store, "wpg")
    client.write("job/policy", {("w", WHOLE): torch.ones(1000)})
    client.read("job/policy", [("w", WHOLE)])
    transfers = store.stats()["transfers"]["job/policy"]
    assert transfers["device->host"]["bytes"] == 4000
    assert transfers["host->device"]["bytes"] == 4000
    assert store.estimate_load_seconds("job/policy", "wpg-0") > 0
    store.set_resident("wpg-0", "job/policy", 4000)
    assert store.estimate_load_seconds("job/policy", "wpg-0") == 0.0
    assert store.stats()["device"] == {"wpg-0": {"job/policy": 4000}}
    with pytest.raises(ValueError, match="unknown transition"):
        store.record("job/policy", "disk->device", 1, 1.0)


def test_tensor_meta_describes_dtype_and_shape():
    meta = TensorMeta.of(torch.zeros(2, 3, dtype=torch.bfloat16))
    assert meta == TensorMeta("bfloat16", (2, 3))
    assert meta.nbytes == 12


def test_a_rank_keeps_mappings_of_reused_files_and_drops_deleted_ones(tmp_path):
    store = _store(tmp_path)
    client = StateClient(store, "wpg")
    for value in (1.0, 2.0, 3.0):  # the third write lands in the first one's (pooled) file
        client.write("job/policy", {("w", WHOLE): torch.full((1000,), value)})
    out, _ = client.read("job/policy", [("w", WHOLE)])
    assert torch.equal(out[("w", WHOLE)], torch.full((1000,), 3.0))
    kept = dict(client.maps._maps)
    assert {write for (_, write) in kept} == {True, False}
    assert len({path for (path, _) in kept}) == 2  # two files served three writes and a read
    client.maps.sweep(store.epoch)  # nothing was deleted: the mappings stay
    assert client.maps._maps.keys() == kept.keys()
    store.drop("job/policy")
    store.close()  # the files are deleted, and the epoch says so: a sweep lets go of their mappings
    client.maps.sweep(store.epoch)
    assert not client.maps._maps


def test_swapping_the_same_state_again_maps_no_file(tmp_path, monkeypatch):
    """A swap maps one file per tensor; the norms and biases are small, but there are many. After
    a first round trip, writing and reading the state again (its files come back from the pool
    under their names) must find every mapping kept: mapping a file costs as much as copying it."""
    import engine.state.rank_client as state_client

    store = _store(tmp_path)
    client = StateClient(store, "wpg")
    state = {(f"layer.{i}.norm", WHOLE): torch.full((64,), float(i)) for i in range(8)}
    state[("embed", WHOLE)] = torch.ones(4096, 64)
    into = {k: torch.empty_like(t) for k, t in state.items()}
    for _ in range(2):  # the second write gets the first one's files back from the pool
        client.write("job/policy", state)
        client.read("job/policy", list(state), into=into)
    maps = []
    real = state_client._mmap
    monkeypatch.setattr(state_client, "_mmap", lambda *a: maps.append(a) or real(*a))
    client.write("job/policy", {k: t + 1 for k, t in state.items()})
    client.read("job/policy", list(state), into=into)
    assert maps == []
    assert all(torch.equal(into[k], t + 1) for k, t in state.items())


def test_reading_a_kept_mapping_again_opens_no_descriptor(tmp_path):
    """A rank reads the same host files at every swap-in. The first read maps a file and keeps the
    mapping (with its descriptor); later reads find it by inode and must not leave the descriptor
    they opened to look the inode up: a leak of one per read ran a demo worker out of descriptors."""
    from engine.state.rank_client import HostMaps

    meta = TensorMeta("float32", (256, 64))  # 64 KiB: large enough to be kept
    path = tmp_path / "blob"
    torch.arange(256 * 64, dtype=torch.float32).numpy().tofile(path)
    maps = HostMaps()
    first = maps.tensor(str(path), meta)
    held = len(os.listdir("/proc/self/fd"))
    for _ in range(50):
        again = maps.tensor(str(path), meta)
        assert torch.equal(again, first)
    assert len(os.listdir("/proc/self/fd")) == held
    maps.clear()


def test_a_dead_stores_shared_memory_is_removed_by_the_next_store(tmp_path):
    """Shared memory outlives processes: a StateManager killed without closing (out of memory,
    kill -9, a torn-down Ray session) leaves its host folder behind. The next store on the node
    removes it, and leaves a live store's folder alone."""
    import signal
    import subprocess
    import sys

    shm = tmp_path / "shm"
    script = (
        "import sys, torch\n"
        "from pathlib import Path\n"
        "from engine.state.rank_client import StateClient\n"
        "from engine.state.store import StateStore\n"
        "from engine.state.layout import WHOLE\n"
        f"store = StateStore(Path({str(tmp_path / 'state-dead')!r}), Path({str(shm / 'dead')!r}))\n"
        "StateClient(store, 'wpg').write('job/policy', {('w', WHOLE): torch.ones(1000)})\n"
        "print('ready', flush=True)\n"
        "sys.stdin.read()\n"
    )
    dead = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True, cwd=Path(__file__).resolve().parents[2])
    try:
        assert dead.stdout.readline().strip() == "ready"
        live = StateStore(tmp_path / "state-live", shm / "live")
        assert os.listdir(shm / "dead")  # its owner still runs: untouched
        dead.send_signal(signal.SIGKILL)
        dead.wait(timeout=30)
        assert os.listdir(shm / "dead")  # killed: nothing cleaned up after it
        StateStore(tmp_path / "state-next", shm / "next")
        assert not (shm / "dead").exists()
        assert not (shm / "dead.lock").exists()
        assert (shm / "live").is_dir()  # alive: kept
        live.close()
        assert not (shm / "live").exists()
        assert not (shm / "live.lock").exists()
    finally:
        dead.kill()
        dead.wait(timeout=30)


def test_keys_sent_to_another_process_find_its_entries():
    """Shard specs and tensor metadata cache their hash; what another process unpickles must hash
    like the same values made there (a str's and None's hash differ between processes)."""
    import pickle
    import subprocess
    import sys

    sent = pickle.dumps([WHOLE, ShardSpec(0, 1, 2), TensorMeta("float32", (2, 3))]).hex()
    code = ("import pickle, sys\n"
            "from engine.state.store import TensorMeta\n"
            "from engine.state.layout import WHOLE, ShardSpec\n"
            "got = pickle.loads(bytes.fromhex(sys.stdin.read()))\n"
            "table = {WHOLE: 0, ShardSpec(0, 1, 2): 1, TensorMeta('float32', (2, 3)): 2}\n"
            "print([table.get(k) for k in got], got[2].nbytes)\n")
    out = subprocess.run([sys.executable, "-c", code], input=sent, capture_output=True, text=True, check=True,
                         cwd=Path(__file__).resolve().parents[2])
    assert out.stdout.split() == ["[0,", "1,", "2]", "24"]
