"""The cluster simulator: hand-computed tiny cases, the presets as published, determinism, inputs."""

from __future__ import annotations

import dataclasses
import gc
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from engine.accounting.metering import device_seconds
from engine.scheduler.admission import Demand, measure_demand
from engine.scheduler.core import Policy
from engine.scheduler.placement import assign_wpgs
from engine.sim.simulate import (
    MODES,
    CallSpec,
    SimJob,
    make_pool,
    run_dedicated,
    run_mode,
    run_pools,
    step_profile,
    summarise,
)
from engine.sim.workload import (
    PRESETS,
    Job,
    ModelClass,
    Shares,
    StepPlan,
    Workload,
    arrival_rate,
    generate_jobs,
    load_jobs_csv,
    plan_all,
)

ROOT = Path(__file__).resolve().parents[2]
EXACT = Policy(max_start_delay_s=0.0)  # no alignment delays: hand-computable times


def one_wpg_job(name: str, steps: int, call_s: float, host_s: float, switch_s: float) -> SimJob:
    """Each step: one call of ``call_s`` on the train WPG, then ``host_s`` on the host."""
    return SimJob(name, "c", 0.0, steps, 0, (0.0, 0.0),
                  {("policy", "train"): switch_s, ("policy", "rollout"): switch_s},
                  lambda k: [(CallSpec("forward_backward", "train", call_s),), host_s])


def one_wpg_pool(capacity: int):
    return make_pool("p", "c", EXACT, [], [(1, capacity)])


# --- hand-computed shared runs ------------------------------------------------------------------------


def test_a_job_alone_pays_its_calls_and_one_switch():
    r = run_pools("plexrl", [one_wpg_pool(1)], [one_wpg_job("a", 3, 2.0, 1.0, 0.5)])
    # step 1: switch 0.5 + call 2 -> 2.5, host -> 3.5; steps 2, 3 resident: 3 s each
    assert r.finish["a"] == pytest.approx(9.5)
    assert device_seconds(r.usage) == pytest.approx(6.5)
    assert [u.setup_s for u in r.usage] == [0.5, 0.0, 0.0]
    assert r.switches == 1


def test_two_jobs_with_complementary_phases_share_one_wpg():
    # a and b: 2 s on the WPG, then 2 s on the host. b waits for a's first call, then each one's
    # call runs while the other is on the host.
    jobs = [one_wpg_job("a", 2, 2.0, 2.0, 0.5), one_wpg_job("b", 2, 2.0, 2.0, 0.5)]
    r = run_pools("plexrl", [one_wpg_pool(2)], jobs)
    # a: [0, 2.5] (switch in), host to 4.5, waits for b's call to end at 5.0, [5, 7], host to 9
    # b: [2.5, 5.0] (switch in), host to 7.0, [7, 9], host to 11
    assert r.finish == {"a": pytest.approx(9.0), "b": pytest.approx(11.0)}
    assert device_seconds(r.usage, job="a") == pytest.approx(4.5)
    assert device_seconds(r.usage, job="b") == pytest.approx(4.5)
    assert r.switches == 2
    # the WPG is busy 9 of 11 s: 2 s idle while both wait on the host at the very end
    assert device_seconds(r.usage) == pytest.approx(9.0)


def test_a_wpg_holding_one_state_switches_on_every_change_of_job():
    jobs = [one_wpg_job("a", 2, 2.0, 2.0, 0.5), one_wpg_job("b", 2, 2.0, 2.0, 0.5)]
    r = run_pools("plexrl", [one_wpg_pool(1)], jobs)
    # a [0, 2.5], b [2.5, 5.0], a [5.0, 7.5] (switch back), b [7.5, 10.0]; hosts after each
    assert r.finish == {"a": pytest.approx(9.5), "b": pytest.approx(12.0)}
    assert r.switches == 4
    assert device_seconds(r.usage) == pytest.approx(10.0)


def test_admission_waits_for_room_and_backfill_lets_another_class_pass():
    def job(name, cls, arrival, demand):
        return SimJob(name, cls, arrival, 1, 0, (0.0, demand), {},
                      lambda k: [(CallSpec("forward_backward", "train", 10.0),)])

    jobs = [job("big", "x", 0.0, 0.8), job("big2", "x", 1.0, 0.8), job("small", "y", 2.0, 0.5)]
    for spread, small_start in ((False, 10.0), (True, 2.0)):
        pools = [make_pool("px", "x", EXACT, [], [(1, 1)]), make_pool("py", "y", EXACT, [], [(1, 1)])]
        r = run_pools("m", pools, jobs, admit_load=1.0, spread=spread)
        assert r.start["big2"] == pytest.approx(10.0)  # waits for big's room either way
        assert r.start["small"] == pytest.approx(small_start)


