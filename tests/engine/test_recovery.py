"""Engine faults, one at a time, mid-run: a job's driver, a rollout rank mid-generate, one rank of
a TP=2 trainer mid-forward_backward, the scheduler. Real processes die (SIGKILL through a fail
point, or ``ray.kill``); the engine service replaces what died and resumes the jobs from their last
checkpoint. Each job must then end as an undisturbed run with the same seed does: the same metrics,
every step logged once, no device time billed twice; a job that keeps failing ends failed, with
its reason."""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import subprocess
import sys
import time
from collections import Counter, defaultdict

import pytest
import ray

from engine.control import EngineClient
from engine.spec import GRPOConfig, JobSpec, ServiceConfig
from engine.workers import faults
from tests.engine.service_helpers import finished, metrics, pause_after_step, states, usage_device_s, wait_for

# seed 0: every step has groups with mixed rewards, so every step trains (a resumed job must have
# its weights and optimizer state back to learn the same)
SPEC = JobSpec(task="arith", model="tiny-arith", steps=4, seed=0, rollout="torch", trainer="torch",
               grpo=GRPOConfig(prompts_per_step=8, samples_per_prompt=4, updates_per_step=2, eval_every=2,
                               eval_size=10, max_tokens=6, temperature=1.0, checkpoint_every=1))
TP2 = dataclasses.replace(SPEC, trainer="megatron", tp=2, steps=3)
# another model configuration (another vocabulary) on the same task: two architectures on one cluster
OTHER_MODEL = dataclasses.replace(SPEC, model="tiny-arith-tools", steps=1, seed=3)


@pytest.fixture(scope="module")
def engine(ray_engine, plexrl_home, tiny_model_dir):
    client = EngineClient(data_dir=plexrl_home, config=ServiceConfig(devices_per_group=0.25, threads=1,
                                                                     max_recoveries=2))
    yield client
    client.shutdown()


@pytest.fixture(scope="module")
def plain(engine):
    """Undisturbed runs: what every disturbed job must end with."""
    engine.submit_job("rec-plain", SPEC)
    events = wait_for(engine, "rec-plain", finished)
    assert all(m["groups_used"] > 0 and m["loss"] != 0 for m in metrics(events)[:3])
    return events


@ray.remote(num_cpus=0)
class _Rank:
    def bulky(self) -> list:
        return [ray.put(b"x" * 200_000)]  # as a rank returns a bulky result: owned by the rank


def test_a_result_whose_owner_died_is_a_fault_whose_reason_says_it_was_lost():
    # a node lost under a job surfaces as whichever error reaches the driver first: a dead actor,
    # or a rank's result whose owner died with the node (Ray's text: the object's id and a tip)
    from ray.exceptions import OwnerDiedError

    from engine.errors import EngineFault, as_fault, fault_reason, is_engine_fault

    exc = OwnerDiedError("00c4306b9129785d338c2eeea249086934147f9e01000000", owner_address=None, call_site="")
    assert is_engine_fault(exc)
    reason = fault_reason(exc)
    assert reason.startswith("OwnerDiedError: ")
    assert "lost" in reason
    assert "00c4306b" not in reason
    # as a job's driver hands it to the engine service, whose recovery event quotes it
    fault = as_fault(exc)
    assert isinstance(fault, EngineFault)
    assert str(fault) == reason
    assert "lost" in fault_reason(fault)
    assert "00c4306b" not in fault_reason(fault)
    assert as_fault(fault) is fault


