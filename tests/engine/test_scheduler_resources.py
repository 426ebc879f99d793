"""The scheduler's resource model and placement: hierarchy, affinity, cyclic horizons, atomic
reservations, micro-shift and start delays. Pure: no Ray, no process, no clock."""

import math
import random
from itertools import pairwise

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.scheduler.resources import (
    Candidate,
    Cluster,
    Horizon,
    Interval,
    JobDemand,
    Load,
    Node,
    NodeGroup,
    Phase,
    ReservationBook,
    Shift,
    WpgSpec,
    can_host,
    demand_from_profile,
    micro_shift,
    start_delay,
)

GiB = 2**30
FAST = settings(max_examples=150, deadline=None)


# --- hierarchy ------------------------------------------------------------------------------------


def test_uniform_cluster_names_and_lookups():
    cluster = Cluster.uniform(groups=2, nodes_per_group=2, devices_per_node=8)
    assert [g.name for g in cluster.groups] == ["g0", "g1"]
    assert [n.name for n in cluster.nodes("g1")] == ["g1n0", "g1n1"]
    assert cluster.devices(node="g0n1")[3] == "g0n1d3"
    assert len(cluster.devices()) == 32
    assert len(cluster.devices("g0")) == 16
    assert cluster.devices("g0")[:9] == (*(f"g0n0d{i}" for i in range(8)), "g0n1d0")
    assert cluster.device("g1n0d5").node == "g1n0"
    assert cluster.node_of("g1n0d5").name == "g1n0"
    assert cluster.group_of("g1n0d5").name == "g1"
    assert cluster.node("g0n1").memory_bytes == 80 * GiB
    assert cluster == Cluster.uniform(groups=2, nodes_per_group=2, devices_per_node=8)  # deterministic
    with pytest.raises(KeyError):
        cluster.node_of("nope")
    with pytest.raises(ValueError, match="not in group"):
        cluster.devices(group="g1", node="g0n0")


def test_cluster_rejects_inconsistent_views():
    with pytest.raises(ValueError, match="belong to group"):
        NodeGroup("a", (Node("n", "b", ("d",)),))
    with pytest.raises(ValueError, match="device 'd' appears twice"):
        Cluster((NodeGroup("a", (Node("n1", "a", ("d",)), Node("n2", "a", ("d",)))),))
    with pytest.raises(ValueError, match="group 'a' appears twice"):
        Cluster((NodeGroup("a", ()), NodeGroup("a", ())))


# --- affinity -------------------------------------------------------------------------------------


def wpg(name="w", backend="torch", tp=1, devices=("d0",), memory=40 * GiB, archs=("qwen2",), max_params=10**10):
    return WpgSpec(name, backend, tp, tuple(devices), memory, frozenset(archs), max_params)


def test_can_host_checks_architecture_size_and_memory():
    w = wpg(tp=2, devices=("d0", "d1"))
    assert can_host(w, "qwen2", 10**10, 80 * GiB)
    assert not can_host(w, "llama", 10**9, GiB)  # architecture
    assert not can_host(w, "qwen2", 10**10 + 1, GiB)  # size
    assert not can_host(w, "qwen2", 10**9, 80 * GiB + 1)  # memory of the two ranks
    # two tp=2 replicas: twice the devices, not twice the room
    assert not can_host(wpg(tp=2, devices=("a", "b", "c", "d")), "qwen2", 1, 80 * GiB + 1)


def test_wpg_spec_validation():
    with pytest.raises(ValueError, match="backend"):
        wpg(backend="jax")
    with pytest.raises(ValueError, match="whole replicas"):
        wpg(tp=2, devices=("d0", "d1", "d2"))
    with pytest.raises(ValueError, match="tp"):
        wpg(tp=0)
    assert wpg(backend="vllm").serves == {"rollout"}
    assert wpg(backend="megatron").serves == {"train"}
    assert wpg(backend="torch").serves == {"rollout", "train"}


# --- horizon: hand-computed -----------------------------------------------------------------------


def test_overflow_and_peak_of_overlapping_jobs():
    h = Horizon(10, 1).place("a", [Interval(0, 4, 1)]).place("b", [Interval(2, 4, 1)])
    # demand: [0,2) 1, [2,4) 2, [4,6) 1, [6,10) 0
    assert h.overflow() == 2.0
    assert h.peak() == 2
    assert h.load() == Load(2.0, 2)
    assert [h.demand(t) for t in (0, 1.9, 2, 3.99, 4, 5.99, 6, 9.99)] == [1, 1, 2, 2, 1, 1, 0, 0]
    assert h.demand(13) == 2
    assert h.demand(-7) == 2
    assert h.jobs == ("a", "b")
    assert Horizon(10, 2, h.placed).overflow() == 0.0


