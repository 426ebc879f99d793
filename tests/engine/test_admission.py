"""Placement and admission (``engine.scheduler.admission``): hand-checked decisions, and properties of
simulated runs (no device booked twice, the slowdown bound, every job finishes, no head-of-line
blocking), and the simulator deciding exactly what the placer alone decides."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.scheduler.admission import (
    AdmissionPolicy,
    Demand,
    Domain,
    JobShape,
    Placement,
    Placer,
    StepProfile,
    measure_demand,
)
from engine.sim.simulate import ClusterSimulation, cluster_domains, summarise, workload_costs, workload_job
from engine.sim.workload import ModelClass, Shares, Workload, generate_jobs, plan_all

SMALL = JobShape("a", replicas=2, rollout_devices=1, train_devices=2)
HALF = Demand(0.5, 0.5)


def placer(nodes: int = 1, node_devices: int = 8, domains: int = 1, **policy) -> Placer:
    return Placer([Domain(f"d{i}", nodes, node_devices) for i in range(domains)], AdmissionPolicy(**policy))


def step(rollout=(2.0, 2.0), train=3.0, both=1.0, host=1.0) -> StepProfile:
    return StepProfile(tuple(rollout), train, both, host)


# --- the pieces -----------------------------------------------------------------------------------


def test_a_domain_plans_small_wpgs_on_the_fullest_node_and_large_ones_on_whole_nodes():
    d = Domain("d", 3, 8)
    d.take([(0, i) for i in range(5)])  # node 0 has 3 free
    assert d.plan([2]) == [((0, 5), (0, 6))]  # the fullest node that holds it
    assert d.plan([16]) == [tuple((n, i) for n in (1, 2) for i in range(8))]
    assert d.plan([16, 4]) is None  # two whole nodes, then 4 more: only 3 are left
    assert d.free_devices() == 19  # planning takes nothing


def test_measured_demand_is_busy_time_over_the_step_time_alone():
    # alone: slowest replica 4 + host 1 + train 3 + sync 1 = 9 s; replicas busy 3 s on average
    demand = measure_demand([step(rollout=(2.0, 4.0))])
    assert demand.rollout == pytest.approx((3.0 + 1.0) / 9.0)
    assert demand.train == pytest.approx((3.0 + 1.0) / 9.0)
    with pytest.raises(ValueError, match="at least one step"):
        measure_demand([])


def test_a_policy_refuses_nonsense():
    for bad in ({"limit": 0}, {"slowdown_bound": 0.9}, {"limit": 1.6, "slowdown_bound": 1.5},
                {"margin": 0.6, "slowdown_bound": 1.0}, {"urgent_factor": 0.5}, {"profile_steps": -1},
                {"max_passed": -1}):
        with pytest.raises(ValueError, match="invalid admission policy"):
            AdmissionPolicy(**bad)


# --- admission ------------------------------------------------------------------------------------


def test_a_job_alone_gets_fresh_wpgs_and_releases_them_when_it_ends():
    p = placer()
    p.arrive("j", SMALL, HALF, 0.0)
    [placed] = p.admit(0.0)
    assert len(placed.formed) == 3
    assert not placed.moved
    assert p.held_devices() == 4
    assert p.domains["d0"].free_devices() == 4
    released = p.finish("j")
    assert {s.name for s in released} == {*placed.rollout, placed.train}
    assert p.held_devices() == 0
    assert p.domains["d0"].free_devices() == 8


def test_jobs_share_wpgs_within_the_limit_and_wait_beyond_it():
    p = placer(node_devices=4, limit=1.0)  # room for one job's fresh WPGs only
    for name in ("a", "b", "c"):
        p.arrive(name, SMALL, HALF, 0.0)
    placed = {x.job: x for x in p.admit(0.0)}
    assert set(placed) == {"a", "b"}  # b joins a's WPGs: 0.5 + 0.5 = 1.0
    assert placed["b"].rollout == placed["a"].rollout
    assert placed["b"].train == placed["a"].train
    assert p.waiting == ["c"]
    assert p.finish("a") == []  # b still uses them
    [c] = p.admit(1.0)
    assert c.job == "c"
    assert c.train == placed["a"].train


def test_a_job_that_can_never_fit_is_refused_and_holds_nobody_back():
    p = placer(node_devices=4)
    with pytest.raises(ValueError, match="no domain can hold it"):
        p.arrive("huge", JobShape("a", 4, 1, 4), HALF, 0.0)
    p.arrive("ok", SMALL, HALF, 0.0)
    assert [x.job for x in p.admit(0.0)] == ["ok"]


def test_backfill_lets_a_job_that_fits_pass_one_that_does_not_fit_now():
    big = JobShape("b", 2, 2, 4)  # 8 devices: waits while "first" holds 4
    for backfill, expect in ((True, ["first", "small"]), (False, ["first"])):
        p = placer(node_devices=8, backfill=backfill)
        p.arrive("first", SMALL, Demand(0.9, 0.9), 0.0)
        p.admit(0.0)
        p.arrive("big", big, HALF, 1.0)
        p.arrive("small", SMALL, Demand(0.9, 0.9), 2.0)
        assert ["first"] + [x.job for x in p.admit(2.0)] == expect


def test_a_job_passed_too_often_reserves_a_domain_that_then_takes_nobody_else():
    p = placer(node_devices=8, domains=2, max_passed=1)
    tiny, busy = JobShape("t", 1, 1, 1), Demand(0.9, 0.9)  # 2 devices, shares with nobody
    for i in range(8):
        p.arrive(f"f{i}", tiny, busy, 0.0)
    assert [x.domain for x in p.admit(0.0)] == ["d0"] * 4 + ["d1"] * 4
    p.arrive("big", JobShape("b", 1, 4, 4), HALF, 1.0)  # needs a whole domain
    for i in range(3):
        p.arrive(f"s{i}", tiny, busy, 1.0)
    assert p.admit(1.0) == []
    p.finish("f0")
    assert [x.job for x in p.admit(2.0)] == ["s0"]  # passes big once
    p.finish("f1")
    assert [x.job for x in p.admit(3.0)] == ["s1"]  # passes it twice: big reserves d0 (most free)
    assert p.reserved == {"d0": "big"}
    p.finish("f2")
    assert p.admit(4.0) == []  # s2 would fit in d0, which is kept for big
    for name in ("f3", "s0", "s1"):
        p.finish(name)
    assert [x.job for x in p.admit(5.0)] == ["big"]  # d0 drained: big takes all of it
    assert p.reserved == {}


def test_the_longest_expected_work_starts_first_unless_the_policy_says_arrival_order():
    one = Demand(0.9, 0.9)  # shares with nobody; the node holds one such job at a time
    for order, expect in (("longest", ["long", "short"]), ("arrival", ["short", "long"])):
        p = placer(node_devices=4, order=order)
        p.arrive("first", SMALL, one, 0.0)
        p.admit(0.0)
        p.arrive("short", SMALL, one, 1.0, work=100.0)
        p.arrive("long", SMALL, one, 2.0, work=1000.0)
        assert p.queue() == expect
        started = []
        for now, done in ((3.0, "first"), (4.0, None)):
            p.finish(done or started[-1])
            started += [x.job for x in p.admit(now)]
        assert started == expect


def test_a_job_that_waited_longer_than_the_extra_work_of_a_later_one_ranks_before_it():
    p = placer(node_devices=4)
    p.arrive("old-short", SMALL, Demand(0.9, 0.9), 0.0, work=100.0)  # ranks at 0 - 100
    p.arrive("new-long", SMALL, Demand(0.9, 0.9), 500.0, work=550.0)  # 500 - 550: after it
    p.arrive("newer-longer", SMALL, Demand(0.9, 0.9), 500.0, work=700.0)  # 500 - 700: before it
    assert p.queue() == ["newer-longer", "old-short", "new-long"]


def test_a_job_ranked_first_that_fits_nowhere_is_passed_and_then_reserves_a_domain():
    p = placer(node_devices=8, domains=2, max_passed=1)
    tiny, busy = JobShape("t", 1, 1, 1), Demand(0.9, 0.9)
    for i in range(8):
        p.arrive(f"f{i}", tiny, busy, 0.0)
    p.admit(0.0)
    p.arrive("short", tiny, busy, 1.0, work=10.0)
    p.arrive("shorter", tiny, busy, 1.0, work=5.0)
    p.arrive("long", JobShape("b", 1, 4, 4), HALF, 2.0, work=1e6)  # arrived last, ranks first; needs a domain
    p.finish("f0")
    assert [x.job for x in p.admit(3.0)] == ["short"]  # fits: passes long once
    p.finish("f1")
    assert [x.job for x in p.admit(4.0)] == ["shorter"]  # twice: long reserves d0
    assert p.reserved == {"d0": "long"}


def test_expected_work_and_the_order_are_checked():
    p = placer()
    for bad in (-1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="expected work"):
            p.arrive(f"j{bad}", SMALL, HALF, 0.0, work=bad)
    assert not p.waiting
    with pytest.raises(ValueError, match="invalid admission policy"):
        AdmissionPolicy(order="shortest")


def test_after_profiling_a_lone_job_moves_onto_fuller_wpgs_while_jobs_wait():
    p = placer(node_devices=8, limit=1.0, profile_steps=1)
    p.arrive("a", SMALL, HALF, 0.0)
    p.admit(0.0)
    p.arrive("b", SMALL, Demand(0.9, 0.9), 0.0)  # declared high: fresh WPGs beside a's
    [b] = p.admit(0.0)
    assert b.train != p.placement("a").train
    p.arrive("c", JobShape("c", 1, 1, 2), HALF, 1.0)  # waits: no device is free
    assert p.admit(1.0) == []
    # b measures 0.4 / 0.4: it fits beside a (0.5 + 0.4); the move releases its own WPGs
    progress = p.step_done("b", step(rollout=(3.0, 3.0), train=3.0, both=1.0, host=3.0), 10.0)
    moved = progress.move
    assert moved is not None
    assert moved.moved
    assert moved.train == p.placement("a").train
    assert len(moved.released) == 3
    assert p.demand("b") == measure_demand([step(rollout=(3.0, 3.0), train=3.0, both=1.0, host=3.0)])
    assert [x.job for x in p.admit(10.0)] == ["c"]


@pytest.mark.parametrize("gather", [True, False])
def test_a_job_that_cannot_move_whole_moves_the_side_it_is_alone_on(gather):
    """x and y share their rollout WPGs, over the limit (measured above what they declared), so y
    cannot move whole; alone on its train WPG, it moves that side only, releasing room for z."""
    p = placer(node_devices=6, limit=1.0, gather=gather)
    shape = JobShape("a", replicas=2, rollout_devices=1, train_devices=2)
    for name, kind, size in (("r1", "rollout", 1), ("r2", "rollout", 1), ("t1", "train", 2), ("t2", "train", 2)):
        p.restore(name, "d0", kind, "a", 0, size)
    p.seat("x", shape, Demand(0.6, 0.3), ["r1", "r2"], "t1", 0.0)
    p.seat("y", shape, Demand(0.6, 0.3), ["r1", "r2"], "t2", 0.0)
    p.arrive("z", JobShape("a", 1, 1, 2), Demand(0.3, 0.3), 1.0)
    assert p.admit(1.0) == []  # no device is free, and no rollout WPG has room
    move = p.step_done("y", step(), 2.0).move
    if not gather:
        assert move is None
        assert p.admit(2.0) == []
        return
    assert move is not None
    assert (move.rollout, move.train, move.formed, move.moved) == (("r1", "r2"), "t1", (), True)
    assert [s.name for s in move.released] == ["t2"]
    assert p.slots["t1"].jobs == {"x": 0.3, "y": 0.3}
    [z] = p.admit(2.0)
    assert z.train == "t1"
    assert len(z.formed) == 1  # a fresh rollout WPG on a device t2 gave back


def test_a_move_onto_other_nodes_waits_for_the_train_state_to_cross():
    """The simulator charges a move whose train WPG lies on other nodes the state's trip through
    storage, within a domain as across domains (here the cluster is one domain)."""
    import engine.sim.simulate as sim

    w = small_workload(64, 0.2)
    drawn = generate_jobs(w, 24, 5)
    plans = plan_all(w, drawn)
    results = {}
    for cost in (0.0, 1e4):
        costs = dataclasses.replace(workload_costs(w), migrate_s={c.name: cost for c in w.classes})
        placer = Placer(cluster_domains(w, groups_per_domain=8), AdmissionPolicy(profile_steps=1))
        assert len(placer.domains) == 1
        run = sim.ClusterSimulation("plexrl_backfill", costs, placer, sync="host")
        results[cost] = (run.run([workload_job(w, x) for x in plans]), run)
    (free, free_run), (slow, slow_run) = results[0.0], results[1e4]
    assert slow_run.migrations > 0
    assert free_run.migrations > 0
    moved = [j for j in free.finish if slow.finish[j] - slow.start[j] >= 1e4]
    assert len(moved) >= 1


def test_a_job_behind_its_slowdown_bound_becomes_urgent_and_recovers():
    p = placer(slowdown_bound=1.5, margin=0.1, profile_steps=0)
    p.arrive("j", SMALL, HALF, 0.0)
    p.admit(0.0)
    nine = step(rollout=(4.0, 4.0))  # 9 s alone
    assert p.step_done("j", nine, 10.0).urgent is None  # 9 s alone in 10 s: pace 1.11
    assert p.step_done("j", nine, 25.2).urgent is True  # 18 s alone in 25.2: pace 1.4
    assert p.is_urgent("j")
    assert p.step_done("j", nine, 36.0).urgent is None  # 27 in 36: 1.33, not yet under 1.3
    assert p.step_done("j", nine, 40.0).urgent is False  # 36 in 40: 1.11
    assert not p.is_urgent("j")


# --- properties of simulated runs -----------------------------------------------------------------

CLASSES = (
    ModelClass("s", 1.0, 0.6, 2, 2, 40.0, replica_gpus=1, train_mp=2),
    ModelClass("m", 4.0, 0.3, 4, 4, 60.0, replica_gpus=2, train_mp=4),
    ModelClass("l", 8.0, 0.1, 8, 8, 90.0, replica_gpus=4, train_mp=8),
)


def small_workload(gpus: int, arrivals_per_s: float) -> Workload:
    return Workload("small", CLASSES, Shares(), gpus=gpus, node_gpus=4, group_nodes=2, steps_min=3, steps_max=9,
                    samples_per_step=64, batch_slots=16, arrivals_per_s=arrivals_per_s)


class CheckedPlacer(Placer):
    """A placer that checks its invariants after every decision and records what it was asked and
    what it answered (to replay through a plain placer)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.log: list[tuple[str, tuple, object]] = []

    def _record(self, op: str, args: tuple, out):
        self.log.append((op, args, _plain(out)))  # as it was then: WPGs change later
        self.check()
        return out

    def arrive(self, *args):
        return self._record("arrive", args, super().arrive(*args))

    def admit(self, now):
        out = super().admit(now)
        for job in self.waiting:  # no head-of-line blocking: nobody left waiting fits anywhere now
            j = self.jobs[job]
            assert self._best(j, j.demand, pack=False) is None, f"{job} fits but waits"
        return self._record("admit", (now,), out)

    def step_done(self, *args):
        return self._record("step_done", args, super().step_done(*args))

    def finish(self, job):
        return self._record("finish", (job,), super().finish(job))

    def check(self):
        seen: set[tuple[str, int, int]] = set()
        for slot in self.slots.values():
            mine = {(slot.domain, n, d) for n, d in slot.devices}
            assert not mine & seen, f"{slot.name} shares devices with another WPG"
            seen |= mine
            assert slot.jobs, f"{slot.name} is empty but not released"
        for domain in self.domains.values():
            free = {(domain.name, n, d) for n, f in enumerate(domain.free) for d in f}
            assert not free & seen, "a device is both free and in a WPG"
            assert len(free) + sum(1 for x in seen if x[0] == domain.name) == domain.devices