def test_a_result_lost_with_the_rank_that_held_it_is_an_engine_fault(ray_engine):
    """A rank's bulky result stays in its process until the driver fetches it; the rank dying
    first (its node removed) fails the fetch with Ray's OwnerDiedError. That is the engine's
    fault, not the job's: the job is recovered, not failed."""
    from engine.errors import is_engine_fault

    rank = _Rank.remote()
    (ref,) = ray.get(rank.bulky.remote())
    ray.kill(rank, no_restart=True)
    # gone, not just asked to go: ray.kill is asynchronous, so a call sent right after it may still
    # be served; the rank must stop answering within the minute
    deadline = time.monotonic() + 60
    while True:
        try:
            ray.get(rank.bulky.remote(), timeout=60)
        except ray.exceptions.RayActorError:
            break
        assert time.monotonic() < deadline, "the killed rank still answers"
        time.sleep(0.1)
    lost, deadline = None, time.monotonic() + 60
    while lost is None and time.monotonic() < deadline:  # the store frees the dead owner's objects soon after
        try:
            ray.get(ref, timeout=60)
            time.sleep(0.2)
        except ray.exceptions.OwnerDiedError as exc:
            lost = exc
    assert lost is not None, "the dead rank's result stayed fetchable"
    assert is_engine_fault(lost)
    assert not is_engine_fault(ValueError("the job's own error"))


def recoveries(events: list[dict]) -> list[dict]:
    return [e["data"] for e in events if e["kind"] == "recovery"]


def assert_recovered(events: list[dict], undisturbed: list[dict], times: tuple[int, ...] = (1,)) -> None:
    assert states(events)[-1] == "succeeded", states(events)
    assert len(recoveries(events)) in times  # the fault happened, and was recovered from
    assert metrics(events) == metrics(undisturbed)  # learned the same, step by step
    steps = [m["step"] for m in metrics(events)]
    assert steps == sorted(set(steps))  # no point lost or twice
    assert not any("replayed after a restart with different metrics" in e["data"].get("message", "")
                   for e in events if e["kind"] == "log")
    seqs = [e["seq"] for e in events]
    assert seqs == list(range(1, len(seqs) + 1))
    # billing reads usage events: none twice, and no two on a worker group overlap in time (a group
    # runs one call at a time, so an overlap would be one device-second billed twice)
    usage = [e["data"] for e in events if e["kind"] == "usage"]
    assert not [r for r, n in Counter(tuple(sorted(u.items())) for u in usage).items() if n > 1]
    by_group = defaultdict(list)
    for u in usage:
        by_group[u["wpg"]].append((u["start"], u["end"]))
    for spans in by_group.values():
        spans.sort()
        assert all(b[0] >= a[1] for a, b in itertools.pairwise(spans))
    # each recovery marks the work it throws away (the usage since the checkpoint it resumes from)
    # and billing skips it: the calls billed are the undisturbed run's, plus per resume from a
    # checkpoint the new driver's start-up (its models created, as the undisturbed run's before its
    # first generate), the load of that checkpoint and the weight sync after it
    checkpoints = [e["seq"] for e in events if e["kind"] == "checkpoint"]
    windows = []
    for e in events:
        if e["kind"] == "recovery":
            assert e["data"]["redone_after_seq"] == max((c for c in checkpoints if c < e["seq"]), default=0)
            windows.append((e["data"]["redone_after_seq"], e["seq"]))
    billed = Counter(e["data"]["fn"] for e in events if e["kind"] == "usage"
                     and not any(lo < e["seq"] < hi for lo, hi in windows))
    resumed = sum(1 for lo, _ in windows if lo > 0)
    plain_usage = [e["data"] for e in undisturbed if e["kind"] == "usage"]
    fns = [u["fn"] for u in plain_usage]
    startup = Counter(fns[:fns.index("generate")])
    # a call holding two groups (a sync: the train and the rollout group) leaves a record on each
    per_sync = max(Counter(u["call"] for u in plain_usage if u["fn"] == "sync_weights").values())
    expected = Counter(fns)
    for _ in range(resumed):
        expected.update(startup + Counter({"load_checkpoint": 1, "sync_weights": per_sync}))
    assert billed == +expected, (billed, expected)


def wait_for_step(engine: EngineClient, job: str, step: int) -> None:
    wait_for(engine, job, lambda events: any(m["step"] >= step for m in metrics(events)))


