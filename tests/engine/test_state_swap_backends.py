"""Megatron (tensor parallel) and vLLM worker groups holding several jobs' states through the node's
StateManager (real Ray actors): swaps change no job's results, Megatron state is stored under the
canonical keys any layout reads back, and a vLLM engine switches between jobs' rollout weights kept
there (never a private copy) with no prefix-cache block crossing jobs.

One random grouped-query Qwen2 (4 query heads, 2 KV heads, untied output layer) built here serves
every test, so TP=2 splits every fused tensor and the vocabulary. Each group takes little of the
node's device slots (the session's torch group may hold a whole one).
"""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import ray
import torch
from safetensors.torch import load_file

from engine.api import Batch, OptimizerConfig, Request, SamplingParams
from engine.state.layout import WHOLE, gather_shards, hf_to_megatron, megatron_param_parts, megatron_to_hf
from engine.state.rank_client import StateClient
from engine.workers.group import Swapping, WorkerGroup

VOCAB = 64
PAD, EOS = 0, 1
LRS = [1e-2, 3e-2, 5e-3]
CE = {"loss": "cross_entropy", "loss_config": {}}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory, build_gqa_qwen) -> Path:
    """A random untied GQA Qwen2 (hidden 128)."""
    return build_gqa_qwen(tmp_path_factory.mktemp("swap-gqa"), hidden=128, tied=False, seed=0)


@pytest.fixture(scope="module")
def other_dir(tmp_path_factory, build_gqa_qwen) -> Path:
    """Another model of the same architecture (other weights): a second base."""
    return build_gqa_qwen(tmp_path_factory.mktemp("swap-gqa-other"), hidden=128, tied=False, seed=1)


@pytest.fixture(scope="module")
def megatron(ray_engine, plexrl_home):
    """``{tp: (group holding one job at a time, group that never swaps)}`` for TP=1 and TP=2."""
    pytest.importorskip("megatron.core")

    def start(args):
        tp, swapping = args
        name = f"{'swap' if swapping else 'plain'}-megatron-tp{tp}"
        return WorkerGroup.start(name, "megatron", world_size=tp, threads=1, data_dir=plexrl_home,
                                 devices_per_rank=0.0625, swapping=swapping)

    layouts = [(tp, swapping) for tp in (1, 2) for swapping in (Swapping(max_resident=1), None)]
    with ThreadPoolExecutor(len(layouts)) as pool:
        started = list(pool.map(start, layouts))
    yield {1: tuple(started[:2]), 2: tuple(started[2:])}
    for group in started:
        group.shutdown()


def _run(group, deployment, fn, **payload):
    return ray.get(group.submit(Request(*deployment, fn, payload)))


def _batch(seed: int) -> Batch:
    """Rows of different prompt and completion lengths (right padding matters)."""
    gen = torch.Generator().manual_seed(seed)

    def ids(n):
        return torch.randint(3, VOCAB, (n,), generator=gen).tolist()

    return Batch(prompts=[ids(5), ids(2), ids(3), ids(1)], completions=[ids(3), [*ids(5), EOS], ids(1), ids(4)])


def _gathered(per_rank: list[list]) -> dict[str, torch.Tensor]:
    shards: dict[str, list] = {}
    for rank_shards in per_rank:
        for name, tensor, spec in rank_shards:
            shards.setdefault(name, []).append((tensor, spec))
    return {name: gather_shards(parts) for name, parts in shards.items()}


def _weights(group, deployment) -> dict[str, torch.Tensor]:
    return _gathered(ray.get([r.export_weights.remote(deployment, None) for r in group.ranks]))


def _optimizer_field(group, deployment, field: str) -> dict[str, torch.Tensor]:
    """An AdamW moment of every parameter as whole Hugging Face tensors, from the ranks' own state."""

    def read(worker, dep, field):
        backend = worker.backend
        state = backend.states[tuple(dep)]
        local = {n: state.optimizer.state[p][field] for n, p in state.model.named_parameters()}
        return megatron_to_hf(local, state.hf_config, backend.rank, backend.world_size)

    return _gathered(ray.get([r.__ray_call__.remote(read, deployment, field) for r in group.ranks]))


