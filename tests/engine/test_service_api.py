"""The engine's service API: submit (idempotently), read events by cursor, pause, resume, cancel,
budgets. Real Ray actors, real worker groups, the tiny preset. (A driver that dies is resumed, or
after too many restarts failed: ``test_recovery``.)"""

from __future__ import annotations

import dataclasses
import time

import pytest
import ray

from engine.control import EngineClient
from engine.errors import SessionClosed, SpecError, UnknownJob
from engine.paths import events_path
from engine.spec import GRPOConfig, JobSpec, ServiceConfig
from tests.engine.service_helpers import finished, metrics, pause_after_step, states, usage_device_s, wait_for

SPEC = JobSpec(task="arith", model="tiny-arith", steps=3, seed=3, rollout="torch", trainer="torch",
               # temperature 1: on the weak test model, 3 steps of 8 prompts at the default 0.6 can
               # draw no group with mixed rewards, and then nothing trains
               grpo=GRPOConfig(prompts_per_step=8, samples_per_prompt=4, updates_per_step=2, eval_every=3,
                               eval_size=10, max_tokens=6, temperature=1.0))
SESSION = JobSpec(algorithm="session", model="tiny-arith", rollout="torch", trainer="torch")
SESSION_IDLE_S = 10.0


@pytest.fixture(scope="module")
def engine(ray_engine, plexrl_home, tiny_model_dir):
    # sessions (below) idle this long are closed
    client = EngineClient(data_dir=plexrl_home, config=ServiceConfig(devices_per_group=0.25, threads=1,
                                                                     session_idle_s=SESSION_IDLE_S))
    yield client
    client.shutdown()


@pytest.fixture(scope="module")
def plain_run(engine):
    engine.submit_job("svc-plain", SPEC)
    return wait_for(engine, "svc-plain", finished)


def test_a_submitted_job_runs_to_success_and_its_events_read_by_cursor(plain_run):
    assert states(plain_run) == ["queued", "running", "succeeded"]
    assert [e["seq"] for e in plain_run] == list(range(1, len(plain_run) + 1))  # each once, in order
    assert [m["step"] for m in metrics(plain_run)] == [1, 2, 3]
    assert any(e["kind"] == "usage" for e in plain_run)
    # the service logged where it placed the job, before its driver's first event
    kinds = [e["kind"] for e in plain_run]
    placed = plain_run[kinds.index("placed")]
    assert kinds.index("placed") < kinds.index("state", kinds.index("spec"))
    assert {u["data"]["wpg"] for u in plain_run if u["kind"] == "usage"} == set(placed["data"]["groups"])
    assert len(placed["data"]["nodes"]) == len(placed["data"]["groups"])
    assert all(placed["data"]["nodes"])


def test_the_final_weights_are_a_hugging_face_folder(plain_run, plexrl_home):
    import torch
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    [artifact] = [e["data"] for e in plain_run if e["kind"] == "artifact"]
    assert artifact["name"] == "final"
    assert {"model.safetensors", "config.json", "tokenizer.json"} <= set(artifact["files"])
    [summary] = [e["data"] for e in plain_run if e["kind"] == "summary"]
    trained = load_file(f"{summary['final_checkpoint']}/model.safetensors")
    model = AutoModelForCausalLM.from_pretrained(artifact["path"], dtype=torch.float32)
    state = model.state_dict()
    assert all(torch.equal(state[name], tensor) for name, tensor in trained.items())
    base = load_file(plexrl_home / "models" / "tiny-arith" / "model.safetensors")
    assert any(not torch.equal(base[n], trained[n]) for n in trained if n in base)  # it did train


def test_submitting_the_same_job_again_starts_nothing(engine, plain_run):
    status = engine.submit_job("svc-plain", SPEC)
    assert status["state"] == "succeeded"
    assert not status["active"]
    assert engine.events("svc-plain") == plain_run