def test_intervals_wrap_around_the_period_end():
    h = Horizon(10, 1).place("a", [Interval(8, 4, 1)]).place("b", [Interval(-9, 2, 2)])
    # a: [8,10) + [0,2); b: offset -9 = 1, [1,3) with 2 devices
    # demand: [0,1) 1, [1,2) 3, [2,3) 2, [3,8) 0, [8,10) 1
    assert h.overflow() == 2 + 1
    assert h.peak() == 3
    assert [h.demand(t) for t in (0.5, 1.5, 2.5, 5, 9.5, 10.5)] == [1, 3, 2, 0, 1, 1]


def test_a_duration_longer_than_the_period_overlaps_itself():
    h = Horizon(10, 1).place("a", [Interval(5, 25, 1)])
    # instances started at 5, -5, -15: two active on [0,5), three on [5,10)
    assert [h.demand(t) for t in (0, 4.9, 5, 9.9)] == [2, 2, 3, 3]
    assert h.overflow() == 5 * 1 + 5 * 2
    assert h.peak() == 3


def test_empty_horizon_and_zero_durations():
    assert Horizon(7, 0).load() == Load(0.0, 0)
    h = Horizon(7, 0).place("a", [Interval(3, 0, 4)])
    assert h.load() == Load(0.0, 0)
    assert h.demand(3) == 0


def test_other_periods_are_fitted_to_the_horizon():
    h = Horizon(10, 5)
    assert h.place("a", [Interval(0, 2, 1)], period_s=5).intervals("a") == (Interval(0, 2, 1), Interval(5, 2, 1))
    # 10/4 = 2.5 rounds to 2 repetitions of 5 s: the pattern is stretched by 1.25
    assert h.place("a", [Interval(0, 2, 1)], period_s=4).intervals("a") == (Interval(0, 2.5, 1), Interval(5, 2.5, 1))
    # a 20 s job on a 10 s horizon: squeezed by half, once
    assert h.place("a", [Interval(4, 6, 1)], period_s=20).intervals("a") == (Interval(2, 3, 1),)
    assert h.place("a", [Interval(4, 6, 1)], period_s=10 + 1e-12).intervals("a") == (Interval(4, 6, 1),)
    with pytest.raises(ValueError, match="repeats"):
        h.place("a", [Interval(0, 0.001, 1)], period_s=0.001)


def test_horizon_validation():
    h = Horizon(10, 1).place("a", [Interval(0, 1, 1)])
    with pytest.raises(ValueError, match="already"):
        h.place("a", [Interval(0, 1, 1)])
    with pytest.raises(KeyError):
        h.remove("b")
    with pytest.raises(ValueError, match="period"):
        Horizon(0, 1)
    with pytest.raises(ValueError, match="capacity"):
        Horizon(1, -1)
    with pytest.raises(ValueError, match="duration"):
        Interval(0, -1, 1)
    with pytest.raises(ValueError, match="device"):
        Interval(0, 1, 0)


# --- horizon: properties --------------------------------------------------------------------------

int_intervals = st.lists(
    st.builds(Interval, st.integers(-20, 20), st.integers(0, 30), st.integers(1, 3)), max_size=6)


@FAST
@given(period=st.integers(1, 12), capacity=st.integers(0, 6), jobs=st.lists(int_intervals, max_size=4))
def test_sweep_matches_brute_force_on_an_integer_grid(period, capacity, jobs):
    h = Horizon(period, capacity)
    for i, intervals in enumerate(jobs):
        h = h.place(f"j{i}", intervals)
    cells = [h.demand(t + 0.5) for t in range(period)]  # integer endpoints: demand is constant per cell
    assert h.overflow() == sum(max(0, c - capacity) for c in cells)
    assert h.peak() == max(cells)
    assert h.overflow() >= 0
    assert Horizon(period, h.peak(), h.placed).overflow() == 0  # never above capacity: no overflow
    total = sum(iv.duration_s * iv.devices for intervals in jobs for iv in intervals)
    assert sum(cells) == total  # laying on the cycle conserves device-seconds