def _grads(group, deployment) -> dict[str, torch.Tensor]:
    def read(worker, dep):
        return worker.backend.debug_grad_shards(tuple(dep))

    return _gathered(ray.get([r.__ray_call__.remote(read, deployment) for r in group.ranks]))


def _manager():
    from engine.state.manager import NAME

    return ray.get_actor(NAME.format(node=ray.get_runtime_context().get_node_id()[:12]))


def _stats(group) -> dict:
    return ray.get(group.ranks[0].swap_stats.remote())


@pytest.mark.slow
@pytest.mark.parametrize("tp", [1, 2])
def test_megatron_three_jobs_alternating_match_a_group_that_never_swapped(megatron, model_dir, job, tp):
    swapped, plain = megatron[tp]
    jobs = [(f"{job}-{i}", "policy") for i in range(3)]
    for i, deployment in enumerate(jobs):
        for group in (swapped, plain):
            group.create(deployment, model_dir, trainable=True, optimizer=OptimizerConfig(lr=LRS[i]))
    batches = {d: _batch(i) for i, d in enumerate(jobs)}
    before = _stats(swapped)
    for i in range(12):
        deployment, other = jobs[i % 3], jobs[(i + 1) % 3]
        calls = [(deployment, "forward"), (deployment, "forward_backward")]
        if i % 2:  # the job leaves with pending gradients, comes back and accumulates more
            calls += [(other, "forward"), (deployment, "forward_backward")]
        calls.append((deployment, "optim_step"))
        for dep, fn in calls:
            payload = {} if fn == "optim_step" else {"batch": batches[dep]} | (CE if fn == "forward_backward" else {})
            got, want = (_run(group, dep, fn, **payload) for group in (swapped, plain))
            if fn == "forward":
                assert np.array_equal(got.logprobs, want.logprobs), f"round {i}: {dep} log-probs differ"
                assert np.array_equal(got.mask, want.mask)
            else:
                assert got == want, f"round {i}: {dep} {fn} differs"  # loss and metrics; grad norm, lr
    stats = _stats(swapped)
    assert stats["in"] - before["in"] >= 12 + 6 * 2
    assert stats["out_bytes"] > before["out_bytes"]  # trained state really left the ranks
    assert stats["resident"] == [list(jobs[11 % 3])]
    # the jobs really diverged (else equal results would prove little), and every one ends exactly
    # where the group that never swapped has it (read back through a swap-in)
    final = {d: _weights(plain, d) for d in jobs}
    name = "model.layers.0.self_attn.q_proj.weight"
    assert not torch.equal(final[jobs[0]][name], final[jobs[1]][name])
    assert not torch.equal(final[jobs[1]][name], final[jobs[2]][name])
    for d in jobs:
        assert all(torch.equal(t, final[d][n]) for n, t in _weights(swapped, d).items())


@pytest.mark.slow
def test_megatron_states_start_as_the_base_and_write_nothing_until_they_change(megatron, model_dir, job):
    swapped, plain = megatron[2]
    manager = _manager()
    refs = [(f"{job}-{i}", "reference") for i in range(3)]
    for d in refs:
        swapped.create(d, model_dir, trainable=False, optimizer=None)
    plain.create(refs[0], model_dir, trainable=False, optimizer=None)
    batch = _batch(7)
    before, host_before = _stats(swapped), ray.get(manager.stats.remote())
    outputs = [_run(swapped, d, "forward", batch=batch).logprobs for d in refs]  # each swapped in in turn
    after, host_after = _stats(swapped), ray.get(manager.stats.remote())
    assert after["in"] - before["in"] >= 2
    assert after["out_bytes"] == before["out_bytes"]  # clean states: swapping them out wrote nothing
    one_copy = host_after["models"][f"{job}-0/reference"]
    assert one_copy == sum(t.numel() * t.element_size() for t in load_file(model_dir / "model.safetensors").values())
    assert all(host_after["models"][f"{job}-{i}/reference"] == one_copy for i in range(3))
    assert host_after["host"]["bytes"] - host_before["host"]["bytes"] <= one_copy  # the base, at most once
    expected = _run(plain, refs[0], "forward", batch=batch).logprobs
    assert all(np.array_equal(o, expected) for o in outputs)


