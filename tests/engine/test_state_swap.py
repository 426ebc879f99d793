"""Worker groups holding several jobs' states through the node's StateManager (real Ray actors):
swaps change no job's results, frozen base weights are held once, and a killed StateManager loses
nothing that was materialized."""

from __future__ import annotations

import numpy as np
import pytest
import ray
import torch

from engine.client import Batch, Client, OptimizerConfig, SamplingParams
from engine.scheduler.router import Router
from engine.workers.group import Swapping, WorkerGroup

PROBLEMS = [["12+7=", "3-5=", "40+1-2="], ["99-9=", "5+5=", "1+2+3="], ["7-8=", "60+6=", "11-1-1="]]


@pytest.fixture(scope="module")
def swap_group(ray_engine, plexrl_home, tiny_model_dir):
    """A torch WPG that holds one job's state on its device at a time."""
    group = WorkerGroup.start("test-swap-0", threads=1, data_dir=plexrl_home, swapping=Swapping(max_resident=1))
    yield group
    group.shutdown()


def _batch(client, handle, problems) -> Batch:
    tok = client.tokenizer(handle)
    answers = [str(eval(p[:-1], {"__builtins__": {}})) for p in problems]  # noqa: S307 - constants above
    return Batch(prompts=[tok.encode(p) for p in problems],
                 completions=[[*tok.encode(a), tok.eos_token_id] for a in answers])


def _manager():
    """This node's StateManager, found by name (the swap group's ranks started it)."""
    from engine.state.manager import NAME

    return ray.get_actor(NAME.format(node=ray.get_runtime_context().get_node_id()[:12]))


def _step(handle, batch, i: int):
    """One round of a job's calls; returns everything it observed."""
    logp = handle.forward(batch).result().logprobs
    loss = handle.forward_backward(batch, "cross_entropy").result().loss
    stepped = handle.optim_step().result()
    out = [logp, loss, stepped["grad_norm"]]
    if i % 5 == 0:  # now and then the rollout copy too: sync, then sample from it
        handle.sync_weights().result()
        done = handle.generate(batch.prompts, SamplingParams(n=2, temperature=1.0, max_tokens=4, seed=i)).result()
        out.append([(c.token_ids, c.logprobs) for c in done])
    return out


def test_three_jobs_alternating_100_times_match_a_run_that_never_swapped(swap_group, worker_group, job):
    swapped, plain = Client(Router([swap_group])), Client(Router([worker_group]))
    jobs = [f"{job}-{i}" for i in range(3)]
    pairs, batches = {}, {}
    for i, name in enumerate(jobs):
        opt = OptimizerConfig(lr=[1e-3, 3e-3, 5e-4][i])
        pairs[name] = tuple(c.create_model(name, "policy", "tiny-arith", trainable=True, optimizer_config=opt)
                            for c in (swapped, plain))
        batches[name] = _batch(plain, pairs[name][1], PROBLEMS[i])
    before = ray.get(swap_group.ranks[0].swap_stats.remote())
    for i in range(100):
        name = jobs[i % 3]
        got, want = (_step(h, batches[name], i) for h in pairs[name])
        assert np.array_equal(got[0], want[0]), f"round {i}: forward log-probs differ"
        assert got[1:] == want[1:], f"round {i}: loss, grad norm or samples differ"
    stats = ray.get(swap_group.ranks[0].swap_stats.remote())
    assert stats["in"] - before["in"] >= 99
    assert stats["out"] - before["out"] >= 99
    assert stats["out_bytes"] > before["out_bytes"]  # trained state really left the device
    # the jobs really diverged (else equal results would prove little)
    final = [pairs[n][1].forward(batches[jobs[0]]).result().logprobs for n in jobs]
    assert not np.array_equal(final[0], final[1])
    assert not np.array_equal(final[1], final[2])


def test_four_jobs_on_one_base_hold_one_copy_of_the_frozen_weights(swap_group, job):
    client = Client(Router([swap_group]))
    manager = _manager()
    refs = [client.create_model(f"{job}-{i}", "reference", "tiny-arith") for i in range(4)]
    batch = _batch(client, refs[0], PROBLEMS[0])
    before = ray.get(manager.stats.remote())
    outputs = [r.forward(batch).result().logprobs for r in refs]  # each swapped in, one after another
    after = ray.get(manager.stats.remote())
    one_copy = after["models"][f"{job}-0/reference"]
    assert all(after["models"][f"{job}-{i}/reference"] == one_copy for i in range(4))
    # at most one copy came into host memory for the four, and swapping them out wrote nothing
    assert after["host"]["bytes"] - before["host"]["bytes"] <= one_copy
    stats = ray.get(swap_group.ranks[0].swap_stats.remote())
    assert stats["resident"] == [[f"{job}-3", "reference"]]
    assert all(np.array_equal(o, outputs[0]) for o in outputs)