# --- hand-computed dedicated runs ---------------------------------------------------------------------

CLS = ModelClass("t", 1.0, 1.0, rollout_gpus=2, train_gpus=2, step_s=8.0, replica_gpus=1, train_mp=2)


def tiny_plan(arrival: float = 0.0, name: str = "j") -> StepPlan:
    return StepPlan(Job(name, "t", arrival, 2, 0), CLS,
                    rollout_s=np.array([[3.0, 2.0], [3.0, 3.0]]), colocated_rollout_s=np.array([2.0, 2.0]),
                    reward_s=np.array([1.0, 1.0]), logprob_s=np.array([1.0, 1.0]), train_s=np.array([2.0, 2.0]),
                    sync_s=np.array([1.0, 1.0]))


def tiny_workload(gpus: int = 64) -> Workload:
    return Workload("tiny", (CLS,), Shares(0.5, 0.1, 0.1, 0.2, 0.1), gpus=gpus, h2d_gb_s=1e9)


def test_isolated_split_bills_its_reservation_over_sequential_steps():
    r = run_dedicated("isolated_split", tiny_workload(), [tiny_plan()])
    assert r.finish["j"] == pytest.approx(16.0)  # 2 x (3 + 1 + 1 + 2 + 1)
    assert device_seconds(r.usage) == pytest.approx(64.0)  # 4 devices x 16 s


def test_async_split_overlaps_the_next_rollout_with_training():
    r = run_dedicated("async_split", tiny_workload(), [tiny_plan()])
    # gen 0 [0, 4]; train 0 [4, 7]; gen 1 (weights of step -1) [4, 8]; sync 0 [8, 9] once gen 1 is
    # done; train 1 [9, 12]; sync 1 [12, 13]
    assert r.finish["j"] == pytest.approx(13.0)
    assert device_seconds(r.usage) == pytest.approx(52.0)


def test_colocated_runs_both_phases_on_every_device():
    r = run_dedicated("colocated", tiny_workload(), [tiny_plan()])
    # rollout 2 + reward 1 + (log-prob + train) 3 x 2/4 devices + sync 1 (+ a switch of ~0 s)
    assert r.finish["j"] == pytest.approx(2 * (2 + 1 + 1.5 + 1), abs=1e-6)


def test_dedicated_jobs_queue_first_come_first_served_for_devices():
    plans = [tiny_plan(0.0, "a"), tiny_plan(1.0, "b")]
    r = run_dedicated("isolated_split", tiny_workload(gpus=64), plans)
    assert r.start == {"a": 0.0, "b": 1.0}  # 8 of 64 devices: no wait
    w = dataclasses.replace(tiny_workload(gpus=64), gpus=64)
    big = dataclasses.replace(CLS, rollout_gpus=32, train_gpus=32)
    plans = [dataclasses.replace(p, cls=big) for p in plans]
    r = run_dedicated("isolated_split", w, plans)
    assert r.start["b"] == pytest.approx(r.finish["a"])  # the whole cluster: b waits for a


def test_work_floor_counts_each_replica_its_own_busy_time():
    # replicas (3 + 2 + 3 + 3) x 1 device + train side (1 + 2) x 2 steps x 2 devices + sync 2 x 2 (the
    # train devices: a sync through the host tier holds no more; the rollout side's reload is a switch)
    assert tiny_plan().work_floor_device_s() == pytest.approx(11 + 12 + 4)


# --- presets, draws and the whole run ------------------------------------------------------------------