@pytest.mark.slow
def test_megatron_tp2_state_reads_back_in_any_layout(megatron, model_dir, job):
    from transformers import AutoConfig

    swapped, plain = megatron[2]
    deployment, model = (job, "policy"), f"{job}/policy"
    batch = _batch(3)
    for group in (swapped, plain):
        group.create(deployment, model_dir, trainable=True, optimizer=OptimizerConfig(lr=LRS[0]))
        for _ in range(2):
            _run(group, deployment, "forward_backward", batch=batch, **CE)
            _run(group, deployment, "optim_step")
        _run(group, deployment, "forward_backward", batch=batch, **CE)  # gradients pending
    swapped.offload(deployment)  # every rank writes its part of the state and frees it
    assert not any(ray.get(r.__ray_call__.remote(lambda w, d: w.backend.is_resident(d), deployment))
                   for r in swapped.ranks)

    cfg = AutoConfig.from_pretrained(model_dir)
    reader = StateClient(_manager, "test-reader")
    stored = reader.call("keys", model)
    # canonical keys: each rank's Hugging Face slices of weights, moments and gradients; step counts whole
    expected = set()
    for rank in range(2):
        for parts in megatron_param_parts(cfg, rank, 2).values():
            for name, spec in parts:
                expected |= {(f"{name}{suffix}", spec) for suffix in ("", "::exp_avg", "::exp_avg_sq", "::grad")}
                expected.add((f"{name}::step", WHOLE))
    assert set(stored) == expected

    # as whole Hugging Face tensors: exactly what the group that never swapped holds
    weights = _weights(plain, deployment)
    whole = {n: t for (n, _), t in reader.read(model, [(n, WHOLE) for n in weights])[0].items()}
    assert whole.keys() == weights.keys()
    assert all(torch.equal(whole[n], t) for n, t in weights.items())
    for field in ("exp_avg", "exp_avg_sq"):
        moments = _optimizer_field(plain, deployment, field)
        got = reader.read(model, [(f"{n}::{field}", WHOLE) for n in moments])[0]
        assert all(torch.equal(got[(f"{n}::{field}", WHOLE)], t) for n, t in moments.items()), field
    grads = _grads(plain, deployment)
    got = reader.read(model, [(f"{n}::grad", WHOLE) for n in grads])[0]
    assert all(torch.equal(got[(f"{n}::grad", WHOLE)], t) for n, t in grads.items())
    steps = reader.read(model, [(f"{n}::step", WHOLE) for n in weights])[0]
    assert all(float(t) == 2.0 for t in steps.values())

    # a TP=1 reader: its own keys, joined from the two stored shards, fused by the same conversion
    tp1 = [key for parts in megatron_param_parts(cfg, 0, 1).values() for key in parts]
    read1 = {n: t for (n, _), t in reader.read(model, tp1)[0].items()}
    local1 = hf_to_megatron(read1, cfg, 0, 1, sliced=True)
    assert local1.keys() == hf_to_megatron(weights, cfg, 0, 1).keys()
    assert all(torch.equal(local1[n], t) for n, t in hf_to_megatron(weights, cfg, 0, 1).items())
    # a TP=2 rank reads each of its slices from exactly its own blob: no full tensor is rebuilt
    mine = [key for parts in megatron_param_parts(cfg, 1, 2).values() for key in parts]
    tensors, clean = reader.read(model, mine)
    assert set(clean) == set(mine)
    for (name, spec), t in tensors.items():
        full = weights[name]
        assert torch.equal(t, full if spec == WHOLE else full.chunk(spec.count, spec.dim)[spec.index]), name

    # swapped back in, the job goes on exactly as the one that never left (pending gradients too)
    for group in (swapped, plain):
        _run(group, deployment, "forward_backward", batch=batch, **CE)
    assert _run(swapped, deployment, "optim_step") == _run(plain, deployment, "optim_step")
    assert all(torch.equal(t, _weights(plain, deployment)[n]) for n, t in _weights(swapped, deployment).items())