def test_pause_holds_the_job_and_resume_finishes_it_with_the_same_metrics(engine, plain_run):
    engine.submit_job("svc-paused", SPEC)
    wait_for(engine, "svc-paused", lambda ev: len(metrics(ev)) >= 1)
    assert engine.pause("svc-paused")["state"] == "paused"
    at_pause = len(metrics(engine.events("svc-paused")))
    time.sleep(3.0)
    # the call running at the pause finishes; the step it belonged to may log; nothing after that
    assert len(metrics(engine.events("svc-paused"))) <= at_pause + 1
    held = engine.events("svc-paused")
    time.sleep(2.0)
    assert metrics(engine.events("svc-paused")) == metrics(held)
    assert engine.resume("svc-paused")["state"] == "running"
    events = wait_for(engine, "svc-paused", finished)
    assert states(events)[-1] == "succeeded"
    assert "paused" in states(events)
    assert metrics(events) == metrics(plain_run)  # pausing changed nothing the job learned
    # the groups svc-plain left idle, reused: not new ones of the same kind
    assert {e["data"]["wpg"] for e in events if e["kind"] == "usage"} == {"torch-rollout", "torch-train"}


def call_device_s(events: list[dict]) -> list[float]:
    """Device-seconds of each call: a call on two worker groups (sync_weights) is charged on both."""
    calls: dict[int, float] = {}
    for e in events:
        if e["kind"] == "usage":
            calls[e["data"]["call"]] = calls.get(e["data"]["call"], 0.0) + e["data"]["devices"] * (
                e["data"]["end"] - e["data"]["start"])
    return list(calls.values())


def _standing_still(engine: EngineClient, job: str, timeout: float = 120.0) -> list[dict]:
    """The job's events once its log has stood still for two seconds (nothing of it runs)."""
    held, deadline = engine.events(job), time.monotonic() + timeout
    while True:
        time.sleep(2.0)
        now = engine.events(job)
        if now == held:
            return held
        held = now
        assert time.monotonic() < deadline, f"{job}: its log never stood still"


def test_a_budget_holds_the_job_mid_run_and_bounds_the_overrun(engine):
    # The budget is all but spent once the job is mid-run (paused after its first step, then the
    # budget lowered): its next call overruns it and nothing more runs, however fast or slow the
    # calls are. (A budget sized in advance from another run's device-seconds was not: under load
    # a run's calls take several times as long, and the job at times finished within it.)
    longer = dataclasses.replace(SPEC, steps=8)
    plenty, last = 1000.0, 1e-6  # device-seconds: more than the whole run; less than any call
    assert engine.set_budget("budget-lab", plenty) is None  # no budget before
    engine.submit_job("svc-budget", longer, tenant="budget-lab")
    engine.submit_job("svc-budget-free", longer)  # the same job, no budget: what it must learn
    pause_after_step(engine, "svc-budget", 1)
    before = _standing_still(engine, "svc-budget")
    # what was charged is what the log bills, call by call
    assert plenty - engine.set_budget("budget-lab", last) == pytest.approx(sum(usage_device_s(before)), rel=1e-9)
    engine.resume("svc-budget")
    wait_for(engine, "svc-budget", lambda events: engine.budget_left("budget-lab") <= 0)
    held = _standing_still(engine, "svc-budget")  # the job waits, queued, for budget
    assert not finished(held)
    assert 1 <= len(metrics(held)) < 8  # it stopped mid-run
    after = held[len(before):]
    left = engine.budget_left("budget-lab")
    assert sum(usage_device_s(after)) == pytest.approx(last - left, rel=1e-9)
    assert -left <= max(call_device_s(after))  # overrun: one call
    assert engine.set_budget("budget-lab", None) == pytest.approx(left)  # no limit: the job goes on
    events = wait_for(engine, "svc-budget", finished)
    free = wait_for(engine, "svc-budget-free", finished)
    assert states(events)[-1] == states(free)[-1] == "succeeded"
    assert metrics(events) == metrics(free)  # the held step was not lost, nor anything learned changed


def test_cancel_stops_the_driver_and_the_log_ends_cancelled(engine):
    engine.submit_job("svc-cancel", dataclasses.replace(SPEC, steps=50))
    wait_for(engine, "svc-cancel", lambda ev: len(metrics(ev)) >= 1)
    status = engine.cancel("svc-cancel", reason="user asked")
    assert status["state"] == "cancelled"
    assert status["reason"] == "user asked"
    assert not status["active"]
    last = engine.events("svc-cancel")
    time.sleep(2.0)
    assert engine.events("svc-cancel") == last  # nobody writes after the end
    assert len(metrics(last)) < 50