def test_paper_math_is_the_published_preset():
    w = PRESETS["paper-math"]
    got = [(c.name, c.fraction, c.rollout_gpus, c.train_gpus, c.step_s) for c in w.classes]
    assert got == [("7B", 0.40, 8, 8, 300.0), ("32B", 0.30, 16, 16, 450.0), ("72B", 0.20, 32, 32, 600.0),
                   ("235B-A22B", 0.10, 64, 64, 800.0)]
    assert dataclasses.astuple(w.shares) == (0.55, 0.05, 0.12, 0.25, 0.03)
    assert (w.gpus, w.node_gpus, w.group_gpus, w.h2d_gb_s, w.disk_gb_s) == (2048, 8, 64, 25.0, 5.0)
    assert (w.length_median, w.length_sigma, w.length_cap) == (1500.0, 1.0, 16384)
    assert (w.weight_bytes, w.optimizer_bytes, w.steps_min, w.steps_max, w.load) == (2.0, 12.0, 100, 400, 0.8)


def test_paper_math_backlog_is_paper_math_with_a_days_arrivals():
    w, base = PRESETS["paper-math-backlog"], PRESETS["paper-math"]
    assert dataclasses.replace(w, name="paper-math", arrivals_per_s=None) == base  # nothing else differs
    jobs = generate_jobs(w, 1000, 0)
    assert arrival_rate(w) == 1000 / 86400
    assert jobs[-1].arrival == pytest.approx(86400, rel=0.1)  # the 1,000 jobs arrive over about a day
    # far above what isolated split serves (about 50 jobs at once): a backlog
    assert arrival_rate(w) > 10 * arrival_rate(base)


def test_rollout_phase_is_calibrated_to_its_share_and_has_a_tail():
    w = PRESETS["paper-math"]
    plans = plan_all(w, [Job(f"j{i}", "7B", 0.0, 400, i) for i in range(5)])
    phase = np.concatenate([p.rollout_phase_s() for p in plans])
    assert phase.mean() == pytest.approx(0.55 * 300, rel=0.03)
    busy = np.concatenate([p.rollout_s.ravel() for p in plans])
    assert busy.mean() < phase.mean()  # replicas finish before the slowest one


def test_arrivals_offer_the_configured_load():
    w = PRESETS["paper-math"]
    jobs = generate_jobs(w, 4000, 1)
    span = jobs[-1].arrival - jobs[0].arrival
    demand = sum((w.by_name(j.cls).rollout_gpus + w.by_name(j.cls).train_gpus) * j.steps * w.by_name(j.cls).step_s
                 for j in jobs)
    assert demand / (span * w.gpus) == pytest.approx(w.load, rel=0.08)
    assert arrival_rate(w) > 0


def small_run(seed: int = 0):
    w = dataclasses.replace(PRESETS["paper-math"], gpus=512, steps_min=3, steps_max=6)
    plans = plan_all(w, generate_jobs(w, 12, seed))
    return w, plans, {m: run_mode(m, w, plans) for m in MODES}


def test_every_mode_completes_every_job_and_shared_modes_bill_near_the_floor():
    w, plans, results = small_run()
    floor = sum(p.work_floor_device_s() for p in plans)
    for mode, r in results.items():
        assert set(r.finish) == {p.job.id for p in plans}, mode
        s = summarise(r, plans)
        assert s["device_hours"] * 3600 >= floor * (1 - 1e-9), mode  # nobody beats the floor
        assert s["work_floor_device_hours"] * 3600 == pytest.approx(floor)
        # the provider holds at least what users are billed: a dedicated mode bills its reservations
        # (held = billed); a shared mode holds its WPGs from when they are formed to their release
        assert s["held_device_hours"] >= s["device_hours"] * (1 - 1e-9), mode
        assert s["held_actual_over_peak"] <= s["actual_over_peak"] + 1e-12, mode
    for mode in ("isolated_split", "async_split", "colocated"):
        assert summarise(results[mode], plans)["held_device_hours"] == summarise(results[mode], plans)["device_hours"]
    span = {m: max(r.finish.values()) - min(p.job.arrival for p in plans) for m, r in results.items()}
    for mode in ("plexrl", "plexrl_backfill"):
        held = summarise(results[mode], plans)["held_device_hours"] * 3600
        assert 0 < held <= w.gpus * span[mode]  # never more than the cluster
        assert held > device_seconds(results[mode].usage)  # 12 small jobs leave their WPGs idle at times
    for mode in ("plexrl", "plexrl_backfill"):
        billed = device_seconds(results[mode].usage)
        assert billed == pytest.approx(floor + results[mode].switch_device_s, rel=1e-9)
    assert device_seconds(results["plexrl"].usage) < device_seconds(results["async_split"].usage)