def simulate(w: Workload, jobs, policy: AdmissionPolicy, sync: str = "gang"):
    plans = plan_all(w, jobs)
    p = CheckedPlacer(cluster_domains(w), policy)
    sim = ClusterSimulation("plexrl_backfill", workload_costs(w), p, sync=sync)
    result = sim.run([workload_job(w, x) for x in plans])
    return p, result, plans


@settings(max_examples=12, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10_000), jobs=st.integers(4, 24), rate=st.sampled_from([0.002, 0.02, 0.2]),
       bound=st.sampled_from([1.3, 1.5, 2.0]), limit=st.sampled_from([1.0, 1.3]),
       sync=st.sampled_from(["gang", "host"]))
def test_simulated_runs_keep_the_placement_invariants(seed, jobs, rate, bound, limit, sync):
    w = small_workload(64, rate)
    drawn = generate_jobs(w, jobs, seed)
    p, result, plans = simulate(w, drawn, AdmissionPolicy(limit=limit, slowdown_bound=bound, profile_steps=1), sync)
    assert set(result.finish) == {j.id for j in drawn}  # every job was admitted and finished
    assert p.held_devices() == 0
    assert not p.slots
    for plan in plans:  # the bound, give or take one step's worth
        steps = plan.rollout_phase_s() + plan.reward_s + plan.logprob_s + plan.train_s + plan.sync_s
        ran = result.finish[plan.job.id] - result.start[plan.job.id]
        assert ran <= bound * steps.sum() + steps.max() + 1e-6, (plan.job.id, ran / steps.sum())