def test_bad_input_names_the_field_and_creates_nothing(engine, plexrl_home):
    with pytest.raises(SpecError, match="steps"):
        engine.submit_job("svc-bad", SPEC.to_dict() | {"steps": 0})
    with pytest.raises(ValueError, match="job id"):
        engine.submit_job("../escape", SPEC)
    with pytest.raises(ValueError, match="unknown job priority 'urgent'; known: low, normal, high"):
        engine.submit_job("svc-bad", SPEC, priority="urgent")
    with pytest.raises(ValueError, match="weight"):
        engine.set_tenant("svc-bad", weight=0.0, device_seconds=None)
    assert not events_path(plexrl_home, "svc-bad").exists()
    with pytest.raises(UnknownJob):
        engine.events("svc-never", 0)


def test_cluster_snapshot_lists_the_shared_groups(engine, plain_run):
    snap = engine.cluster_snapshot()
    assert {(g["side"], g["backend"]) for g in snap["groups"]} >= {("train", "torch"), ("rollout", "torch")}
    assert "queued" in snap["scheduler"]


def test_cluster_snapshot_lists_the_node_the_wpgs_run_on_and_the_jobs_on_them(engine, plain_run):
    engine.submit_job("svc-snap", SPEC)
    wait_for(engine, "svc-snap", lambda ev: len(metrics(ev)) >= 1)
    engine.pause("svc-snap")
    try:
        snap = engine.cluster_snapshot()
    finally:
        engine.cancel("svc-snap")
    (node,) = snap["nodes"]  # the session's one Ray node
    assert node["node_group"] == node["id"]
    assert snap["control_node"] == node["id"]
    (driver,) = snap["drivers"]  # the running job's, on the service's node, with its memory
    assert driver["job"] == "svc-snap"
    assert driver["node"] == node["id"]
    assert driver["rss_mb"] > 10
    assert driver["torch"] is False  # it orchestrates: arrays cross the API, torch stays in the workers
    wpgs = {(w["side"], w["backend"]): w for w in snap["wpgs"]}
    assert set(wpgs) >= {("train", "torch"), ("rollout", "torch")}
    for w in wpgs.values():
        assert w["node"] == node["id"]
        assert w["rank_nodes"] == [node["id"]]
    assert node["held_devices"] == pytest.approx(sum(w["devices"] for w in snap["wpgs"]))
    # free: what neither the engine's groups nor other actors (the session's worker group) hold
    assert node["free_devices"] == pytest.approx(ray.available_resources().get("device", 0))
    for key in (("train", "torch"), ("rollout", "torch")):
        assert wpgs[key]["models"] == ["tiny-arith"]
        assert wpgs[key]["architectures"] == ["Qwen2ForCausalLM"]
        assert "svc-snap" in wpgs[key]["resident_jobs"]  # it ran there and nothing evicted it
        assert "svc-plain" not in wpgs[key]["resident_jobs"]  # ended: no longer the engine's job


def test_a_finished_job_leaves_the_profile_its_shape_is_estimated_from(engine, plain_run, plexrl_home):
    from engine.accounting.estimate import read_profile

    profile = read_profile(SPEC, home=plexrl_home)  # written by the driver when the job succeeded
    assert profile is not None
    assert profile["measured_seconds"]["policy/generate"] > 0
    same_shape = engine.estimate(dataclasses.replace(SPEC, seed=8, steps=30))
    assert same_shape["basis"] == "profile"
    assert same_shape["step_seconds"] > 0
    assert {c["fn"] for c in same_shape["calls"]} >= {"create", "generate", "forward_backward", "sync_weights"}
    other = engine.estimate(dataclasses.replace(SPEC, grpo=dataclasses.replace(SPEC.grpo, prompts_per_step=16)))
    assert other["basis"] == "model"


def test_an_ended_job_leaves_nothing_on_the_shared_groups(engine, plain_run):
    assert_released("svc-plain")
    assert "svc-plain" not in {key.split("/")[0] for key in engine.cluster_snapshot()["scheduler"]["estimates"]}


def assert_released(job: str, timeout: float = 30.0) -> None:
    """The ended job's states leave the shared groups (the service drops them once its driver is
    done: soon after the log ends it)."""
    import ray

    ranks = [ray.get_actor(f"wpg:{group}:0", namespace="plexrl") for group in ("torch-train", "torch-rollout")]
    deadline = time.monotonic() + timeout
    while held := [d for rank in ranks for d in ray.get(rank.deployments.remote()) if d[0] == job]:
        assert time.monotonic() < deadline, f"still held after the job ended: {held}"
        time.sleep(0.2)