def test_a_job_syncs_through_the_host_tier_only_where_each_rollout_wpg_is_on_one_node():
    """The live engine's rule, per job: with one-node replicas every sync holds the train WPG only
    (and the rollout WPGs reload); with replicas wider than a node every sync is gang, as if asked
    for, whatever the default."""
    w = dataclasses.replace(PRESETS["paper-math"], gpus=512, steps_min=3, steps_max=4)
    plans = plan_all(w, generate_jobs(w, 8, 0))
    steps = sum(p.job.steps for p in plans)
    host = run_mode("plexrl_backfill", w, plans)  # sync="host", the default
    assert host.extra["sync"] == "host"
    assert host.extra["syncs"] == {"host": steps, "gang": 0}
    syncs = [r for r in host.usage if r.fn == "sync_weights"]
    assert len(syncs) == steps  # one WPG each: the train WPG
    # the same jobs with every replica over two nodes (16 devices on nodes of 8)
    wide = dataclasses.replace(w, classes=tuple(dataclasses.replace(c, replica_gpus=16, rollout_gpus=64)
                                                for c in w.classes))
    plans = plan_all(wide, [p.job for p in plans])
    steps = sum(p.job.steps for p in plans)
    ran = {sync: run_mode("plexrl_backfill", wide, plans, admission={"sync": sync}) for sync in ("host", "gang")}
    assert ran["host"].extra["syncs"] == ran["gang"].extra["syncs"] == {"host": 0, "gang": steps}
    same = {"wall_seconds": 0, "events_per_s": 0, "sync": ""}  # all else equal
    assert summarise(ran["host"], plans) | same == summarise(ran["gang"], plans) | same


def test_a_host_tier_sync_profiles_as_training_and_a_gang_sync_on_both_sides():
    """The placer measures what each WPG runs: a host-tier sync runs on the train WPG alone (the
    rollout WPGs' reload is a swap), so it adds to the job's train demand only; a gang sync holds
    both sides."""
    stages = [(CallSpec("generate", "rollout", 4.0, 0), CallSpec("generate", "rollout", 2.0, 1)), 1.0,
              (CallSpec("forward_backward", "train", 2.0),), (CallSpec("sync_weights", "sync", 1.0),)]
    gang, host = step_profile(stages, "gang"), step_profile(stages, "host")
    assert (gang.rollout_s, gang.train_s, gang.both_s, gang.host_s) == ((4.0, 2.0), 2.0, 1.0, 1.0)
    assert (host.rollout_s, host.train_s, host.both_s, host.host_s) == ((4.0, 2.0), 3.0, 0.0, 1.0)
    assert gang.alone_s == host.alone_s == 8.0
    assert measure_demand([host]) == Demand(rollout=3.0 / 8, train=3.0 / 8)
    assert measure_demand([gang]) == Demand(rollout=4.0 / 8, train=3.0 / 8)


def test_same_seed_same_report_and_another_seed_differs():
    def digest(seed):
        _, plans, results = small_run(seed)
        return json.dumps({m: summarise(r, plans) | {"wall_seconds": 0, "events_per_s": 0}
                           for m, r in results.items()}, sort_keys=True)

    assert digest(0) == digest(0)
    assert digest(0) != digest(1)


def test_assign_wpgs_takes_the_least_loaded_and_refuses_overload():
    assert assign_wpgs([0.5, 0.0, 0.2], [0.3, 0.1], 2, 0.4, 0.5, limit=1.0) == ((1, 2), 1)
    assert assign_wpgs([0.7, 0.7], [0.0], 1, 0.4, 0.1, limit=1.0) is None
    assert assign_wpgs([0.0], [0.0], 2, 0.1, 0.1) is None  # fewer WPGs than replicas


# --- user input ------------------------------------------------------------------------------------


def test_csv_trace_loads_and_names_the_bad_line(tmp_path):
    w = PRESETS["paper-math"]
    good = tmp_path / "jobs.csv"
    good.write_text("job,class,arrival_s,steps,seed\nb,32B,10,120,3\na,7B,0,100,1\n")
    jobs = load_jobs_csv(good, w)
    assert [(j.id, j.cls, j.arrival, j.steps, j.seed) for j in jobs] == [("a", "7B", 0.0, 100, 1),
                                                                         ("b", "32B", 10.0, 120, 3)]
    bad = tmp_path / "bad.csv"
    bad.write_text("job,class,arrival_s,steps\na,7B,0,100\nb,13B,0,100\n")
    with pytest.raises(ValueError, match=r"bad.csv:3: class '13B'"):
        load_jobs_csv(bad, w)
    bad.write_text("job,class,steps\na,7B,100\n")
    with pytest.raises(ValueError, match="missing column"):
        load_jobs_csv(bad, w)