def test_the_simulator_decides_exactly_what_the_placer_decides():
    """Replaying the recorded arrivals, step profiles and ends through a fresh placer gives the
    same placements, moves and urgencies: the simulator has no admission logic of its own."""
    w = small_workload(64, 0.05)
    p, _, _ = simulate(w, generate_jobs(w, 20, 3), AdmissionPolicy(profile_steps=1))
    fresh = Placer(cluster_domains(w), p.policy)
    for op, args, out in p.log:
        got = getattr(fresh, op)(*args)
        assert _plain(got) == out, (op, args)
    assert sum(len(out) for op, _, out in p.log if op == "admit") == 20


def test_the_simulator_tells_the_placer_each_jobs_expected_work():
    from engine.sim.workload import isolated_step_mean_s

    w = small_workload(64, 0.05)
    drawn = generate_jobs(w, 6, 4)
    p, _, plans = simulate(w, drawn, AdmissionPolicy(profile_steps=1))
    expected = {x.job.id: len(x.sync_s) * isolated_step_mean_s(w, x.cls) for x in plans}
    told = {args[0]: args[4] for op, args, _ in p.log if op == "arrive"}
    assert told == pytest.approx(expected)
    assert len(set(told.values())) > 1


def _plain(value):
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, Placement):
        return dataclasses.asdict(value)
    if dataclasses.is_dataclass(value):
        return dataclasses.asdict(value)
    return value