# -- sessions: the tenant's own loop, calling the function API from outside ----------------------
def test_the_platforms_grpo_run_through_a_session_learns_what_the_preset_job_does(engine, plain_run):
    from engine.rl import grpo

    engine.submit_job("svc-session", SESSION, tenant="org-s")
    loop = engine.session_loop("svc-session", "tiny-arith")  # every call as JSON, its result read back
    grpo.train(loop, job="svc-session", model="tiny-arith", task=SPEC.task, steps=SPEC.steps, seed=SPEC.seed,
               config=SPEC.grpo, tools=None, dataset=None)
    assert loop.close() == {"closed": "closed by the tenant", "calls": loop.calls}
    events = wait_for(engine, "svc-session", finished)
    assert states(events) == ["queued", "running", "succeeded"]
    assert metrics(events) == metrics(plain_run)  # the same numbers, step by step
    usage = [e["data"] for e in events if e["kind"] == "usage"]
    fns = {u["fn"] for u in usage}
    assert {"generate", "forward_backward", "optim_step", "sync_weights"} <= fns  # metered as any job
    assert all(u["job"] == "svc-session" and u["end"] > u["start"] for u in usage)
    with pytest.raises(SessionClosed, match="closed by the tenant"):
        engine.session_call("svc-session", loop.calls + 1, "optim_step", {})


def test_a_session_takes_calls_in_their_numbers_order_and_refuses_bad_ones_at_once_by_field(engine):
    engine.submit_job("svc-sess-calls", SESSION)
    # numbered by the caller: 2 reaches the session first, and waits for 1 (which makes the model)
    second = engine.session_submit("svc-sess-calls", 2, "generate",
                                   {"prompts": [[3, 4, 5]], "sampling": {"n": 2, "max_tokens": 3, "seed": 7}})
    created = engine.session_call("svc-sess-calls", 1, "create_model",
                                  {"role": "policy", "trainable": True, "optimizer": {"lr": 0.01}})
    assert created == {"role": "policy", "model": "tiny-arith"}
    completions = second.result(60)["completions"]
    assert [c["prompt_index"] for c in completions] == [0, 0]
    assert all(len(c["token_ids"]) == len(c["logprobs"]) <= 3 for c in completions)
    # refused before their turn (numbers 3 to 8, sent last to first: none waits for another), and
    # each uses its number, so that call 9 does not wait for them
    bad_calls = ((("generate", {"prompts": "3 4 5"}), "prompts"),
                 (("generate", {"prompts": [[3, -4]]}), "prompts[0]"),
                 (("forward_backward", {"batch": {"prompts": [[1]], "completions": [[2]],
                                                  "advantages": [1.0, 2.0]}, "loss": "grpo"}), "batch.advantages"),
                 (("save_checkpoint", {"tag": "../elsewhere"}), "tag"),
                 (("shell", {}), "fn"),
                 (("optim_step", {"role": "policy", "lr": 1}), "lr"))
    for seq, (bad, field) in reversed(list(enumerate(bad_calls, start=3))):
        with pytest.raises(SpecError) as info:
            engine.session_call("svc-sess-calls", seq, *bad)
        assert info.value.field == field
    with pytest.raises(SpecError, match="seq"):  # a number used before
        engine.session_call("svc-sess-calls", 2, "optim_step", {})
    rows = [[3, 4, 5]] * 2
    batch = {"prompts": rows, "completions": [c["token_ids"] for c in completions], "advantages": [1.0, -1.0],
             "old_logprobs": [c["logprobs"] for c in completions]}
    forward = engine.session_call("svc-sess-calls", 9, "forward", {"batch": batch}, wait_s=60)
    assert [len(r) for r in forward["logprobs"]] == [len(c["token_ids"]) for c in completions]
    loss = engine.session_call("svc-sess-calls", 10, "forward_backward", {"batch": batch, "loss": "grpo"})
    assert set(loss) == {"loss", "tokens", "metrics"}
    assert loss["tokens"] > 0
    assert engine.session_call("svc-sess-calls", 11, "optim_step", {})["tokens"] == loss["tokens"]
    logged = engine.session_call("svc-sess-calls", 12, "log_metrics", {"step": 1, "values": {"reward": 0.5}})
    assert logged == {"step": 1}
    # each log_metrics marks a step for the scheduler; several with no call between are no step
    # shape to profile, and the calls after them run (they used to fail in the scheduler)
    for seq in range(13, 33):
        engine.session_call("svc-sess-calls", seq, "log_metrics", {"step": seq - 11, "values": {"reward": 0.5}})
    again = engine.session_call("svc-sess-calls", 33, "forward", {"batch": batch})
    assert [len(r) for r in again["logprobs"]] == [len(r) for r in forward["logprobs"]]
    engine.session_call("svc-sess-calls", 34, "close", {})
    events = wait_for(engine, "svc-sess-calls", finished)
    assert metrics(events) == [{"step": step, "reward": 0.5} for step in range(1, 22)]  # the tenant's own curve
    assert_released("svc-sess-calls")  # its states leave the groups