def test_a_driver_killed_mid_run_resumes_from_its_checkpoint(engine, plain):
    engine.submit_job("rec-driver", SPEC)
    pause_after_step(engine, "rec-driver", 1)  # so that it cannot end before the kill
    ray.kill(ray.get_actor("driver:rec-driver"), no_restart=True)
    wait_for(engine, "rec-driver", recoveries)  # its new driver is there, paused as the job was
    assert engine.resume("rec-driver")["state"] == "running"
    events = wait_for(engine, "rec-driver", finished)
    assert_recovered(events, plain)
    resumed = [e["data"]["message"] for e in events
               if e["kind"] == "log" and e["data"]["message"].startswith("resumed after step ")]
    assert len(resumed) == 1
    # killed once step 1 was logged and the job paused: before or after a checkpoint, or mid-step
    assert resumed[0] in {f"resumed after step {n} from checkpoint step-{n}" for n in (1, 2, 3)}


def test_a_rollout_rank_killed_mid_generate_is_replaced_and_the_job_resumes(engine, plain, plexrl_home):
    # generate calls: the initial evaluation, then one per step: the third is step 2's
    faults.arm(plexrl_home, "rank", nth=3, job="rec-rollout", fn="generate")
    engine.submit_job("rec-rollout", SPEC)
    events = wait_for(engine, "rec-rollout", finished)
    assert faults.tripped(plexrl_home, "rank")
    assert_recovered(events, plain)
    assert "lost rank 0 during generate of rec-rollout" in recoveries(events)[0]["message"]


def test_the_scheduler_killed_mid_run_resumes_every_job(engine, plain):
    jobs = ("rec-sched-a", "rec-sched-b")
    for job in jobs:
        engine.submit_job(job, SPEC)
    pause_after_step(engine, jobs[0], 1)  # both paused mid-run: neither can end before the kill
    engine.pause(jobs[1])
    ray.kill(ray.get_actor("plexrl-scheduler"), no_restart=True)
    for job in jobs:  # each resumes on a new scheduler, still paused, as it was
        wait_for(engine, job, recoveries)
        assert engine.resume(job)["state"] == "running"
    for job in jobs:
        assert_recovered(wait_for(engine, job, finished), plain)


def test_the_state_manager_killed_mid_run_loses_no_job(engine, plain, plexrl_home):
    from engine.state.manager import state_manager

    jobs = ("rec-state-a", "rec-state-b", "rec-state-c")  # three on groups that hold two: they swap
    for job in jobs:
        engine.submit_job(job, SPEC)
    # all paused mid-run, so that none can end before the kill: a state is then off the devices,
    # in the manager (a job's step takes a fraction of a second here)
    pause_after_step(engine, "rec-state-a", 1)
    for job in jobs[1:]:
        engine.pause(job)
    ray.kill(state_manager(plexrl_home), no_restart=True)
    for job in jobs:
        engine.resume(job)
    restarts = 0
    for job in jobs:
        events = wait_for(engine, job, finished)
        # a job whose state the manager did not hold when it died runs on undisturbed
        assert_recovered(events, plain, times=(0, 1))
        restarts += len(recoveries(events))
    assert restarts  # some state was lost with the manager, and recovered


def test_a_tp2_rank_killed_mid_forward_backward_takes_its_group_down_and_the_job_resumes(engine, plexrl_home):
    engine.submit_job("rec-tp2-plain", TP2)
    undisturbed = wait_for(engine, "rec-tp2-plain", finished, timeout=300)
    assert states(undisturbed)[-1] == "succeeded"
    assert all(m["groups_used"] > 0 and m["loss"] != 0 for m in metrics(undisturbed))
    # rank 1 dies as it starts step 2's first forward_backward; rank 0 waits for it in the
    # tensor-parallel all-reduce, and is killed with its group
    faults.arm(plexrl_home, "rank", nth=3, job="rec-tp2", fn="forward_backward", rank=1)
    engine.submit_job("rec-tp2", TP2)
    events = wait_for(engine, "rec-tp2", finished, timeout=300)
    assert faults.tripped(plexrl_home, "rank")
    assert_recovered(events, undisturbed)
    assert "lost rank 1 during forward_backward of rec-tp2" in recoveries(events)[0]["message"]


