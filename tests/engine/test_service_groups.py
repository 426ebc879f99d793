"""The engine service's worker groups over time: released once idle (``idle_release_s``), each
job on groups of its own (``dedicated``: the baseline ``plexrl bench cluster`` compares against),
and the device-seconds the groups hold, idle time included (what a provider pays). Real Ray
actors, torch backends."""

from __future__ import annotations

import contextlib
import dataclasses
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import ray

from engine.control import EngineClient
from engine.errors import UnknownJob
from engine.spec import GRPOConfig, JobSpec, ServiceConfig
from tests.engine.service_helpers import finished, metrics, states, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

SPEC = JobSpec(task="arith", model="tiny-arith", steps=2, seed=5, rollout="torch", trainer="torch",
               grpo=GRPOConfig(prompts_per_step=4, samples_per_prompt=4, updates_per_step=1, eval_every=2,
                               eval_size=4, max_tokens=6, temperature=1.0))


def usage(events: list[dict]) -> list[dict]:
    return [e["data"] for e in events if e["kind"] == "usage"]


def settled_free_slots(window_s: float = 8.0) -> float:
    """The device slots free on the node once a previous test's groups are gone: Ray frees a
    released group's slots a little after its shutdown returns, so the most seen over a short
    window (or all of them, as soon as they are)."""
    total = sum(n["Resources"].get("device", 0) for n in ray.nodes() if n["Alive"])
    best, deadline = 0.0, time.monotonic() + window_s
    while time.monotonic() < deadline and best < total:
        best = max(best, ray.available_resources().get("device", 0))
        time.sleep(0.5)
    return best


def billed(events: list[dict]) -> float:
    return sum((u["end"] - u["start"]) * u["devices"] for u in usage(events))


@pytest.mark.parametrize("config", [{"devices_per_group": 0.0}, {"max_resident": 0}, {"idle_release_s": -1.0},
                                    {"idle_release_s": float("nan")}])
def test_a_bad_service_config_is_refused(config):
    with pytest.raises(ValueError, match=r"invalid service config|idle_release_s must be >= 0"):
        ServiceConfig(**config)


def test_dedicated_jobs_run_on_groups_of_their_own_started_together_and_released_when_they_end(
        ray_engine, plexrl_home, tiny_model_dir):
    # ded-b and ded-c are submitted while ded-a's groups start. The service lets go of its lock while
    # groups start, so ded-b's start beside ded-a's (before, its submission waited for ded-a's groups
    # and then started its own: about twice ded-a's wait), and ded-c, cancelled while its groups
    # start, is cancelled at once and never runs
    size = settled_free_slots() / 6
    client = EngineClient(data_dir=plexrl_home, config=ServiceConfig(devices_per_group=size, threads=1,
                                                                     dedicated=True))
    try:
        with ThreadPoolExecutor(max_workers=3) as pool:
            a = pool.submit(client.submit_job, "ded-a", SPEC)
            time.sleep(0.5)  # its groups are starting (a start-up takes seconds)
            b = pool.submit(client.submit_job, "ded-b", SPEC)
            time.sleep(0.5)
            c = pool.submit(client.submit_job, "ded-c", dataclasses.replace(SPEC, seed=7))
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:  # until the service has it: placed, its groups starting
                with contextlib.suppress(UnknownJob):
                    client.status("ded-c")
                    break
                time.sleep(0.05)
            cancelled = client.cancel("ded-c", reason="not needed")
            assert (cancelled["state"], cancelled["active"]) == ("cancelled", False)
            assert a.result()["active"]
            assert b.result()["active"]
            assert c.result()["state"] == "cancelled"
        runs = {job: wait_for(client, job, finished) for job in ("ded-a", "ded-b")}
        assert all(states(ev)[-1] == "succeeded" for ev in runs.values())
        never = client.events("ded-c")
        assert states(never) == ["queued", "cancelled"]
        assert not [e for e in never if e["kind"] == "placed"]  # never placed: no driver, no call

        def waited(events: list[dict]) -> float:  # from its submission to its groups being up
            return next(e["ts"] for e in events if e["kind"] == "placed") - events[0]["ts"]

        assert waited(runs["ded-b"]) < 1.5 * waited(runs["ded-a"]), (waited(runs["ded-a"]), waited(runs["ded-b"]))
        wpgs = {job: {u["wpg"] for u in usage(ev)} for job, ev in runs.items()}
        assert len(wpgs["ded-a"]) == len(wpgs["ded-b"]) == 2  # a train and a rollout group each
        assert not wpgs["ded-a"] & wpgs["ded-b"]  # nothing shared
        assert all(job in name for job, names in wpgs.items() for name in names)
        assert metrics(runs["ded-a"]) == metrics(runs["ded-b"])  # the same spec: the same metrics
        deadline = time.monotonic() + 30  # released once the service sees each driver's run end
        while (snap := client.cluster_snapshot())["wpgs"] and time.monotonic() < deadline:
            time.sleep(0.2)
        assert snap["wpgs"] == []  # ded-c's too, once up (idle)
        # held: every group from its start to its release, idle time included; billed: calls only
        assert snap["held_device_seconds"] > sum(billed(ev) for ev in runs.values()) > 0
        held = snap["held_device_seconds"]
        time.sleep(1.0)
        assert client.cluster_snapshot()["held_device_seconds"] == held  # nothing held any more
    finally:
        client.shutdown()