# -- vLLM ----------------------------------------------------------------------------------------

MAX_TOKENS = 8
GREEDY = SamplingParams(n=1, temperature=0.0, max_tokens=MAX_TOKENS)


@pytest.fixture(scope="module")
def vllm(ray_engine, plexrl_home):
    """``(vLLM group keeping rollout weights in the StateManager, vLLM group that keeps its own)``."""
    pytest.importorskip("vllm")
    groups = [
        WorkerGroup.start(name, "vllm", threads=1, data_dir=plexrl_home, devices_per_rank=0.25, swapping=swapping)
        for name, swapping in (("swap-vllm", Swapping(max_resident=1)), ("plain-vllm", None))
    ]
    yield groups
    for group in groups:
        group.shutdown()


def _prompts() -> list[list[int]]:
    """Short prompts, and long ones (over one 32-token KV block, so the prefix cache holds them)."""
    gen = torch.Generator().manual_seed(11)
    lengths = [3, 5, 2, 7, 40, 36, 45]
    return [torch.randint(3, VOCAB, (n,), generator=gen).tolist() for n in lengths]


def _greedy_reference(folder: Path, prompts) -> list[list[int]]:
    from transformers import AutoModelForCausalLM

    from engine.workers.sampling import sample

    hf = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    return [sample(hf, [p], max_tokens=MAX_TOKENS, temperature=0.0, eos_id=EOS, pad_id=PAD, generator=None)[0][0]
            for p in prompts]