def test_a_job_whose_driver_keeps_dying_ends_failed_with_its_reason(engine):
    spec = dataclasses.replace(SPEC, steps=30)  # long enough to be killed three times
    engine.submit_job("rec-doomed", spec)
    def stepping_after(n: int):  # the n-th driver has logged a step
        def ok(events: list[dict]) -> bool:
            marks = [e["seq"] for e in events if e["kind"] == "recovery"]
            return len(marks) == n and any(e["kind"] == "metrics" and e["seq"] > max(marks, default=0)
                                           for e in events)
        return ok

    for attempt in range(3):  # the engine allows two restarts (max_recoveries=2)
        wait_for(engine, "rec-doomed", stepping_after(attempt))
        deadline = time.monotonic() + 60
        while True:
            try:
                ray.kill(ray.get_actor("driver:rec-doomed"), no_restart=True)
                break
            except ValueError:  # between two drivers
                assert time.monotonic() < deadline
                time.sleep(0.1)
    events = wait_for(engine, "rec-doomed", finished)
    assert states(events)[-1] == "failed"
    reason = [e["data"] for e in events if e["kind"] == "state"][-1]["reason"]
    assert reason.startswith("engine fault, not recovered after 2 restarts: ")
    assert "ActorDiedError" in reason
    assert len(recoveries(events)) == 2


def test_the_engine_service_killed_mid_run_is_started_again_and_its_jobs_resume(engine, plain):
    """The controller itself dies (its drivers and groups, which it owns, with it). The client's
    next call starts another service, which rebuilds its jobs from their event logs: each resumes
    from its last checkpoint, with its tenant, priority and pause, and ends as undisturbed."""
    engine.submit_job("rec-service-a", SPEC)
    engine.submit_job("rec-service-b", SPEC, tenant="acme", priority="high")
    wait_for_step(engine, "rec-service-b", 1)
    engine.pause("rec-service-b")
    wait_for_step(engine, "rec-service-a", 2)
    old = engine.actor
    ray.kill(old, no_restart=True)
    dead(old)  # (ray.kill lands asynchronously: a call made at once may still reach the old service)
    assert engine.status("rec-service-a")["job"] == "rec-service-a"  # answered by a new service
    assert engine.actor != old
    events = wait_for(engine, "rec-service-a", finished)
    assert_recovered(events, plain)
    assert recoveries(events)[0]["message"].startswith("the engine service restarted; restart 1 of at most 2")
    paused = wait_for(engine, "rec-service-b", lambda events: any(e["kind"] == "placed" for e in events
                                                                  if e["seq"] > recoveries_seq(events)))
    assert states(paused)[-1] == "paused"  # still paused, as the tenant left it
    scheduler = ray.get_actor("plexrl-scheduler")
    assert ray.get(scheduler.priority.remote("rec-service-b")) == 2.0
    engine.resume("rec-service-b")
    assert_recovered(wait_for(engine, "rec-service-b", finished), plain)


def dead(actor, timeout_s: float = 30.0) -> None:
    """Wait until ``actor``, killed, answers no more."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            ray.get(actor.__ray_ready__.remote(), timeout=5)
        except ray.exceptions.RayActorError:
            return
        except ray.exceptions.GetTimeoutError:  # busy, or on its way out
            pass
        assert time.monotonic() < deadline, "the killed actor still answers"
        time.sleep(0.1)


def recoveries_seq(events: list[dict]) -> float:
    """The seq of the job's first recovery event (infinity before there is one)."""
    return next((e["seq"] for e in events if e["kind"] == "recovery"), float("inf"))