def test_a_sessions_calls_from_its_drivers_node_go_over_its_socket_else_through_the_actor(engine):
    job = "svc-sess-socket"
    engine.submit_job(job, SESSION)
    engine.session_call(job, 1, "create_model", {"role": "policy", "trainable": True})
    line, driver = engine._session_lines[job], engine._sessions[job]
    assert line is not None  # this process is on the driver's node
    assert ray.get(driver.stats.remote())["socket_calls"] == 1

    def logged(seq: int) -> dict:
        return engine.session_call(job, seq, "log_metrics", {"step": seq, "values": {"reward": 1.0}})

    # a call waiting for its turn whose caller stops waiting goes on; its answer is fetched later
    later = engine.session_submit(job, 3, "log_metrics", {"step": 3, "values": {"reward": 1.0}})
    with pytest.raises(TimeoutError):
        later.answer(0.3)
    assert logged(2) == {"step": 2}
    assert engine.session_result(job, 3, 30)["result"] == {"step": 3}
    assert later.answer(30)["result"] == {"step": 3}  # asked again: the driver keeps it
    with pytest.raises(SpecError) as info:  # an error crosses as itself
        engine.session_call(job, 4, "generate", {"prompts": "3 4 5"})
    assert info.value.field == "prompts"
    over_socket = ray.get(driver.stats.remote())["socket_calls"]
    assert over_socket == 6
    # the socket gone: the calls go through the actor, with the same answers
    line.close()
    line.path = "/nonexistent/session.sock"
    assert logged(5) == {"step": 5}
    assert engine._session_lines[job] is None
    closed = engine.session_call(job, 6, "close", {})
    assert closed == {"closed": "closed by the tenant", "calls": 4}  # the refused one (4) ran nothing
    assert ray.get(driver.stats.remote())["socket_calls"] == over_socket
    events = wait_for(engine, job, finished)
    assert metrics(events) == [{"step": step, "reward": 1.0} for step in (2, 3, 5)]


def test_a_session_driver_on_another_node_is_called_through_its_actor(ray_engine):
    from engine.control import _session_line

    @ray.remote(num_cpus=0)
    class Elsewhere:
        def endpoint(self):
            return ("another-node", "/nonexistent/session.sock")

    assert _session_line(Elsewhere.remote(), 30.0) is None


def test_an_idle_session_is_closed_its_states_dropped_and_its_billing_stopped(engine):
    engine.submit_job("svc-sess-idle", SESSION)
    engine.session_call("svc-sess-idle", 1, "create_model", {"role": "policy", "trainable": True})
    engine.session_call("svc-sess-idle", 2, "generate", {"prompts": [[3, 4]], "sampling": {"max_tokens": 2}})
    last_call = time.time()
    events = wait_for(engine, "svc-sess-idle", finished, timeout=SESSION_IDLE_S + 60)
    end = [e for e in events if e["kind"] == "state"][-1]
    assert end["data"] == {"state": "succeeded", "reason": f"closed after {SESSION_IDLE_S:g} s without a call"}
    assert end["ts"] - last_call >= SESSION_IDLE_S - 0.5
    usage = [e for e in events if e["kind"] == "usage"]
    assert usage
    assert max(u["data"]["end"] for u in usage) <= last_call  # nothing billed while it idled, or after
    assert_released("svc-sess-idle")
    with pytest.raises(SessionClosed, match="without a call"):
        engine.session_call("svc-sess-idle", 3, "optim_step", {})


def test_a_job_that_is_not_a_session_takes_no_calls(engine, plain_run):
    with pytest.raises(ValueError, match="svc-plain is not a session: it runs the grpo algorithm itself"):
        engine.session_call("svc-plain", 1, "optim_step", {})