@pytest.mark.slow
def test_vllm_switches_between_jobs_weights_kept_in_the_state_manager(vllm, megatron, model_dir, other_dir, job):
    swapped, plain = vllm
    trainer = megatron[2][0]  # a Megatron TP=2 group that swaps too: sync_weights pulls from it
    a, b, c = ((f"{job}-{x}", "policy") for x in "abc")
    folders = {a: model_dir, b: other_dir, c: model_dir}

    def create_all(group):
        for d, folder in folders.items():
            group.create(d, folder, trainable=False, optimizer=None)

    with ThreadPoolExecutor(2) as pool:
        list(pool.map(create_all, (swapped, plain)))
    # job c trains on the Megatron group, and both rollout groups sync its weights
    trainer.create(c, model_dir, trainable=True, optimizer=OptimizerConfig(lr=5e-2))
    prompts = _prompts()
    push = Batch(prompts=prompts, completions=[[9, 9, EOS]] * len(prompts))
    for _ in range(3):
        _run(trainer, c, "forward_backward", batch=push, **CE)
        _run(trainer, c, "optim_step")
    trained = _weights(trainer, c)
    before_sync = ray.get(swapped.ranks[0].stats.remote())
    for group in (swapped, plain):
        synced = _run(group, c, "sync_weights", source=trainer.ranks)
        assert synced["bytes"] == sum(t.numel() * t.element_size() for t in trained.values())
    after_sync = ray.get(swapped.ranks[0].stats.remote())
    # the sync loads c's new weights into the engine itself: no swap-in of its old ones first
    assert after_sync["swaps"] == before_sync["swaps"]
    assert tuple(after_sync["resident"]) == c

    reference = {a: _greedy_reference(model_dir, prompts), b: _greedy_reference(other_dir, prompts)}
    long = [i for i, p in enumerate(prompts) if len(p) > 32]
    assert any(reference[a][i] != reference[b][i] for i in long), "jobs a and b must answer long prompts differently"
    before = ray.get(swapped.ranks[0].stats.remote())
    order = [a, a, b, b, c, a, c, b, a, c]  # a job served twice in a row hits its own cached prefixes
    answers: dict = {}
    for i, d in enumerate(order):
        sampling = SamplingParams(n=2, temperature=1.0, max_tokens=MAX_TOKENS, seed=i)
        if i % 2 and d != order[i - 1]:  # a hint first: the StateManager brings d's weights to host memory
            ray.get(swapped.ranks[0].prefetch.remote(d))
        got = [_run(swapped, d, "generate", prompts=prompts, sampling=s) for s in (GREEDY, sampling)]
        want = [_run(plain, d, "generate", prompts=prompts, sampling=s) for s in (GREEDY, sampling)]
        assert got == want, f"call {i}: {d} differs from the group that never swapped"
        greedy = [co.token_ids for co in got[0]]
        if d in reference:  # and is that job's own model's answer, whatever ran before it
            assert greedy == reference[d], f"call {i}: {d}"
        answers.setdefault(d, greedy)
        assert greedy == answers[d]
    assert answers[c] != answers[a]  # the synced weights are c's, not the base it started from

    after = ray.get(swapped.ranks[0].stats.remote())
    switches = sum(1 for x, y in itertools.pairwise(order) if x != y) + (order[0] != before["resident"])
    assert after["swaps"] - before["swaps"] == switches
    assert after["prefix_cache_resets"] - before["prefix_cache_resets"] == switches
    # the weights live in the StateManager only: no private copy in the rank, c's there are the trainer's
    private = ray.get(swapped.ranks[0].__ray_call__.remote(
        lambda w: [s.weights is None for s in w.backend.deployments.values()]))
    assert private
    assert all(private)
    reader = StateClient(_manager, "test-reader")
    stored = reader.read(f"{c[0]}/policy@rollout", [(n, WHOLE) for n in trained])[0]
    assert all(torch.equal(stored[(n, WHOLE)], t) for n, t in trained.items())
    stats = ray.get(_manager().stats.remote())
    assert stats["transfers"][f"{a[0]}/policy@rollout"]["host->device"]["bytes"] > 0
    assert stats["models"][f"{a[0]}/policy@rollout"] == stats["models"][f"{c[0]}/policy@rollout"]
    # a dropped deployment's weights leave the StateManager too
    ray.get([r.drop.remote(b) for r in swapped.ranks])
    assert not reader.call("has_model", f"{b[0]}/policy@rollout")
    assert reader.call("has_model", f"{a[0]}/policy@rollout")