def test_a_restarted_scheduler_has_the_tenants_weights_budgets_and_priorities_back(engine):
    """The scheduler keeps them in memory: killed, its replacement gets them from the controller
    before its first call, each budget less the usage since it was pushed (from the job's log)."""
    engine.submit_job("rec-tenant", SPEC, tenant="acme", priority="high")
    wait_for_step(engine, "rec-tenant", 1)
    # the push happens at some time between these two (the scheduler's clock is the wall
    # clock's, to a few milliseconds): calls that end in between may or may not count against it
    sent_at = time.time()
    engine.set_tenant("acme", weight=3.0, device_seconds=500.0)
    pushed_by = time.time()
    wait_for_step(engine, "rec-tenant", 2)
    engine.pause("rec-tenant")  # nothing of it runs on the new scheduler: its budget stays put
    ray.kill(ray.get_actor("plexrl-scheduler"), no_restart=True)
    events = wait_for(engine, "rec-tenant", lambda events: bool(recoveries(events)))  # healed, driver replaced
    scheduler = ray.get_actor("plexrl-scheduler")
    assert ray.get(scheduler.tenant.remote("acme"))["weight"] == 3.0
    assert ray.get(scheduler.priority.remote("rec-tenant")) == 2.0
    def used_since(t: float) -> tuple[float, float]:  # device-seconds of the calls that ended after t, the largest
        spent = usage_device_s([e for e in events if e["kind"] == "usage" and e["data"]["end"] > t])
        return sum(spent), max(spent, default=0.0)

    (most, one_call), (least, _) = used_since(sent_at), used_since(pushed_by)
    assert most > 0
    # what is left: 500 less the calls that ended after the push (one running then may count either way)
    left = ray.get(scheduler.tenant.remote("acme"))["budget"]
    assert 500.0 - most - one_call <= left <= 500.0 - least + one_call
    assert engine.set_budget("acme", None) == pytest.approx(left, abs=one_call)
    engine.cancel("rec-tenant")


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_worker_node_lost_mid_run_takes_no_control_plane_and_its_job_resumes_on_another(plain, plexrl_home,
                                                                                          tmp_path):
    """Several Ray nodes (``node_fault_probe``): the node a job's groups run on is removed while
    the job is paused after step 1, and the job resumed; the engine service, the scheduler and the
    driver live on the head, so they outlive it; the groups start again on the other worker node
    and the job ends as the undisturbed run on this one node did."""
    env = {**os.environ, "PLEXRL_HOME": str(plexrl_home)}
    done = subprocess.run([sys.executable, "-m", "tests.engine.node_fault_probe", str(tmp_path),
                           json.dumps(SPEC.to_dict())], capture_output=True, text=True, timeout=580, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(next(line for line in reversed(done.stdout.splitlines()) if line.startswith("{")))
    assert out["removed"] in out["workers"]
    assert out["control_before"] == out["control_after"] == out["head"]  # the control plane never moved
    (other,) = set(out["workers"]) - {out["removed"]}
    assert out["wpg_nodes_after"] == [other]
    assert_recovered(out["events"], plain)
    assert "lost" in recoveries(out["events"])[0]["message"]


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_drained_node_hands_its_job_to_another_and_takes_no_new_one(plain, engine, plexrl_home,
                                                                      tiny_tools_model_dir, tmp_path):
    """Several Ray nodes (``drain_probe``): the node a job runs on is drained while the job is
    paused after step 1; resumed, it goes on on the other node from its last checkpoint and ends
    as the undisturbed run did; a job of another model configuration submitted then waits for the
    other node rather than going to the drained one, and learns there what it learns alone."""
    engine.submit_job("rec-plain-other", OTHER_MODEL)
    other_alone = wait_for(engine, "rec-plain-other", finished)
    env = {**os.environ, "PLEXRL_HOME": str(plexrl_home)}
    done = subprocess.run([sys.executable, "-m", "tests.engine.drain_probe", str(tmp_path),
                           json.dumps(SPEC.to_dict()), json.dumps(OTHER_MODEL.to_dict())],
                          capture_output=True, text=True, timeout=580, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(next(line for line in reversed(done.stdout.splitlines()) if line.startswith("{")))
    drained = out["drained"]
    assert out["answer"] == {"node": drained, "draining": True, "moved": ["mn-drain"]}
    (other,) = set(out["workers"]) - {drained}
    assert out["wpg_nodes_during"] == [other]  # its groups were released, the job's new ones are elsewhere
    rows = {n["id"]: n for n in out["nodes_during"]}
    assert rows[drained]["draining"]
    assert not rows[other]["draining"]
    assert out["after_queued"]["state"] == "queued"  # the other node is busy, the drained one takes none
    assert out["after_states"][-1] == "succeeded"
    assert metrics(out["after_events"]) == metrics(other_alone) != []
    assert_recovered(out["events"], plain)
    assert "drained by an admin" in recoveries(out["events"])[0]["message"]