@pytest.mark.parametrize(("argv", "message"), [
    (["--workload", "nope"], "unknown preset 'nope'"),
    (["--jobs", "0"], "--jobs: must be >= 1"),
    (["--gpus", "100"], "multiple of a node group"),
    (["--set", "bogus=1"], "expected PARAM=VALUE"),
    (["--set", "load=high"], "not a valid float"),
    (["--set", "arrivals_per_s=often"], "--set arrivals_per_s: 'often' is not a valid float"),
    (["--modes", "plexrl,nope"], "unknown mode(s) nope"),
    (["--plot", "out.pdf"], "must end in .png or .svg"),
    (["--from-bench", "/nonexistent.json"], "--from-bench /nonexistent.json: No such file or directory"),
    (["--admission", "nope=1"], "--admission 'nope=1': expected PARAM=VALUE"),
    (["--admission", "limit=lots"], "--admission limit: 'lots' is not a valid float"),
    (["--admission", "limit=1.6", "--admission", "slowdown_bound=1.5"], "--admission: invalid admission policy"),
    (["--admission", "backfill=maybe"], "--admission backfill: 'maybe' is not a valid bool"),
    (["--admission", "groups_per_domain=0"], "groups_per_domain: must be >= 1"),
    (["--admission", "order=fastest"], "--admission: invalid admission policy: order must be one of arrival, longest"),
    (["--sync", "later"], "invalid choice: 'later'"),
])
def test_cli_bad_input_is_one_line_and_status_2(argv, message):
    p = subprocess.run([sys.executable, "-m", "plexrl", "sim", *argv], cwd=ROOT, capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 2
    assert message in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1
    assert "Traceback" not in p.stderr


def test_cli_runs_a_small_cluster_with_json_and_a_plot(tmp_path):
    plot = tmp_path / "sim.png"
    p = subprocess.run([sys.executable, "-m", "plexrl", "sim", "--gpus", "512", "--jobs", "6", "--set", "steps_min=2",
                        "--set", "steps_max=3", "--json", "--plot", str(plot)], cwd=ROOT, capture_output=True,
                       text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    report = json.loads(p.stdout)
    assert set(report["modes"]) == set(MODES)
    assert set(report["utilisation"]["billed"]) == set(MODES)
    for mode in MODES:
        assert {"device_hours", "held_device_hours", "work_floor_device_hours", "total_completion_s",
                "mean_job_completion_s", "actual_over_peak", "held_actual_over_peak",
                "wall_seconds"} <= set(report["modes"][mode])
    assert report["work_floor_device_hours"] > 0
    assert report["sim_wall_seconds"] > 0
    assert report["parameters"]["steps_max"] == 3
    assert report["parameters"]["gpus"] == 512
    for mode in ("plexrl", "plexrl_backfill"):
        assert report["modes"][mode]["admission"]["slowdown_bound"] == 1.5
        assert report["modes"][mode]["sync"] == "host"  # the default, as the live engine syncs
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# --- predicting a live bench ----------------------------------------------------------------------

BENCH = Path(__file__).parent / "data" / "bench_mux_4x10.json"  # `plexrl bench mux --jobs 4 --steps 10 --json`


def test_from_bench_predicts_the_live_shared_run_within_15_percent():
    from engine.sim.from_bench import load, predict

    bench = load(BENCH)
    result = predict(bench)
    assert result["jobs"] == 4
    assert result["measured"]["shared_device_seconds"] == bench["shared_device_seconds"]
    for key in ("shared_device_seconds", "makespan_s"):
        assert abs(result["error"][key]) <= 0.15, (key, result)


def test_from_bench_uses_only_the_isolated_runs():
    from engine.sim.from_bench import load, predict

    bench = load(BENCH)
    blind = {k: v for k, v in bench.items() if k not in ("shared_device_seconds", "makespan_s", "switches")}
    blind["per_job"] = [{k: v for k, v in e.items() if k in ("job", "spec", "calls", "exec_s", "dedicated_wall_s")}
                        for e in bench["per_job"]]
    blind |= {"shared_device_seconds": 1.0, "makespan_s": 1.0}  # what (b) measured: only compared against
    assert predict(blind)["predicted"] == predict(bench)["predicted"]


@pytest.mark.parametrize("mode", MODES)
def test_a_mode_runs_with_the_cyclic_collector_paused_and_restores_it(mode):
    w = dataclasses.replace(PRESETS["paper-math"], gpus=512, steps_min=2, steps_max=3)
    plans = plan_all(w, generate_jobs(w, 3, 0))
    seen = []
    for before in (True, False):
        (gc.enable if before else gc.disable)()
        try:
            run_mode(mode, w, plans, on_done=lambda: seen.append(gc.isenabled()))
            assert gc.isenabled() is before
        finally:
            gc.enable()
    assert seen
    assert not any(seen)


def cluster_bench(job_demand: float, jobs: int = 8) -> dict:
    """A `plexrl bench cluster --json` output's inputs to the prediction: 3 nodes x 2 slots, ``jobs``
    alike jobs of 2 steps, what their dedicated runs measured."""
    from engine.spec import JobSpec, ServiceConfig

    spec = JobSpec(task="arith", model="tiny-arith", steps=2, seed=0, rollout="torch", trainer="torch").to_dict()
    calls = {"policy/create": {"count": 2, "held_s": 0.2}, "policy/generate": {"count": 4, "held_s": 2.0},
             "policy/forward_backward": {"count": 2, "held_s": 1.0}, "policy/optim_step": {"count": 2, "held_s": 0.2},
             "policy/sync_weights": {"count": 2, "held_s": 0.4}}
    config = dataclasses.asdict(ServiceConfig(devices_per_group=1.0, threads=1, idle_release_s=0.0,
                                              job_demand=job_demand))
    return {"bench": "cluster", "config": config, "group_start_s": 2.0, "driver_start_s": 1.0,
            "nodes": [{"id": f"n{i}", "node_group": f"n{i}", "devices": 2} for i in range(3)],
            "per_job": [{"job": f"job-{i}", "spec": spec, "calls": calls, "dedicated_wall_s": 5.0}
                        for i in range(jobs)],
            "shared_device_seconds": 1.0, "shared_makespan_s": 1.0}


def test_from_bench_replays_a_cluster_bench_through_the_live_placement():
    from engine.sim.from_bench import predict_any

    packed = predict_any(cluster_bench(0.3))["predicted"]
    assert packed["peak_wpgs"] == 4  # four jobs a pair (4 x 0.3 <= 1.3): two pairs
    assert set(packed["per_job_wall_s"]) == {f"job-{i}" for i in range(8)}
    crowded = predict_any(cluster_bench(0.6))["predicted"]
    assert crowded["peak_wpgs"] == 6  # two jobs a pair: the 3 nodes' 6 slots, and 2 jobs wait
    assert set(packed["per_job_queued_s"].values()) == {0.0}
    queued = crowded["per_job_queued_s"]
    assert [queued[f"job-{i}"] for i in range(6)] == [0.0] * 6
    assert min(queued["job-6"], queued["job-7"]) > 5.0  # until a job of the first pairs ended
    alone = predict_any(cluster_bench(0.3, jobs=1))["predicted"]
    # one job: its two groups start at once, then its driver, then its steps run as measured alone
    assert alone["makespan_s"] == pytest.approx(2.0 + 1.0 + 5.0 - 0.2 / 2, rel=0.05)
    assert alone["shared_device_seconds"] == pytest.approx(2 * alone["makespan_s"], rel=1e-6)
    # the fifth job's pair starts as it is placed, while the first pair starts (the service lets go
    # of its lock while groups start), so it starts after one start-up; alone on its pair, it then
    # runs as alone (it waited a second start-up while the service formed one job's groups at a time)
    fifth = predict_any(cluster_bench(0.3, jobs=5))["predicted"]
    assert fifth["per_job_wall_s"]["job-4"] == pytest.approx(2.0 + 1.0 + 5.0 - 0.2 / 2, rel=0.05)


def test_from_bench_starts_a_job_placed_on_starting_groups_once_they_are_up():
    from engine.sim.from_bench import predict_any

    def wall(came: float) -> dict[str, float]:
        bench = cluster_bench(0.3, jobs=2)  # both on one pair, up at 2.0
        bench["per_job"][1]["submitted_s"] = came
        predicted = predict_any(bench)["predicted"]
        assert predicted["peak_wpgs"] == 2
        return predicted["per_job_wall_s"]

    # placed at 1.0 on the pair still starting, the second job starts once it is up, as if it had
    # come then: the same run, its wall a second longer (started as it came, it would have run
    # before the pair was up, alone on it for a second)
    during, up = wall(1.0), wall(2.0)
    assert during["job-1"] == pytest.approx(up["job-1"] + 1.0, abs=1e-9)
    assert during["job-0"] == pytest.approx(up["job-0"], abs=1e-9)


def test_from_bench_replays_each_job_from_when_the_bench_submitted_it():
    from engine.sim.from_bench import predict_any

    bench = cluster_bench(0.3, jobs=1)
    at_once = predict_any(bench)["predicted"]
    bench["per_job"][0]["submitted_s"] = 3.0  # the bench's submissions take time too
    later = predict_any(bench)["predicted"]
    assert later["makespan_s"] == pytest.approx(3.0 + at_once["makespan_s"], rel=1e-9)
    assert later["per_job_queued_s"] == {"job-0": 0.0}  # admitted as it arrived
    assert later["shared_device_seconds"] == pytest.approx(at_once["shared_device_seconds"], rel=1e-9)


def test_from_bench_refuses_a_cluster_bench_without_its_measurements(tmp_path, run_plexrl):
    bench = cluster_bench(0.3)
    del bench["group_start_s"]
    path = tmp_path / "old.json"
    path.write_text(json.dumps(bench))
    done = run_plexrl("sim", "--from-bench", str(path), timeout=120)
    assert done.returncode == 2
    (line,) = done.stderr.strip().splitlines()
    assert "missing group_start_s" in line


def test_cpu_shares_are_each_activity_s_mean_share_of_what_it_wants_over_its_span():
    from engine.sim.from_bench import cpu_shares

    shares = cpu_shares([(0.0, 10.0, 1), (5.0, 15.0, 1), (5.0, 10.0, 1)], 2)
    # the first: alone for 5 s, then one of three on 2 CPUs for 5 s; the third: always one of three
    assert shares == pytest.approx([(5 + 5 * 2 / 3) / 10, (5 * 2 / 3 + 5) / 10, 2 / 3])
    assert cpu_shares([(0.0, 4.0, 1), (4.0, 8.0, 1)], 1) == [1.0, 1.0]  # one after the other
    # two groups starting want two CPUs: with a driver beside them for 2 s, three on two
    assert cpu_shares([(0.0, 4.0, 2), (2.0, 6.0, 1)], 2) == pytest.approx([(2 + 2 * 2 / 3) / 4] * 2)


def cpu_bench(jobs: int, cpus: int | None, *, at_once: bool = False, extra_s: float = 0.0) -> dict:
    """``cluster_bench(0.3, jobs)`` with what the dedicated run saw of each job: its two groups
    starting for 2 s until its placement, its driver for 1 s, then its 5 s; one job after the
    other (or all ``at_once``); the device-seconds the groups held that explain, plus ``extra_s``
    a group after its job's end."""
    out = cluster_bench(0.3, jobs=jobs)
    if cpus is not None:
        out["host_cpus"] = cpus
        for i, e in enumerate(out["per_job"]):
            t = 0.0 if at_once else 20.0 * i
            e["dedicated_placed_s"], e["dedicated_span_s"] = t + 2.0, [t + 3.0, t + 8.0]
        out["dedicated_device_seconds"] = jobs * 2 * (2.0 + 6.0 + extra_s)
    return out


def test_from_bench_shares_the_bench_machine_s_cpus_where_the_output_says_how_many():
    from engine.sim.from_bench import predict_any

    free = predict_any(cpu_bench(8, None))
    assert free["host_cpus"] is None
    # one job alone: the prediction is what its dedicated run measured, however many CPUs (its
    # groups' start-up, measured on one CPU, took twice what it takes with a CPU each)
    for cpus in (1, 2):
        assert predict_any(cpu_bench(1, cpus))["predicted"] == predict_any(cpu_bench(1, None))["predicted"]
    assert predict_any(cpu_bench(1, 1))["group_start_alone_s"] == pytest.approx(1.0)
    # eight jobs on two pairs of groups and one CPU: their start-ups, calls and host stages stretch
    shared = predict_any(cpu_bench(8, 1))
    assert shared["host_cpus"] == 1
    assert shared["predicted"]["makespan_s"] > 1.5 * free["predicted"]["makespan_s"]
    assert shared["predicted"]["shared_device_seconds"] > 1.5 * free["predicted"]["shared_device_seconds"]
    assert predict_any(cpu_bench(8, 64))["predicted"] == free["predicted"]  # more CPUs than anything wants
    # measured while all eight ran at once on one CPU: alone, each takes a fraction of that, so the
    # shared run is predicted faster than from the same times measured one job after the other
    crowded = predict_any(cpu_bench(8, 1, at_once=True))["predicted"]
    assert crowded["makespan_s"] < shared["predicted"]["makespan_s"]
    assert max(crowded["per_job_wall_s"].values()) < max(shared["predicted"]["per_job_wall_s"].values())


def test_work_on_shared_cpus_slows_as_others_start_and_speeds_up_as_they_end():
    """Processor sharing: 2 s of work begun at 0 and 2 s begun at 1, on one CPU, share it from 1 s
    on (the first ends at 3, the second, alone again, at 4); taken at their start (the first alone,
    the second beside it) they would end at 2 and 5. On two CPUs each runs as alone."""
    from engine.sim.simulate import PoolSimulation

    class Probe(PoolSimulation):
        def handle(self, now, kind, data):
            if kind == "begin":
                self.after_cpu(now, 2.0, "end", data)
                return []
            if kind == "end":
                ended[data] = now
                return []
            return super().handle(now, kind, data)

    for cpus, expected in ((1, {"a": 3.0, "b": 4.0}), (2, {"a": 2.0, "b": 3.0})):
        ended: dict[str, float] = {}
        sim = Probe("plexrl", [], admit_load=float("inf"), spread=True, on_done=None, cpus=cpus)
        sim.push(0.0, "begin", "a")
        sim.push(1.0, "begin", "b")
        sim.run([])
        assert ended == pytest.approx(expected)
        assert not sim.cpu_tasks
        assert sim.cpu_wanted == 0


def test_from_bench_counts_each_dedicated_job_s_own_group_start_up():
    """Three jobs whose groups took 2 s to start (the median) and one whose took 6 s (started
    beside others): the device-seconds they held are explained by their own start-ups, with no
    time left between a job's end and its groups' release; taken at the median, 4 s of each of
    that job's two groups would look like it (0.5 s a group, spread over all eight)."""
    from engine.sim.from_bench import predict_any

    bench = cpu_bench(4, 2)
    for e in bench["per_job"]:
        e["dedicated_group_start_s"] = 2.0
    bench["per_job"][0]["dedicated_group_start_s"] = 6.0
    bench["dedicated_device_seconds"] += 2 * 4.0
    assert predict_any(bench)["leave_s"] == pytest.approx(0.0, abs=1e-9)
    for e in bench["per_job"]:
        del e["dedicated_group_start_s"]
    assert predict_any(bench)["leave_s"] == pytest.approx(2 * 4.0 / 8)


def test_from_bench_keeps_a_group_as_long_after_its_jobs_end_as_the_dedicated_run_did():
    from engine.sim.from_bench import predict_any

    prompt, late = predict_any(cpu_bench(1, 2)), predict_any(cpu_bench(1, 2, extra_s=1.5))
    assert prompt["leave_s"] == 0.0
    assert late["leave_s"] == pytest.approx(1.5)
    # the job's two groups held 1.5 s longer each; it ended when it did
    assert late["predicted"]["shared_device_seconds"] == pytest.approx(prompt["predicted"]["shared_device_seconds"]
                                                                       + 2 * 1.5)
    assert late["predicted"]["makespan_s"] == prompt["predicted"]["makespan_s"]
    # a job arriving meanwhile joins the groups the ended job has not yet left (none is formed)
    two = cpu_bench(2, 2, extra_s=1.5)
    two["per_job"][1]["submitted_s"] = prompt["predicted"]["makespan_s"] + 0.5
    joined = predict_any(two)["predicted"]
    assert joined["peak_wpgs"] == 2
    assert joined["per_job_wall_s"]["job-1"] < prompt["predicted"]["per_job_wall_s"]["job-0"]  # no start-up