def test_shared_groups_are_released_once_idle_for_the_configured_time(ray_engine, plexrl_home, tiny_model_dir):
    client = EngineClient(data_dir=plexrl_home, config=ServiceConfig(devices_per_group=0.25, threads=1,
                                                                     idle_release_s=5.0))
    try:
        client.submit_job("idle-a", SPEC)
        assert states(wait_for(client, "idle-a", finished))[-1] == "succeeded"
        assert len(client.cluster_snapshot()["wpgs"]) == 2  # kept while idle for less than 5 s
        deadline = time.monotonic() + 30
        while client.cluster_snapshot()["wpgs"] and time.monotonic() < deadline:
            time.sleep(0.2)
        assert client.cluster_snapshot()["wpgs"] == []  # then released
        # a later job gets groups again
        client.submit_job("idle-b", SPEC)
        assert states(wait_for(client, "idle-b", finished))[-1] == "succeeded"
    finally:
        client.shutdown()


def test_an_error_in_one_pass_of_the_watch_does_not_end_it(ray_engine, plexrl_home, tiny_model_dir):
    # room for one pair of groups and one job on it: the second job waits until the watch sees the
    # first one's driver end and admits it. The watch's first pass after arming raises (a Ray call
    # that timed out under load did so in CI): a watch that ended there would never see that end,
    # and the second job would stay queued for good
    from engine.workers import faults

    size = settled_free_slots() / 2
    client = EngineClient(data_dir=plexrl_home, config=ServiceConfig(devices_per_group=size, threads=1,
                                                                     job_demand=1.0))
    try:
        faults.arm(plexrl_home, "watch", action="raise")
        deadline = time.monotonic() + 30
        while not faults.tripped(plexrl_home, "watch") and time.monotonic() < deadline:
            time.sleep(0.1)
        assert faults.tripped(plexrl_home, "watch")
        assert client.submit_job("watch-a", SPEC)["active"]
        waits = client.submit_job("watch-b", dataclasses.replace(SPEC, seed=6))
        assert (waits["active"], waits["position"]) == (False, 1)
        runs = {job: wait_for(client, job, finished) for job in ("watch-a", "watch-b")}
        assert [states(ev)[-1] for ev in runs.values()] == ["succeeded", "succeeded"]
        assert states(runs["watch-b"])[:2] == ["queued", "running"]
    finally:
        faults.disarm(plexrl_home, "watch")
        client.shutdown()


def test_a_jobs_new_groups_start_at_once(ray_engine, plexrl_home, tiny_model_dir):
    # serially, a job's train group would start only once its rollout group was up: their
    # start-ups (begin: up_s ago, for start_s) would not overlap
    client = EngineClient(data_dir=plexrl_home, config=ServiceConfig(devices_per_group=0.25, threads=1))
    try:
        assert client.submit_job("both-at-once", SPEC)["active"]
        wpgs = client.cluster_snapshot()["wpgs"]
        assert sorted(w["side"] for w in wpgs) == ["rollout", "train"]
        spans = [(-w["up_s"], -w["up_s"] + w["start_s"]) for w in wpgs]  # seconds, relative to now
        assert max(begin for begin, _ in spans) < min(end for _, end in spans), spans
        assert states(wait_for(client, "both-at-once", finished))[-1] == "succeeded"
    finally:
        client.shutdown()


def test_a_kind_gets_a_second_pair_of_groups_once_its_first_is_full_and_a_job_waits_when_no_slots_are_left(
        ray_engine, plexrl_home, tiny_model_dir):
    # 0.6 of a group's time each: two jobs fill a pair (1.2 <= 1.3); a quarter of the free slots a
    # group: two pairs fit, not three. Steps enough that no job of the first pair ends before the
    # fifth is submitted: a submission the engine admits returns once its groups are up (a group
    # imports its backend's libraries as it starts), and the second pair forms while the first runs
    size = settled_free_slots() / 4
    spec = dataclasses.replace(SPEC, steps=30)
    client = EngineClient(data_dir=plexrl_home, config=ServiceConfig(devices_per_group=size, threads=1,
                                                                     job_demand=0.6))
    jobs = [f"kind-{i}" for i in range(6)]
    try:
        statuses = {job: client.submit_job(job, dataclasses.replace(spec, seed=20 + i))
                    for i, job in enumerate(jobs)}
        assert [statuses[j]["active"] for j in jobs] == [True] * 4 + [False] * 2
        assert statuses["kind-4"]["position"] == 1
        assert "device slots for its torch train, torch rollout worker group(s)" in statuses["kind-4"]["reason"]
        assert "group(s) are full (jobs' demands sum to the limit 1.3)" in statuses["kind-4"]["reason"]
        assert statuses["kind-5"]["reason"] == "behind kind-4 in the queue"
        runs = {job: wait_for(client, job, finished) for job in jobs}
        assert all(states(ev)[-1] == "succeeded" for ev in runs.values())
        wpgs = {job: sorted({u["wpg"] for u in usage(ev)}) for job, ev in runs.items()}
        first, second = ["torch-rollout", "torch-train"], ["torch-rollout-2", "torch-train-2"]
        assert wpgs["kind-0"] == wpgs["kind-1"] == first
        assert wpgs["kind-2"] == wpgs["kind-3"] == second  # the first pair was full
        assert wpgs["kind-4"] in (first, second)
        assert wpgs["kind-5"] in (first, second)
        assert states(runs["kind-4"])[:2] == ["queued", "running"]
    finally:
        client.shutdown()