def test_a_job_alone_holds_its_fresh_wpgs_from_admission_to_its_end():
    w = small_workload(64, 0.05)
    [job] = generate_jobs(w, 1, 2)
    _, result, plans = simulate(w, [job], AdmissionPolicy())
    c = plans[0].cls
    devices = c.rollout_gpus + c.train_gpus  # one fresh WPG per replica and a train WPG
    assert result.held_device_s == pytest.approx(devices * (result.finish[job.id] - result.start[job.id]))


def test_the_shared_mode_reports_held_hours_and_moves():
    w = small_workload(64, 0.05)
    drawn = generate_jobs(w, 12, 1)
    _, result, plans = simulate(w, drawn, AdmissionPolicy())
    s = summarise(result, plans)
    assert s["held_device_hours"] >= s["device_hours"] * 0.99  # held includes every call, and idle time
    assert s["work_floor_device_hours"] > 0


def test_a_switch_costs_its_read_at_the_measured_swap_efficiency():
    from engine.sim.simulate import switch_s

    w = small_workload(64, 0.05)
    c = CLASSES[1]  # 4B parameters, train WPG of 4 devices
    assert switch_s(w, c, "train", 4) == pytest.approx(14 * 4.0 / 4 / (25.0 * 0.87))  # no write-back on the path
    assert switch_s(w, c, "rollout", 2) == pytest.approx(2 * 4.0 / 2 / (25.0 * 0.87))
    with pytest.raises(ValueError, match="swap_efficiency"):
        dataclasses.replace(w, swap_efficiency=0.0)


def test_prefetch_hints_hide_part_of_the_switches():
    # one state per WPG: two jobs sharing WPGs swap at every change; the scheduler's prefetch hint
    # starts the next job's swap behind the running call, so switches cost less than their reads
    w = dataclasses.replace(small_workload(64, 1.0), gpus=4, group_nodes=1, gpu_memory_gb=1e-6, h2d_gb_s=0.05)
    jobs = [dataclasses.replace(j, cls="s") for j in generate_jobs(w, 2, 4)]
    _, result, _ = simulate(w, jobs, AdmissionPolicy(limit=1.5, slowdown_bound=3.0))
    assert result.switches > 4
    from engine.sim.simulate import switch_s

    full = switch_s(w, CLASSES[0], "rollout", 1)
    setups = [u.setup_s for u in result.usage if u.fn == "generate" and u.setup_s > 0]
    assert full in setups  # a swap nobody announced costs its whole read
    assert any(0 < x < full - 1e-6 for x in setups)  # announced ones overlapped the call before them