real_intervals = st.lists(
    st.builds(Interval, st.floats(-50, 50), st.floats(0, 40), st.integers(1, 4)), min_size=1, max_size=5)


@FAST
@given(period=st.floats(0.5, 30), capacity=st.integers(0, 8), jobs=st.lists(real_intervals, max_size=3),
       new=real_intervals, new_period=st.one_of(st.none(), st.floats(1, 30)))
def test_placing_then_removing_restores_the_horizon(period, capacity, jobs, new, new_period):
    h = Horizon(period, capacity)
    for i, intervals in enumerate(jobs):
        h = h.place(f"j{i}", intervals)
    before = h.load()
    placed = h.place("new", new, period_s=new_period)
    assert placed.overflow() >= before.overflow - 1e-9
    assert placed.peak() >= before.peak
    assert placed.overflow() >= 0
    restored = placed.remove("new")
    assert restored == h
    assert restored.load() == before


# --- reservations ---------------------------------------------------------------------------------


def small_book():
    return ReservationBook(Cluster.uniform(groups=2, nodes_per_group=2, devices_per_node=4))


def test_reserve_fills_one_node_best_fit_then_by_order():
    book = small_book()
    assert book.reserve("a", 2, 0, 10) == ("g0n0d0", "g0n0d1")
    assert book.reserve("b", 2, 0, 10) == ("g0n0d2", "g0n0d3")  # the fullest node that still fits
    assert book.reserve("c", 3, 0, 10) == ("g0n1d0", "g0n1d1", "g0n1d2")
    assert book.reserve("d", 2, 0, 10) == ("g1n0d0", "g1n0d1")  # g0n1 has one free: does not fit
    assert book.reserve("e", 1, 0, 10) == ("g0n1d3",)  # best fit: the node with one free
    assert book.reserve("f", 1, 5, 15, group="g1") == ("g1n0d2",)


def test_reserve_spans_nodes_of_one_group_before_the_cluster():
    book = small_book()
    assert book.reserve("x", 6, 0, 10) == ("g0n0d0", "g0n0d1", "g0n0d2", "g0n0d3", "g0n1d0", "g0n1d1")
    assert book.reserve("y", 7, 0, 10) == (*(f"g1n0d{i}" for i in range(4)), "g1n1d0", "g1n1d1", "g1n1d2")
    # three free, in two groups: the request spans them, most free node first
    assert book.reserve("z", 3, 0, 10) == ("g0n1d2", "g0n1d3", "g1n1d3")
    assert book.free(0, 10) == ()


def test_reserve_is_all_or_nothing():
    book = small_book()
    book.reserve("a", 3, 0, 10, node="g0n0")
    before = (book.reservations, {d: book.booked(d) for d in book.cluster.devices()})
    assert book.reserve("b", 2, 5, 15, node="g0n0") is None  # one free there
    assert book.reserve("c", 6, 0, 10, group="g0") is None  # five free in the group
    assert book.reserve("d", 14, 9, 10) is None
    assert (book.reservations, {d: book.booked(d) for d in book.cluster.devices()}) == before
    assert book.reserve("b", 2, 10, 20, node="g0n0") == ("g0n0d0", "g0n0d1")  # [0,10) and [10,20) do not overlap


def test_release_and_booked():
    book = small_book()
    book.reserve("late", 1, 20, math.inf, node="g1n1")
    book.reserve("early", 1, 0, 5, node="g1n1")
    assert book.booked("g1n1d0") == [(0, 5, "early"), (20, math.inf, "late")]
    assert book.reserve("mid", 1, 4, 21, node="g1n1") == ("g1n1d1",)
    released = book.release("late")
    assert released.devices == ("g1n1d0",)
    assert released.end == math.inf
    assert book.booked("g1n1d0") == [(0, 5, "early")]
    assert set(book.reservations) == {"early", "mid"}
    with pytest.raises(KeyError):
        book.release("late")


def test_reserve_rejects_bad_input():
    book = small_book()
    book.reserve("a", 1, 0, 1)
    with pytest.raises(ValueError, match=">= 1 device"):
        book.reserve("b", 0, 0, 1)
    with pytest.raises(ValueError, match="end > start"):
        book.reserve("b", 1, 1, 1)
    with pytest.raises(ValueError, match="end > start"):
        book.reserve("b", 1, 0, math.nan)
    with pytest.raises(ValueError, match="already exists"):
        book.reserve("a", 1, 5, 6)
    with pytest.raises(ValueError, match="not in group"):
        book.reserve("b", 1, 0, 1, group="g1", node="g0n0")
    with pytest.raises(KeyError):
        book.reserve("b", 1, 0, 1, group="g9")
    assert set(book.reservations) == {"a"}