@pytest.mark.slow
def test_a_host_tier_sync_holds_the_trainer_only_and_the_rollout_samples_the_new_weights(
        vllm, megatron, model_dir, job):
    """Router with ``sync="host"`` over a Megatron TP=2 trainer and a vLLM engine that both swap:
    ``sync_weights`` runs on the trainer group alone (its usage names no other group), writes the
    trained weights to the StateManager as the rollout state, and the engine reloads them before the
    next generate, which then samples exactly what a gang sync into a group that never swapped gives."""
    from engine.scheduler.placement import Placement
    from engine.scheduler.router import Router

    swapped, plain = vllm
    trainer = megatron[2][0]
    router = Router([trainer, swapped])  # sync="host" is the default
    deployment = (f"{job}-host", "policy")
    router.create(*deployment, model_dir, trainable=True, optimizer=OptimizerConfig(lr=5e-2))
    placed = router.placement[deployment]
    assert placed == Placement(trainer.name, swapped.name)
    assert router.sync_of(placed) == "host"
    assert Router([trainer, swapped], sync="gang").sync_of(placed) == "gang"

    prompts = _prompts()
    sampled = SamplingParams(n=2, temperature=1.0, max_tokens=MAX_TOKENS, seed=5)

    def answers(call):
        return [[c.token_ids for c in call(s)] for s in (GREEDY, sampled)]

    def generate_routed(sampling):
        return router.call(*deployment, "generate", {"prompts": prompts, "sampling": sampling}).result()

    before = answers(generate_routed)
    push = Batch(prompts=prompts, completions=[[9, 9, EOS]] * len(prompts))
    for _ in range(3):
        router.call(*deployment, "forward_backward", {"batch": push, **CE})
        router.call(*deployment, "optim_step", {})
    usage: list[dict] = []
    stats_before = ray.get(swapped.ranks[0].stats.remote())
    synced = router.call(*deployment, "sync_weights", {}, on_usage=usage.extend).result()
    trained = _weights(trainer, deployment)
    assert synced["bytes"] == sum(t.numel() * t.element_size() for t in trained.values())
    assert {r["wpg"] for r in usage} == {trainer.name}  # the rollout group was not held
    stats_synced = ray.get(swapped.ranks[0].stats.remote())
    assert stats_synced["published"] == stats_before["published"] + 1
    assert stats_synced["syncs"] == stats_before["syncs"]  # nothing streamed into the engine by the sync
    assert stats_synced["resident"] != deployment  # its engine copy is stale until the next generate

    after = answers(generate_routed)
    stats_after = ray.get(swapped.ranks[0].stats.remote())
    assert stats_after["swaps"] == stats_synced["swaps"] + 1  # the reload from the StateManager
    assert after != before  # the steps changed the answers
    reader = StateClient(_manager, "test-reader")
    stored = reader.read(f"{deployment[0]}/policy@rollout", [(n, WHOLE) for n in trained])[0]
    assert all(torch.equal(stored[(n, WHOLE)], t) for n, t in trained.items())

    # the same weights pulled by a gang sync into a group that keeps its own copy sample the same
    plain.create(deployment, model_dir, trainable=False, optimizer=None)
    _run(plain, deployment, "sync_weights", source=trainer.ranks)
    assert answers(lambda s: _run(plain, deployment, "generate", prompts=prompts, sampling=s)) == after


@pytest.mark.slow
def test_a_torn_host_tier_sync_is_refused_until_a_sync_completes(vllm, model_dir, job):
    """A host-tier sync that failed half-way leaves the rollout weights torn: the engine refuses to
    generate from them, and the next complete sync clears that."""
    swapped, _ = vllm
    deployment = (f"{job}-torn", "policy")
    swapped.create(deployment, model_dir, trainable=False, optimizer=None)
    greedy = _run(swapped, deployment, "generate", prompts=_prompts(), sampling=GREEDY)
    ray.get([r.weights_changed.remote(deployment, False) for r in swapped.ranks])
    with pytest.raises(ray.exceptions.RayTaskError, match="incomplete after a failed sync_weights"):
        _run(swapped, deployment, "generate", prompts=_prompts(), sampling=GREEDY)
    ray.get([r.weights_changed.remote(deployment, True) for r in swapped.ranks])
    assert _run(swapped, deployment, "generate", prompts=_prompts(), sampling=GREEDY) == greedy


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_host_tier_sync_reaches_a_rollout_engine_on_another_ray_node(tmp_path):
    """Two Ray nodes: the trainer writes the weights into the rollout node's StateManager over the
    network (holding the trainer group only), and the engine there samples the trained weights."""
    done = subprocess.run([sys.executable, "-m", "tests.engine.host_sync_probe", str(tmp_path)], capture_output=True,
                          text=True, timeout=280)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["trainer_nodes"] == [out["train_node"]]
    assert out["rollout_nodes"] == [out["rollout_node"]] != [out["train_node"]]
    assert out["sync"] == "host"
    assert out["sync_wpgs"] == [out["trainer"]]  # the rollout group was not held
    assert out["synced"]["bytes"] == out["trained_bytes"]
    assert out["after"] == out["reference"]  # transformers' greedy answers on the trainer's weights
    assert out["after"] != out["before"]
    assert (out["published"], out["reloads"]) == (1, 1)