def test_killed_state_manager_loses_nothing_materialized(swap_group, worker_group, job, kill_state_manager):
    swapped, plain = Client(Router([swap_group])), Client(Router([worker_group]))
    a, a_ref = (c.create_model(job, "policy", "tiny-arith", trainable=True) for c in (swapped, plain))
    batch = _batch(plain, a_ref, PROBLEMS[1])
    for handle in (a, a_ref):
        for _ in range(2):
            handle.forward_backward(batch, "cross_entropy")
            handle.optim_step().result()
    reports = swap_group.materialize((job, "policy"))
    assert reports
    assert all(r["tensors"] for r in reports)
    swap_group.offload((job, "policy"))
    kill_state_manager(_manager())  # host tier and all in-memory bookkeeping are gone
    # the next call swaps the job in: a new StateManager recovers it from disk
    assert np.array_equal(a.forward(batch).result().logprobs, a_ref.forward(batch).result().logprobs)
    for handle in (a, a_ref):  # and it goes on training exactly as if nothing happened
        handle.forward_backward(batch, "cross_entropy")
    assert a.optim_step().result() == a_ref.optim_step().result()
    stats = ray.get(_manager().stats.remote())
    assert stats["transfers"][f"{job}/policy"]["disk->host"]["bytes"] > 0


def test_prefetch_one_call_ahead_is_used_and_changes_nothing(swap_group, worker_group, job):
    swapped, plain = Client(Router([swap_group])), Client(Router([worker_group]))
    jobs = [f"{job}-a", f"{job}-b"]
    pairs = {n: tuple(c.create_model(n, "policy", "tiny-arith", trainable=True) for c in (swapped, plain))
             for n in jobs}
    batch = _batch(plain, pairs[jobs[0]][1], PROBLEMS[2])
    before = ray.get(swap_group.ranks[0].swap_stats.remote())
    for i in range(6):
        name, following = jobs[i % 2], jobs[(i + 1) % 2]
        results = []
        for k, handle in enumerate(pairs[name]):
            logp = handle.forward(batch).result().logprobs  # by now the other job is swapped out
            fb = handle.forward_backward(batch, "cross_entropy")
            if k == 0:  # while this job's call runs, the next job's state is read in
                swap_group.prefetch((following, "policy"))
            results.append((logp.tolist(), fb.result().loss, handle.optim_step().result()))
        assert results[0] == results[1], f"round {i}"
    stats = ray.get(swap_group.ranks[0].swap_stats.remote())
    assert stats["in_prefetched"] - before["in_prefetched"] >= 5


def test_a_failed_write_behind_puts_the_state_back(tmp_path, tiny_model_dir):
    """The background write of a swapped-out job fails (the host tier is full): the job's state
    goes back on the device, unchanged, and the error reaches the next call that needs it."""
    from engine.api import OptimizerConfig as Opt
    from engine.state.rank_client import StateClient as Client_
    from engine.state.store import OverBudget, StateStore
    from engine.workers.torch_backend import TorchBackend

    backend = TorchBackend(rank=0, world_size=1, data_dir=tmp_path)
    store = StateStore(tmp_path / "state", tmp_path / "shm", host_budget=1 << 30)
    backend.state_client = Client_(store, "wpg:0")
    d = ("job", "policy")
    backend.create(d, tiny_model_dir, trainable=True, optimizer=Opt(lr=1e-2))
    tok = backend.states[d].tokenizer
    batch = Batch(prompts=[tok.encode("12+7=")], completions=[[*tok.encode("19"), tok.eos_token_id]])
    backend.execute(d, "forward_backward", {"batch": batch, "loss": "cross_entropy", "loss_config": {}})
    backend.execute(d, "optim_step", {})
    before = {k: t.clone() for k, t in backend._export_state(d, backend.states[d])["job/policy"].items()}
    store.host_budget = 1024  # nothing fits now
    backend.swap_out(d, background=True)
    assert not backend.is_resident(d)
    with pytest.raises(OverBudget):
        backend.swap_in(d)
    assert backend.is_resident(d)
    after = backend._export_state(d, backend.states[d])["job/policy"]
    assert after.keys() == before.keys()
    assert all(torch.equal(after[k], before[k]) for k in before)
    store.close()