reserve_ops = st.tuples(
    st.just("reserve"), st.integers(1, 7), st.integers(0, 10), st.integers(1, 6),
    st.sampled_from([(None, None), ("g0", None), ("g1", None), (None, "g0n1"), ("g1", "g1n0")]))
release_ops = st.tuples(st.just("release"), st.integers(0, 30))


@FAST
@given(ops=st.lists(st.one_of(reserve_ops, release_ops), max_size=30))
def test_random_reservations_never_double_book(ops):
    book = ReservationBook(Cluster.uniform(groups=2, nodes_per_group=2, devices_per_node=3))
    devices = book.cluster.devices()
    for i, op in enumerate(ops):
        before = (book.reservations, {d: book.booked(d) for d in devices})
        if op[0] == "release":
            keys = sorted(book.reservations)
            if keys:
                book.release(keys[op[1] % len(keys)])
            continue
        _, needed, start, length, (group, node) = op
        free = set(book.free(start, start + length, group=group, node=node))
        got = book.reserve(f"r{i}", needed, start, start + length, group=group, node=node)
        if got is None:
            assert len(free) < needed
            assert (book.reservations, {d: book.booked(d) for d in devices}) == before
        else:
            assert len(got) == needed == len(set(got))
            assert set(got) <= free
            assert set(got) <= set(book.cluster.devices(group, node))
        for d in devices:
            booked = book.booked(d)
            assert all(e1 <= s2 for (_, e1, _), (s2, _, _) in pairwise(booked))
            assert {k for *_, k in booked} <= set(book.reservations)


# --- profile -> demand ----------------------------------------------------------------------------


def test_demand_from_profile_takes_median_period_and_typical_phases():
    starts = [0, 10, 21, 30, 40]  # steps of 10, 11, 9, 10 s: median 10
    calls = [("train", -3, -1, 1)]  # warm-up: before the first step
    for s, (r, t) in zip(starts, [(5, 3), (6, 3.5), (4, 2.5), (5, 3)], strict=False):
        calls += [("rollout", s + 0.5, s + 0.5 + r, 2), ("train", s + 1 + r, s + 1 + r + t, 1)]
    calls.append(("train", 39.8, 39.9, 1))  # a checkpoint in the last step: an odd shape
    calls.append(("rollout", 40.5, 45, 2))  # the unfinished step after the last boundary
    period, phases = demand_from_profile(starts, calls)
    assert period == 10
    assert phases == (Phase("rollout", 0.5, 5, 2), Phase("train", 6, 3, 1))


def test_demand_from_profile_validation():
    with pytest.raises(ValueError, match="two step boundaries"):
        demand_from_profile([0], [])
    with pytest.raises(ValueError, match="increasing"):
        demand_from_profile([0, 0], [])
    with pytest.raises(ValueError, match="no calls"):
        demand_from_profile([0, 10], [("train", 11, 12, 1)])
    with pytest.raises(ValueError, match="ends before"):
        demand_from_profile([0, 10], [("train", 2, 1, 1)])


# --- micro-shift ----------------------------------------------------------------------------------


TRAIN_4S = (Phase("train", 0, 4, 1),)


def job(phases=TRAIN_4S, period=10, arch="qwen2", params=10**9, state=GiB, base="qwen2-0.5b",
        name="new"):
    return JobDemand(name, period, tuple(phases), arch, params, state, base)


def group(name, horizons, wpgs=None, base=()):
    return Candidate(name, horizons, tuple(wpgs or [wpg(f"{name}-w")]), frozenset(base))


def test_micro_shift_fills_the_idle_window():
    busy = Horizon(10, 1).place("old", [Interval(0, 4, 1)])
    assert micro_shift(job(), [group("g0", busy)], offset_step_s=1) == Shift("g0", 4, 0.0, 1)
    # a window [4, 8) exactly as long as the job: only offset 4 fits
    tight = busy.place("older", [Interval(8, 2, 1)])
    assert micro_shift(job(), [group("g0", tight)], offset_step_s=0.5) == Shift("g0", 4, 0.0, 1)


def test_micro_shift_minimises_unavoidable_overflow_then_takes_the_smallest_offset():
    busy = Horizon(10, 1).place("old", [Interval(0, 8, 1)])
    # offsets 6, 7 and 8 all overlap 2 s (8 wraps onto [0, 2)); 6 is the smallest
    assert micro_shift(job(), [group("g0", busy)], offset_step_s=1) == Shift("g0", 6, 2.0, 2)


def test_ties_go_to_the_group_holding_the_base_model_then_name():
    a, b = group("a", Horizon(10, 1)), group("b", Horizon(10, 1), base=["qwen2-0.5b"])
    assert micro_shift(job(), [a, b], offset_step_s=1) == Shift("b", 0, 0.0, 1)
    assert micro_shift(job(base="other"), [b, a], offset_step_s=1).group == "a"
    # the base model never outweighs overflow
    busy_b = group("b", Horizon(10, 1).place("old", [Interval(0, 9, 1)]), base=["qwen2-0.5b"])
    assert micro_shift(job(), [a, busy_b], offset_step_s=1).group == "a"
    # ... nor a lower peak
    big = group("big", Horizon(10, 4).place("old", [Interval(0, 10, 2)]), base=["qwen2-0.5b"])
    assert micro_shift(job(), [big, a], offset_step_s=1).group == "a"


@pytest.mark.parametrize("misfit", [{"archs": ("llama",)}, {"max_params": 10**8}, {"memory": GiB // 2},
                                    {"backend": "vllm"}])
def test_affinity_excludes_groups(misfit):
    free_but_unfit = group("a", Horizon(10, 1), wpgs=[wpg("a-w", **misfit)], base=["qwen2-0.5b"])
    busy = group("b", Horizon(10, 1).place("old", [Interval(0, 10, 1)]))
    assert micro_shift(job(), [free_but_unfit, busy], offset_step_s=1).group == "b"
    with pytest.raises(LookupError, match="no node group can host job 'new'"):
        micro_shift(job(), [free_but_unfit], offset_step_s=1)


def test_split_pools_per_phase_kind():
    rollout = Horizon(10, 2).place("old", [Interval(0, 5, 2)])
    train = Horizon(10, 1).place("old", [Interval(5, 5, 1)])
    wpgs = [wpg("r", "vllm", devices=("d0", "d1")), wpg("t", "megatron", devices=("d2",))]
    g = group("g0", {"rollout": rollout, "train": train}, wpgs)
    new = job([Phase("rollout", 0, 5, 2), Phase("train", 5, 5, 1)])
    # offset 5: its rollout takes the idle [5, 10) of the rollout pool, its train the idle [0, 5)
    assert micro_shift(new, [g], offset_step_s=1) == Shift("g0", 5, 0.0, 3)
    assert g.place(new, 0).load() == Load(2 * 5 + 1 * 5, 4)  # offset 0 collides in both pools
    placed = g.place(new, 5)
    assert placed.horizons["rollout"].intervals("new") == (Interval(5, 5, 2),)
    assert placed.horizons["train"].intervals("new") == (Interval(0, 5, 1),)  # 10 wraps to 0
    # a group without a train pool (or without a WPG that trains) cannot host the job
    with pytest.raises(LookupError):
        micro_shift(new, [group("g1", {"rollout": rollout}, wpgs)], offset_step_s=1)
    with pytest.raises(LookupError):
        micro_shift(new, [group("g2", {"rollout": rollout, "train": train}, wpgs[:1])], offset_step_s=1)
    with pytest.raises(ValueError, match="periods differ"):
        group("g3", {"rollout": rollout, "train": Horizon(5, 1)})


def test_reshifting_a_placed_job_ignores_its_old_demand():
    h = Horizon(10, 1).place("new", [Interval(0, 4, 1)])
    assert micro_shift(job(), [group("g0", h)], offset_step_s=1) == Shift("g0", 0, 0.0, 1)


def test_micro_shift_validation():
    with pytest.raises(ValueError, match="offset_step_s"):
        micro_shift(job(), [group("g0", Horizon(10, 1))], offset_step_s=0)
    with pytest.raises(ValueError, match="twice"):
        micro_shift(job(), [group("g0", Horizon(10, 1)), group("g0", Horizon(10, 1))], offset_step_s=1)
    with pytest.raises(ValueError, match="no phases"):
        job(phases=())
    with pytest.raises(ValueError, match="phase kind"):
        Phase("eval", 0, 1, 1)


@FAST
@given(
    loads=st.lists(st.lists(st.tuples(st.integers(0, 11), st.integers(1, 8), st.integers(1, 2)), max_size=3),
                   min_size=1, max_size=3),
    phases=st.lists(st.builds(Phase, st.sampled_from(["rollout", "train"]), st.integers(0, 6), st.integers(1, 5),
                              st.integers(1, 2)), min_size=1, max_size=3),
    bases=st.lists(st.booleans(), min_size=3, max_size=3),
    seed=st.integers(0, 2**16),
)
def test_micro_shift_is_optimal_and_order_independent(loads, phases, bases, seed):
    candidates = []
    for i, intervals in enumerate(loads):
        h = Horizon(12, 2).place("old", [Interval(*iv) for iv in intervals]) if intervals else Horizon(12, 2)
        candidates.append(group(f"g{i}", h, base=["qwen2-0.5b"] if bases[i] else []))
    new = job(phases, period=12)
    shift = micro_shift(new, candidates, offset_step_s=1.5)
    best = min(c.place(new, o).load() for c in candidates for o in [k * 1.5 for k in range(8)])
    assert (shift.overflow, shift.peak) == (best.overflow, best.peak)
    chosen = next(c for c in candidates if c.group == shift.group)
    assert chosen.place(new, shift.offset_s).load() == Load(shift.overflow, shift.peak)
    random.Random(seed).shuffle(candidates)
    assert micro_shift(new, candidates, offset_step_s=1.5) == shift


@FAST
@given(
    others=st.lists(st.tuples(st.sampled_from(["rollout", "train"]), st.floats(0, 20), st.floats(0.1, 30),
                              st.integers(1, 3)), max_size=6),
    phases=st.lists(st.builds(Phase, st.sampled_from(["rollout", "train"]), st.floats(0, 10), st.floats(0.1, 12),
                              st.integers(1, 2)), min_size=1, max_size=3),
    period=st.sampled_from([12.0, 12.0, 5.5, 25.0]),
    split=st.booleans(),
    placed=st.booleans(),
)
def test_loads_over_offsets_equal_placing_at_each_offset(others, phases, period, split, placed):
    """``Candidate.loads`` (the other jobs summed once) gives exactly what laying the job at each
    offset and measuring does, on one pool or one per kind, with the job laid there already or not,
    in its own period or another."""
    def horizon(kinds):
        h = Horizon(12.0, 2)
        for i, (kind, offset, duration, devices) in enumerate(others):
            if kind in kinds:
                h = h.place(f"o{i}", [Interval(offset, duration, devices)])
        if placed:
            h = h.place("new", [Interval(1.0, 3.0, 1)])
        return h

    both = horizon({"rollout", "train"})
    c = group("g0", {"rollout": horizon({"rollout"}), "train": horizon({"train"})} if split else both)
    new = job(phases, period=period)
    offsets = [k * period / 7 for k in range(7)]
    assert c.loads(new, offsets) == [c.place(new, o).load() for o in offsets]


# --- start delays ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("now", "max_delay", "expected"),
    [
        (111, 5, 2),  # grid ... 103, 113, ...: 2 s early, wait
        (113, 5, 0),  # on the grid
        (104, 5, 0),  # 1 s late: the next slot is 9 s away, more than allowed, so run now
        (104, 9, 9),
        (95, 10, 8),  # before the anchor: the grid extends back (93, 103)
        (102.5, 0.5, 0.5),  # exactly the allowed delay
        (102.5, 0.4, 0),
        (111, 0, 0),
    ],
)
def test_start_delay(now, max_delay, expected):
    assert start_delay(now, anchor=100, period_s=10, offset_s=3, max_delay_s=max_delay) == pytest.approx(expected)


def test_start_delay_validation():
    with pytest.raises(ValueError, match="period"):
        start_delay(0, 0, 0, 0, 1)
    with pytest.raises(ValueError, match="max_delay"):
        start_delay(0, 0, 1, 0, -1)


@FAST
@given(now=st.floats(-1e4, 1e4), anchor=st.floats(-1e4, 1e4), period=st.floats(0.1, 100), offset=st.floats(0, 100),
       max_delay=st.floats(0, 50))
def test_start_delay_is_bounded_and_lands_on_the_grid(now, anchor, period, offset, max_delay):
    delay = start_delay(now, anchor, period, offset, max_delay)
    assert 0 <= delay <= max_delay
    assert delay < period
    if delay > 0:
        k = (now + delay - anchor - offset) / period
        assert abs(k - round(k)) * period < 1e-6
