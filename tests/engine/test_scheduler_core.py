"""The scheduler's pure runtime core (engine.scheduler.core): HRRS order, the starvation guard,
paused jobs, multi-WPG calls, prefetch hints and residency.

Part A: small cases computed by hand. Part B: properties checked with hypothesis on random
workloads driven through the pure ``Scheduler`` by a tiny discrete-event loop (virtual clock,
``decide`` after every event). No Ray, no threads, no wall clock.
"""

from __future__ import annotations

import heapq
import itertools
from collections import defaultdict
from dataclasses import dataclass, field

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.accounting.metering import UsageRecord, device_seconds
from engine.scheduler.core import (
    EXEC_FLOOR_S,
    STEP,
    Call,
    Dispatch,
    ExecEstimates,
    Policy,
    Prefetch,
    Scheduler,
    Wpg,
    hrrs_ratio,
)

FAR = 1e9  # a max_wait_s no test reaches: the starvation guard stays out of the way


def scheduler(*wpgs: str | tuple[str, int], policy: Policy | None = None) -> Scheduler:
    """A scheduler over ``wpgs``: names, or (name, capacity) pairs."""
    s = Scheduler(policy or Policy(max_wait_s=FAR))
    for w in wpgs:
        name, capacity = (w, 0) if isinstance(w, str) else w
        s.add_wpg(name, capacity=capacity)
    return s


def started(decisions) -> list[int]:
    return [d.call.id for d in decisions if isinstance(d, Dispatch)]


def hints(decisions) -> list[Prefetch]:
    return [d for d in decisions if isinstance(d, Prefetch)]


def run_one(s: Scheduler, job: str, wpg: str, now: float, *, role: str = "actor", fn: str = "generate") -> Call:
    """Submit a call, check it starts at once, complete it one second later."""
    call = s.submit(job, role, fn, (wpg,), now)
    assert call.id in started(s.decide(now))
    s.complete(call.id, now + 1.0)
    return call


# =================================================================================================
# A. Hand-computed cases
# =================================================================================================


def test_hrrs_ratio_values():
    assert hrrs_ratio(3.0, 1.0, 0.0) == 4.0  # (3 + 1) / 1
    assert hrrs_ratio(3.0, 1.0, 1.0) == 2.5  # (3 + 1 + 1) / (1 + 1)
    assert hrrs_ratio(3.0, 1.0, 1.0, weight=2.0) == 5.0
    assert hrrs_ratio(3.0, 1.0, 0.0, weight=2.0) == 8.0
    assert hrrs_ratio(0.0, 2.0, 0.5) == 1.0  # nothing waited: the ratio is the weight
    # exec + setup below the floor counts as the floor (no division by ~0)
    floored = (1.0 + EXEC_FLOOR_S) / EXEC_FLOOR_S
    assert hrrs_ratio(1.0, 0.0, 0.0) == pytest.approx(floored)
    assert hrrs_ratio(1.0, EXEC_FLOOR_S / 4, EXEC_FLOOR_S / 4) == pytest.approx(floored)
    assert hrrs_ratio(1.0, -5.0, 0.0) == pytest.approx(floored)


def test_long_waiting_call_beats_fresh_short_one():
    s = scheduler("w")
    s.estimates.observe("old", "f", 4.0)
    s.estimates.observe("new", "f", 1.0)
    blocker = s.submit("blocker", "actor", "f", ("w",), 0.0)
    assert started(s.decide(0.0)) == [blocker.id]
    old = s.submit("old", "actor", "f", ("w",), 0.0)
    new = s.submit("new", "actor", "f", ("w",), 19.0)
    assert s.decide(19.0) == []
    s.complete(blocker.id, 20.0)
    # old: (20 + 4) / 4 = 6; new: (1 + 1) / 1 = 2 -> the longer call goes first because it waited
    assert s.ratio(old, 20.0) == pytest.approx(6.0)
    assert s.ratio(new, 20.0) == pytest.approx(2.0)
    assert started(s.decide(20.0)) == [old.id]


def test_short_call_beats_long_one_at_equal_wait():
    s = scheduler("w")
    s.estimates.observe("long", "f", 4.0)
    s.estimates.observe("short", "f", 1.0)
    blocker = s.submit("blocker", "actor", "f", ("w",), 0.0)
    s.decide(0.0)
    long_ = s.submit("long", "actor", "f", ("w",), 0.0)  # older id: FIFO would pick it
    short = s.submit("short", "actor", "f", ("w",), 0.0)
    s.complete(blocker.id, 2.0)
    assert s.ratio(long_, 2.0) == pytest.approx(1.5)  # (2 + 4) / 4
    assert s.ratio(short, 2.0) == pytest.approx(3.0)  # (2 + 1) / 1
    assert started(s.decide(2.0)) == [short.id]
    s.complete(short.id, 3.0)
    assert started(s.decide(3.0)) == [long_.id]


def test_resident_call_goes_first_at_equal_wait_and_exec():
    s = scheduler(("w", 1))
    first = s.submit("res", "actor", "f", ("w",), 0.0)
    assert started(s.decide(0.0)) == [first.id]  # "res" becomes resident on w
    cold = s.submit("cold", "actor", "f", ("w",), 0.5)  # submitted first: older id
    warm = s.submit("res", "actor", "f", ("w",), 0.5)
    s.complete(first.id, 1.0)  # no exec_s: both calls are estimated at the policy default
    assert s.estimates.get("cold", "f") == s.estimates.get("res", "f") == Policy().default_exec_s
    assert s.setup_estimate(warm) == (0, ())
    assert s.setup_estimate(cold) == (Policy().default_setup_s, ("w",))
    assert s.ratio(warm, 1.0) > s.ratio(cold, 1.0)
    decisions = s.decide(1.0)
    assert started(decisions) == [warm.id]
    assert decisions[0].setup_s == 0
    assert decisions[0].switches == ()
    s.complete(warm.id, 2.0)
    decisions = s.decide(2.0)
    assert started(decisions) == [cold.id]
    assert decisions[0].setup_s == Policy().default_setup_s
    assert decisions[0].switches == ("w",)


def test_equal_ratio_goes_to_fewer_switches_then_older_call():
    s = scheduler(("w", 1))
    run_one(s, "res", "w", 0.0)
    s.set_switch_cost(("cold", "actor"), "w", 0.0)  # a free switch: equal ratios
    cold = s.submit("cold", "actor", "f", ("w",), 5.0)
    warm = s.submit("res", "actor", "f", ("w",), 5.0)
    assert s.ratio(cold, 6.0) == s.ratio(warm, 6.0)
    assert started(s.decide(6.0)) == [warm.id]  # fewer switches beats the older id
    # with neither resident, equal ratios go to the older call
    s2 = scheduler("w")
    a = s2.submit("a", "actor", "f", ("w",), 0.0)
    b = s2.submit("b", "actor", "f", ("w",), 0.0)
    assert started(s2.decide(1.0)) == [a.id]
    assert b.id in s2.queue


def test_with_an_idle_partner_factor_the_call_whose_jobs_other_wpgs_idle_goes_first():
    def first(factor: float) -> str:
        s = scheduler("train", "r-a", "r-b", policy=Policy(max_wait_s=FAR, idle_partner_factor=factor))
        s.set_partners("a", ("r-a", "train"))
        s.set_partners("b", ("r-b", "train"))
        busy = s.submit("other", "actor", "generate", ("r-b",), 0.0)  # b's rollout WPG is busy
        assert started(s.decide(0.0)) == [busy.id]
        s.submit("a", "actor", "forward_backward", ("train",), 1.0)  # a's rollout WPG idles
        s.submit("b", "actor", "forward_backward", ("train",), 0.5)  # older: the higher ratio
        return next(d.call.job for d in s.decide(2.0) if isinstance(d, Dispatch))

    assert first(1.0) == "b"
    assert first(10.0) == "a"


def test_tenant_weight_changes_the_order():
    def first_started(weight: float | None) -> str:
        s = scheduler("w")
        if weight is not None:
            s.set_weight("gold", weight)
        s.submit("a", "actor", "f", ("w",), 0.0, tenant="plain")
        s.submit("b", "actor", "f", ("w",), 0.0, tenant="gold")
        (dispatch,) = s.decide(2.0)[:1]
        return dispatch.call.job

    assert first_started(None) == "a"  # equal ratios: the older call
    assert first_started(3.0) == "b"
    assert first_started(0.5) == "a"
    s = scheduler("w")
    with pytest.raises(ValueError, match="weight"):
        s.set_weight("t", 0.0)
    with pytest.raises(ValueError, match="weight"):
        s.set_weight("t", -1.0)


def test_weight_trades_against_wait():
    # weight 2 on a fresh call against weight 1 on one that waited: 2 * (1 + 1) / 1 = 4 < (4 + 1) / 1
    s = scheduler("w")
    s.set_weight("gold", 2.0)
    s.estimates.observe("plain", "f", 1.0)
    s.estimates.observe("gold", "f", 1.0)
    blocker = s.submit("blocker", "actor", "f", ("w",), 0.0)
    s.decide(0.0)
    plain = s.submit("plain", "actor", "f", ("w",), 0.0)
    gold = s.submit("gold", "actor", "f", ("w",), 3.0, tenant="gold")
    s.complete(blocker.id, 4.0)
    assert s.ratio(plain, 4.0) == pytest.approx(5.0)
    assert s.ratio(gold, 4.0) == pytest.approx(4.0)
    assert started(s.decide(4.0)) == [plain.id]


def test_exec_estimates_ema_and_fallbacks():
    e = ExecEstimates(alpha=0.3, default_s=0.5)
    assert e.get("j", "f") == 0.5  # nobody ran f: the default
    e.observe("j", "f", 2.0)
    assert e.get("j", "f") == 2.0  # the first measurement is taken as is
    e.observe("j", "f", 1.0)
    assert e.get("j", "f") == pytest.approx(0.7 * 2.0 + 0.3 * 1.0)  # 1.7
    e.observe("j", "f", 4.0)
    assert e.get("j", "f") == pytest.approx(0.7 * 1.7 + 0.3 * 4.0)  # 2.39
    assert e.get("k", "f") == pytest.approx(2.39)  # k never ran f: other jobs' mean
    e.observe("m", "f", 1.0)
    assert e.get("k", "f") == pytest.approx((2.39 + 1.0) / 2)
    assert e.get("k", "g") == 0.5  # nobody ran g
    assert e.known("j") == {"f": pytest.approx(2.39)}
    e.observe("z", "h", 0.0)
    assert e.get("z", "h") == EXEC_FLOOR_S  # floored
    e.forget("j")
    assert e.known("j") == {}
    assert e.get("j", "f") == pytest.approx(1.0)  # only m's estimate is left


def test_scheduler_feeds_measured_exec_into_the_estimate():
    s = scheduler("w", policy=Policy(max_wait_s=FAR, ema_alpha=0.3, default_exec_s=0.5))
    assert s.estimates.get("j", "f") == 0.5
    for now, exec_s in ((0.0, 2.0), (10.0, 1.0)):
        call = s.submit("j", "actor", "f", ("w",), now)
        s.decide(now)
        s.complete(call.id, now + 5.0, exec_s=exec_s)  # exec_s, not the 5 s span, is measured
    assert s.estimates.get("j", "f") == pytest.approx(1.7)
    call = s.submit("j", "actor", "f", ("w",), 20.0)
    s.decide(20.0)
    s.complete(call.id, 21.0)  # no exec_s: the estimate is left alone
    assert s.estimates.get("j", "f") == pytest.approx(1.7)
    assert s.estimates.get("other", "f") == pytest.approx(1.7)
    s.forget("j")
    assert s.estimates.get("other", "f") == 0.5


def test_a_jobs_calls_run_in_submission_order_one_at_a_time():
    s = scheduler("w1", "w2")
    s.estimates.observe("j", "slow", 10.0)
    s.estimates.observe("j", "fast", 0.1)
    first = s.submit("j", "actor", "slow", ("w1",), 0.0)
    second = s.submit("j", "actor", "fast", ("w2",), 0.0)  # its WPG is free and its ratio higher
    assert [c.id for c in s.eligible()] == [first.id]
    assert started(s.decide(0.0)) == [first.id]
    assert s.eligible() == []
    assert started(s.decide(5.0)) == []
    assert s.wpgs["w2"].running is None
    s.complete(first.id, 10.0)
    assert [c.id for c in s.eligible()] == [second.id]
    assert started(s.decide(10.0)) == [second.id]
    with pytest.raises(ValueError, match="still has calls"):
        s.forget("j")


def test_stream_calls_run_in_seq_order_whatever_their_arrival():
    s = scheduler("w1", "w2")
    late = s.submit("j", "actor", "f", ("w1",), 0.0, seq=1)  # overtook call 0 on the way
    assert s.eligible() == []
    assert s.decide(0.0) == []
    early = s.submit("j", "actor", "f", ("w2",), 0.5, seq=0)
    assert started(s.decide(0.5)) == [early.id]
    assert started(s.decide(0.7)) == []
    nxt = s.submit("j", "actor", "f", ("w1",), 0.8)  # no seq: after the highest one submitted
    assert nxt.seq == 2
    s.complete(early.id, 1.0)
    assert started(s.decide(1.0)) == [late.id]
    with pytest.raises(ValueError, match="already submitted"):
        s.submit("j", "actor", "f", ("w1",), 1.5, seq=1)  # pending
    with pytest.raises(ValueError, match="already submitted"):
        s.submit("j", "actor", "f", ("w1",), 1.5, seq=0)  # done
    s.complete(late.id, 2.0)
    assert started(s.decide(2.0)) == [nxt.id]
    s.complete(nxt.id, 3.0)


def test_rejected_submit_leaves_nothing_behind():
    # a stale duplicate after the stream drained: rejected, and the job can still be forgotten
    s = scheduler("w")
    run_one(s, "j", "w", 0.0)
    with pytest.raises(ValueError, match="already submitted"):
        s.submit("j", "actor", "f", ("w",), 2.0, seq=0)
    assert s.eligible() == []
    s.forget("j")
    again = s.submit("j", "actor", "f", ("w",), 3.0)  # a forgotten job's name starts over
    assert again.seq == 0


def test_submit_rejects_bad_wpg_lists():
    s = scheduler("a", "b")
    with pytest.raises(ValueError, match="distinct"):
        s.submit("j", "actor", "f", (), 0.0)
    with pytest.raises(ValueError, match="distinct"):
        s.submit("j", "actor", "f", ("a", "a"), 0.0)
    with pytest.raises(KeyError):
        s.submit("j", "actor", "f", ("a", "nope"), 0.0)
    assert s.queue == {}


def test_queued_time_counts_from_when_a_call_could_run():
    s = Scheduler(Policy(max_wait_s=FAR))
    s.add_wpg("w")
    first = s.submit("a", "actor", "f", ("w",), 0.0, stream="s", seq=0)
    second = s.submit("a", "actor", "g", ("w",), 1.9, stream="s", seq=1)  # behind its own first call
    other = s.submit("b", "actor", "f", ("w",), 0.0)
    assert started(s.decide(0.0)) == [first.id]
    [done] = s.complete(first.id, 2.0, exec_s=2.0)
    assert done.queued_s == 0.0
    assert started(s.decide(2.0)) == [other.id]  # older: goes first; "second" is ready from 2.0
    s.complete(other.id, 5.0, exec_s=3.0)
    assert started(s.decide(5.0)) == [second.id]
    [rec] = s.complete(second.id, 6.0, exec_s=1.0)
    assert rec.queued_s == 3.0  # waited 2.0 -> 5.0 for the WPG, not 1.9 -> 2.0 for its own stream


def test_multi_wpg_call_needs_all_its_wpgs_and_meters_each():
    s = Scheduler(Policy(max_wait_s=FAR))
    s.add_wpg("rollout", devices=4.0)
    s.add_wpg("train", devices=2.0)
    gen = s.submit("x", "actor", "generate", ("rollout",), 0.0)
    assert started(s.decide(0.0)) == [gen.id]
    sync = s.submit("y", "actor", "sync_weights", ("rollout", "train"), 1.0, tenant="t")
    assert started(s.decide(1.0)) == []  # train is free, rollout is not: nothing is taken
    assert s.wpgs["train"].running is None
    step = s.submit("z", "actor", "train_step", ("train",), 2.0)
    assert started(s.decide(2.0)) == [step.id]  # not overdue: the free WPG is used meanwhile
    s.complete(gen.id, 3.0)
    assert started(s.decide(3.0)) == []  # rollout free now, train busy
    assert s.wpgs["rollout"].running is None
    s.complete(step.id, 4.0)
    decisions = s.decide(4.0)
    assert started(decisions) == [sync.id]
    assert decisions[0].at == 4.0
    assert s.wpgs["rollout"].running == s.wpgs["train"].running == sync.id
    records = s.complete(sync.id, 7.0, exec_s=2.75, setup_s=0.25)
    assert records == [
        # ready at 1.0, started at 4.0: it queued 3 s for its WPGs
        UsageRecord(job="y", role="actor", fn="sync_weights", wpg="rollout", devices=4.0, start=4.0, end=7.0,
                    setup_s=0.25, exec_s=2.75, call=sync.id, tenant="t", queued_s=3.0),
        UsageRecord(job="y", role="actor", fn="sync_weights", wpg="train", devices=2.0, start=4.0, end=7.0,
                    setup_s=0.25, exec_s=2.75, call=sync.id, tenant="t", queued_s=3.0),
    ]
    assert device_seconds(records) == 4.0 * 3 + 2.0 * 3
    assert s.wpgs["rollout"].running is None
    assert s.wpgs["train"].running is None
    assert s.running == {}
    assert s.queue == {}


def test_paused_job_stays_queued_and_runs_after_resume():
    s = scheduler("w")
    s.pause("p")
    held = s.submit("p", "actor", "f", ("w",), 0.0)
    assert s.decide(0.0) == []
    assert s.eligible() == []
    other = s.submit("o", "actor", "f", ("w",), 1.0)
    assert started(s.decide(1.0)) == [other.id]  # the paused call does not hold the WPG
    s.complete(other.id, 2.0)
    for now in (2.0, 50.0, 1e6):  # however long it waits, and overdue or not
        assert s.decide(now) == []
        assert held.id in s.queue
    s.resume("p")
    assert started(s.decide(1e6 + 1)) == [held.id]


def test_pause_keeps_a_running_call_running():
    s = scheduler("w")
    a1 = s.submit("a", "actor", "f", ("w",), 0.0)
    a2 = s.submit("a", "actor", "f", ("w",), 0.0)
    s.decide(0.0)
    s.pause("a")
    assert s.running.keys() == {a1.id}
    s.complete(a1.id, 1.0)  # completes normally; the next call waits for the resume
    assert s.decide(1.0) == []
    assert a2.id in s.queue
    s.resume("a")
    s.resume("never-paused")  # harmless
    assert started(s.decide(2.0)) == [a2.id]


def test_overdue_call_goes_before_higher_ratio_calls():
    def order(max_wait_s: float) -> list[str]:
        s = scheduler("w", policy=Policy(max_wait_s=max_wait_s))
        s.estimates.observe("slow", "f", 10.0)
        s.estimates.observe("quick", "f", 0.1)
        blocker = s.submit("blocker", "actor", "f", ("w",), 0.0)
        s.decide(0.0)
        slow = s.submit("slow", "actor", "f", ("w",), 0.0)
        quick = s.submit("quick", "actor", "f", ("w",), 9.0)
        s.complete(blocker.id, 10.0)
        assert s.ratio(slow, 10.0) == pytest.approx(2.0)  # (10 + 10) / 10
        assert s.ratio(quick, 10.0) == pytest.approx(11.0)  # (1 + 0.1) / 0.1
        (first,) = started(s.decide(10.0))
        return [first]

    assert order(max_wait_s=100.0) == [3]  # quick (id 3): HRRS
    assert order(max_wait_s=10.0) == [2]  # slow (id 2) has waited max_wait_s: overdue first


def test_overdue_calls_go_oldest_first_whatever_their_ratio():
    s = scheduler("w", policy=Policy(max_wait_s=5.0))
    s.estimates.observe("a", "f", 10.0)
    s.estimates.observe("b", "f", 0.01)
    blocker = s.submit("blocker", "actor", "f", ("w",), 0.0)
    s.decide(0.0)
    a = s.submit("a", "actor", "f", ("w",), 0.0)
    b = s.submit("b", "actor", "f", ("w",), 1.0)
    s.complete(blocker.id, 20.0)
    assert s.ratio(b, 20.0) > s.ratio(a, 20.0)
    assert started(s.decide(20.0)) == [a.id]


def test_overdue_multi_wpg_call_holds_the_wpgs_it_waits_for():
    s = scheduler("a", "b", policy=Policy(max_wait_s=5.0))
    x = s.submit("x", "actor", "generate", ("a",), 0.0)
    s.decide(0.0)
    sync = s.submit("s", "actor", "sync_weights", ("a", "b"), 0.0)
    y = s.submit("y", "actor", "generate", ("b",), 1.0)
    assert started(s.decide(1.0)) == [y.id]  # sync not overdue yet: b is backfilled
    s.complete(y.id, 2.0)
    assert s.decide(2.0) == []
    z = s.submit("z", "actor", "generate", ("b",), 6.0)
    assert s.decide(6.0) == []  # sync waited 6 >= 5: b is held for it although it is free
    assert s.wpgs["b"].running is None
    assert z.id in s.queue
    s.complete(x.id, 7.0)
    assert started(s.decide(7.0)) == [sync.id]  # gets both at once, z still waits
    s.complete(sync.id, 8.0)
    assert started(s.decide(8.0)) == [z.id]


def test_overdue_call_that_is_not_eligible_holds_nothing():
    """The guard holds WPGs only for overdue calls that are eligible. A job's second call waits for
    its first; meanwhile a younger call may take a WPG the second call needs, and an overdue call
    behind that second one then also waits for the younger call. This is why the bound of the
    property test below allows 2 * dmax per older call when jobs keep several calls queued:
    here C (submitted at 0, one call queued before it, dmax 10, max_wait 1) waits 29.9 s, more than
    max_wait + (1 + 1) * dmax = 21 s, within max_wait + 2 * (1 + 1) * dmax = 41 s."""
    s = scheduler("a", "b", policy=Policy(max_wait_s=1.0))
    p = s.submit("j1", "actor", "f", ("a",), 0.0)
    assert started(s.decide(0.0)) == [p.id]
    o = s.submit("j1", "actor", "g", ("a", "b"), 0.0)  # waits for p (same job)
    c = s.submit("j2", "actor", "f", ("a",), 0.0)
    assert s.decide(0.0) == []
    y = s.submit("j3", "actor", "f", ("b",), 9.9)
    assert started(s.decide(9.9)) == [y.id]  # o is not eligible: b is not held for it
    s.complete(p.id, 10.0)
    assert s.decide(10.0) == []  # o is overdue now and holds a (free) while it waits for b
    s.complete(y.id, 19.9)
    assert started(s.decide(19.9)) == [o.id]
    s.complete(o.id, 29.9)
    assert started(s.decide(29.9)) == [c.id]


def test_prefetch_hint_for_the_next_call_when_not_resident():
    s = scheduler(("w", 1))
    a = s.submit("a", "actor", "f", ("w",), 0.0)
    b = s.submit("b", "actor", "f", ("w",), 0.0)
    decisions = s.decide(0.0)
    assert decisions == [Dispatch(a, 0.0, Policy().default_setup_s, ("w",)), Prefetch("w", ("b", "actor"))]
    s.complete(a.id, 1.0)
    assert s.decide(1.0) == [Dispatch(b, 1.0, Policy().default_setup_s, ("w",), queued_s=1.0)]  # no one left: no hint


def test_no_prefetch_hint_when_the_next_call_is_resident():
    # With capacity 1 the next call on the WPG is never resident (the dispatched deployment just
    # took the only slot and a job's own next call is not eligible yet), so capacity 2 it is.
    s = scheduler(("w", 2))
    run_one(s, "b", "w", 0.0)
    a = s.submit("a", "actor", "f", ("w",), 5.0)
    b = s.submit("b", "actor", "f", ("w",), 5.0)
    s.estimates.observe("a", "f", 0.01)  # a's much higher ratio puts it first despite its switch
    s.estimates.observe("b", "f", 5.0)
    assert s.ratio(a, 6.0) > s.ratio(b, 6.0)
    decisions = s.decide(6.0)
    assert started(decisions) == [a.id]
    assert hints(decisions) == []  # b, next on w, is resident
    assert b.id in s.queue
    # and a capacity-0 WPG holds everything: never a hint
    s0 = scheduler("w")
    s0.submit("a", "actor", "f", ("w",), 0.0)
    s0.submit("b", "actor", "f", ("w",), 0.0)
    assert hints(s0.decide(0.0)) == []


def test_prefetch_only_for_wpgs_that_just_got_work():
    s = scheduler(("w", 1), ("v", 1))
    busy = s.submit("busy", "actor", "f", ("v",), 0.0)
    s.decide(0.0)
    a = s.submit("a", "actor", "f", ("w",), 1.0)
    s.submit("b", "actor", "f", ("v",), 1.0)  # next on v, but v got no work now
    decisions = s.decide(1.0)
    assert started(decisions) == [a.id]
    assert hints(decisions) == []
    assert busy.id in s.running


def test_residency_lru_eviction_with_capacity_two():
    s = scheduler(("w", 2))
    w = s.wpgs["w"]
    run_one(s, "a", "w", 0.0)
    run_one(s, "b", "w", 2.0)
    assert list(w.resident) == [("a", "actor"), ("b", "actor")]
    run_one(s, "a", "w", 4.0)  # a becomes most recently used
    assert list(w.resident) == [("b", "actor"), ("a", "actor")]
    c = run_one(s, "c", "w", 6.0)  # full: b, the least recently used, leaves
    assert list(w.resident) == [("a", "actor"), ("c", "actor")]
    assert not w.is_resident(("b", "actor"))
    nxt = s.submit("b", "actor", "f", ("w",), 8.0)
    assert s.setup_estimate(nxt) == (Policy().default_setup_s, ("w",))
    s.decide(8.0)
    assert list(w.resident) == [("c", "actor"), ("b", "actor")]
    s.complete(nxt.id, 9.0)
    s.evicted("w", ("b", "actor"))  # dropped outside a call
    s.evicted("w", ("nobody", "actor"))  # harmless
    assert list(w.resident) == [("c", "actor")]
    assert c.deployment == ("c", "actor")
    # another role of the same job is another deployment
    run_one(s, "c", "w", 10.0, role="ref")
    assert list(w.resident) == [("c", "actor"), ("c", "ref")]


def test_wpg_touch_and_unbounded_capacity():
    w = Wpg("w", capacity=1)
    w.touch(("a", "r"))
    w.touch(("b", "r"))
    assert list(w.resident) == [("b", "r")]
    unbounded = Wpg("u")
    for job in "abcde":
        unbounded.touch((job, "r"))
    assert len(unbounded.resident) == 5
    assert unbounded.is_resident(("never", "r"))


def test_switch_costs_per_wpg_are_summed_and_forgotten():
    s = scheduler(("a", 1), ("b", 1))
    s.set_switch_cost(("j", "actor"), "a", 2.0)
    s.set_switch_cost(["j", "actor"], "b", -1.0)  # clipped at 0; a list deployment works too
    call = s.submit("j", "actor", "sync_weights", ("a", "b"), 0.0)
    assert s.setup_estimate(call) == (2.0, ("a", "b"))
    (dispatch,) = s.decide(0.0)
    assert dispatch.setup_s == 2.0
    assert dispatch.switches == ("a", "b")
    s.complete(call.id, 1.0)
    s.forget("j")
    assert s.switch_costs == {}


# =================================================================================================
# B. Properties on random workloads
# =================================================================================================

Q = 0.25  # time quantum of generated workloads: sums of quarters are exact floats, and ties happen
ROLES = ("actor", "ref")
FNS = ("generate", "train_step", "sync_weights")
PROPERTY_SETTINGS = settings(max_examples=150, deadline=None, database=None,
                             suppress_health_check=[HealthCheck.too_slow])


@dataclass(frozen=True)
class CallPlan:
    role: str
    fn: str
    wpgs: tuple[str, ...]
    duration: int  # quanta the call really occupies its WPGs, in [dmin, dmax]
    gap: int  # quanta from the job's previous submission (open loop) or completion (closed loop)


@dataclass(frozen=True)
class JobPlan:
    name: str
    tenant: str
    start: int  # quanta
    calls: tuple[CallPlan, ...]
    toggles: tuple[int, ...] = ()  # times (quanta) of pause, resume, pause, ...


@dataclass(frozen=True)
class Scenario:
    wpgs: tuple[tuple[str, int, float], ...]  # name, capacity, devices
    jobs: tuple[JobPlan, ...]
    closed_loop: bool  # a job submits its next call when the previous one completed
    dmin: int
    dmax: int
    max_wait: int  # quanta
    default_exec_s: float
    default_setup_s: float
    weights: tuple[tuple[str, float], ...]
    switch_costs: tuple[tuple[str, str, str, float], ...]  # job, role, wpg, seconds

    def policy(self) -> Policy:
        return Policy(max_wait_s=self.max_wait * Q, default_exec_s=self.default_exec_s,
                      default_setup_s=self.default_setup_s)


@st.composite
def scenarios(draw, *, pauses: bool = True) -> Scenario:
    names = [f"w{i}" for i in range(draw(st.integers(1, 3)))]
    wpgs = tuple((n, draw(st.integers(0, 2)), draw(st.sampled_from((1.0, 2.0, 8.0)))) for n in names)
    dmin = draw(st.integers(1, 8))
    dmax = draw(st.integers(dmin, dmin + 24))
    jobs: list[JobPlan] = []
    n_jobs = draw(st.integers(1, 5))
    # lockstep: every job runs job0's plan from the same start (as identical RL recipes do), which
    # makes equal ratios, and so the tie-breaks, common
    lockstep = draw(st.booleans())
    for j in range(n_jobs):
        toggles: tuple[int, ...] = ()
        if pauses and draw(st.booleans()):
            horizon = 6 * n_jobs * dmax
            toggles = tuple(sorted(draw(st.sets(st.integers(0, horizon), min_size=1, max_size=4))))
        if lockstep and jobs:
            jobs.append(JobPlan(f"job{j}", jobs[0].tenant, jobs[0].start, jobs[0].calls, toggles))
            continue
        calls = []
        for _ in range(draw(st.integers(1, 6))):
            width = draw(st.integers(1, min(2, len(names))))
            calls.append(CallPlan(
                role=draw(st.sampled_from(ROLES)),
                fn=draw(st.sampled_from(FNS)),
                wpgs=tuple(draw(st.permutations(names))[:width]),
                duration=draw(st.integers(dmin, dmax)),
                gap=draw(st.integers(0, 2 * dmax)),
            ))
        jobs.append(JobPlan(f"job{j}", draw(st.sampled_from(("", "t1", "t2"))), draw(st.integers(0, 4 * dmax)),
                            tuple(calls), toggles))
    switch_costs = tuple(
        (draw(st.sampled_from([j.name for j in jobs])), draw(st.sampled_from(ROLES)), draw(st.sampled_from(names)),
         draw(st.sampled_from((0.0, 0.1, 1.0, 5.0))))
        for _ in range(draw(st.integers(0, 3)))
    )
    return Scenario(
        wpgs=wpgs,
        jobs=tuple(jobs),
        closed_loop=draw(st.booleans()),
        dmin=dmin,
        dmax=dmax,
        max_wait=draw(st.integers(0, 6 * dmax)),
        default_exec_s=draw(st.sampled_from((0.1, 0.5, 2.0))),
        default_setup_s=draw(st.sampled_from((0.0, 0.05, 1.0))),
        weights=tuple((t, draw(st.sampled_from((0.5, 1.0, 3.0)))) for t in ("t1", "t2")),
        switch_costs=switch_costs,
    )


@dataclass
class Trace:
    """What happened in one run of the event loop; the tests check it."""

    scheduler: Scheduler
    decisions: list[tuple[float, Dispatch | Prefetch]] = field(default_factory=list)
    records: list[UsageRecord] = field(default_factory=list)
    calls: dict[int, Call] = field(default_factory=dict)
    queued_before: dict[int, int] = field(default_factory=dict)  # calls submitted, not dispatched
    dispatched: dict[int, float] = field(default_factory=dict)
    completed: dict[int, float] = field(default_factory=dict)
    paused_at_dispatch: dict[int, frozenset[str]] = field(default_factory=dict)
    toggles: list[tuple[float, str, bool]] = field(default_factory=list)  # (time, job, paused)
    conflicts: list[tuple[float, int, str]] = field(default_factory=list)  # dispatch onto a busy WPG
    mismatches: list[float] = field(default_factory=list)  # the scheduler's WPG state is not ours
    overtaken: list[tuple[float, int, int]] = field(default_factory=list)  # (time, overdue call, younger)
    end_paused: frozenset[str] = frozenset()


COMPLETE, TOGGLE, SUBMIT = 0, 1, 2  # at equal times: completions, then pause/resume, then submissions


def simulate(sc: Scenario, *, drain: bool = False, scheduler: type[Scheduler] = Scheduler) -> Trace:
    """Drive a fresh Scheduler through ``sc`` on a virtual clock, ``decide`` after every event.

    Events at equal times go completions first, then pause/resume, then submissions, each kind in
    the order it was scheduled (a global sequence number): fully deterministic. A dispatched call
    completes at dispatch time + its duration. ``drain``: when no event is left, resume the jobs
    still paused and run on until everything completed."""
    s = scheduler(sc.policy())
    for name, capacity, devices in sc.wpgs:
        s.add_wpg(name, devices=devices, capacity=capacity)
    for tenant, weight in sc.weights:
        s.set_weight(tenant, weight)
    for job, role, wpg, seconds in sc.switch_costs:
        s.set_switch_cost((job, role), wpg, seconds)
    plans = {j.name: j for j in sc.jobs}
    trace = Trace(s)
    events: list[tuple[float, int, int, object]] = []
    seq = itertools.count()

    def push(at: float, kind: int, payload: object) -> None:
        heapq.heappush(events, (at, kind, next(seq), payload))

    for job in sc.jobs:
        if sc.closed_loop:
            push((job.start + job.calls[0].gap) * Q, SUBMIT, (job.name, 0))
        else:
            at = job.start
            for i, call in enumerate(job.calls):
                at += call.gap
                push(at * Q, SUBMIT, (job.name, i))
        for i, at in enumerate(job.toggles):
            push(at * Q, TOGGLE, (job.name, i % 2 == 0))

    index: dict[int, tuple[str, int]] = {}  # call id -> (job, index in its plan)
    dispatches: dict[int, Dispatch] = {}
    paused: set[str] = set()
    undispatched: set[int] = set()
    occupied: dict[str, int] = {}  # our own model: WPG -> running call id
    now = 0.0
    while events or (drain and paused):
        if not events:
            for job in sorted(paused):
                push(now, TOGGLE, (job, False))
            continue
        now, kind, _, payload = heapq.heappop(events)
        if kind == COMPLETE:
            call_id = payload
            job, i = index[call_id]
            plan = plans[job].calls[i]
            setup = min(dispatches[call_id].setup_s, plan.duration * Q)
            trace.records += s.complete(call_id, now, exec_s=plan.duration * Q - setup, setup_s=setup)
            trace.completed[call_id] = now
            for w in trace.calls[call_id].wpgs:
                del occupied[w]
            if sc.closed_loop and i + 1 < len(plans[job].calls):
                push(now + plans[job].calls[i + 1].gap * Q, SUBMIT, (job, i + 1))
        elif kind == TOGGLE:
            job, pause = payload
            if pause:
                s.pause(job)
                paused.add(job)
            else:
                s.resume(job)
                paused.discard(job)
            trace.toggles.append((now, job, pause))
        else:
            job, i = payload
            plan = plans[job].calls[i]
            queued = len(undispatched)
            call = s.submit(job, plan.role, plan.fn, plan.wpgs, now, tenant=plans[job].tenant)
            index[call.id] = (job, i)
            trace.calls[call.id] = call
            trace.queued_before[call.id] = queued
            undispatched.add(call.id)
        overdue = [c for c in s.eligible() if now - c.submitted >= s.policy.max_wait_s]
        decisions = s.decide(now)
        for o in overdue:  # left waiting: no younger call may have taken a WPG it needs
            if o.id in s.queue:
                trace.overtaken += [(now, o.id, d.call.id) for d in decisions if isinstance(d, Dispatch)
                                    and d.call.id > o.id and set(d.call.wpgs) & set(o.wpgs)]
        for decision in decisions:
            trace.decisions.append((now, decision))
            if not isinstance(decision, Dispatch):
                continue
            call = decision.call
            dispatches[call.id] = decision
            trace.dispatched[call.id] = now
            trace.paused_at_dispatch[call.id] = frozenset(paused)
            undispatched.discard(call.id)
            for w in call.wpgs:
                if w in occupied:
                    trace.conflicts.append((now, call.id, w))
                occupied[w] = call.id
            job, i = index[call.id]
            push(now + plans[job].calls[i].duration * Q, COMPLETE, call.id)
        if {n: w.running for n, w in s.wpgs.items()} != {n: occupied.get(n) for n in s.wpgs}:
            trace.mismatches.append(now)
    trace.end_paused = frozenset(paused)
    return trace


def paused_seconds(trace: Trace, job: str, t0: float, t1: float) -> float:
    """How long ``job`` was paused within [t0, t1]."""
    total, since = 0.0, None
    for at, who, pause in trace.toggles:
        if who != job:
            continue
        if pause and since is None:
            since = at
        elif not pause and since is not None:
            total += max(0.0, min(at, t1) - max(since, t0))
            since = None
    if since is not None:
        total += max(0.0, t1 - max(since, t0))
    return total


@PROPERTY_SETTINGS
@given(scenarios())
def test_bounded_wait(sc: Scenario):
    """Every call of a job not paused at the end starts, and every call that starts does so within

        max_wait + c * (1 + k + E) * dmax

    of its submission, not counting the time its job was paused, where k: calls queued (submitted,
    not started) when it was submitted; E: pause/resume events (of any job) while it waited; c = 1
    when every job has one call outstanding at a time (closed loop), c = 2 when jobs queue several
    calls (open loop).

    Derivation. Let C be the call, T0 = submitted + max_wait (C is overdue from then on) and S the
    k calls queued before C. From T0 on, call the *owner* the oldest call of S + {C} that has not
    started and whose job is not paused (there is one whenever C's job is not paused). The owner
    is overdue (it is not younger than C), and every older call not started yet is in S, so no
    eligible call sorts before it: once eligible, the owner is first in line and the WPGs it needs
    are held for it, so only the calls running at that moment stand in its way, each ending within
    dmax, and then it starts. Closed loop: the owner is eligible at once, so each owner's turn
    lasts at most dmax. Open loop: the owner may first wait for its own job's previous call, which
    has started (else that older call would be the owner) and ends within dmax; younger calls may
    take the owner's WPGs meanwhile, so a turn lasts at most 2 dmax (the hand-made case in
    test_overdue_call_that_is_not_eligible_holds_nothing needs that 2). The owner changes when it
    starts (at most k + 1 times, C's own start being the last) or at a pause/resume (at most E
    times: a resumed older call can take the lead and hand it back later, one more turn).
    The closed-loop bound is tight: random runs reach it exactly.

    Pauses: a paused job's call may wait any time by design, so the time C's job was paused is
    left out (measuring only never-paused jobs would leave resumed jobs unchecked). Its pauses and
    resumes, and other jobs', start new turns, hence E: a resumed call finds its WPGs taken by
    calls that started while it was paused. Without pause/resume events during a call's wait (most
    calls) the bound is the plain one.
    """
    trace = simulate(sc)
    dmax, max_wait = sc.dmax * Q, sc.max_wait * Q
    c = 1 if sc.closed_loop else 2
    for call_id, call in trace.calls.items():
        if call_id not in trace.dispatched:
            assert call.job in trace.end_paused, f"call {call_id} of {call.job} never started"
            continue
        start = trace.dispatched[call_id]
        wait = start - call.submitted - paused_seconds(trace, call.job, call.submitted, start)
        e = sum(1 for at, _, _ in trace.toggles if call.submitted < at <= start)
        bound = max_wait + c * (1 + trace.queued_before[call_id] + e) * dmax
        assert wait <= bound + 1e-9, (call, start, wait, bound)


@PROPERTY_SETTINGS
@given(scenarios())
def test_overdue_call_is_never_overtaken_on_the_wpgs_it_waits_for(sc: Scenario):
    """The mechanism behind the bound: when ``decide`` leaves an eligible overdue call waiting, no
    younger call started on any WPG it needs (they are held for it, free or not)."""
    assert simulate(sc, drain=True).overtaken == []


@PROPERTY_SETTINGS
@given(scenarios())
def test_one_call_per_wpg_and_multi_wpg_calls_all_or_nothing(sc: Scenario):
    trace = simulate(sc, drain=True)
    assert trace.conflicts == []  # never dispatched onto a WPG that runs a call
    assert trace.mismatches == []  # the scheduler's running flags are exactly what runs
    assert set(trace.dispatched) == set(trace.completed) == set(trace.calls)
    by_wpg: dict[str, list[tuple[float, float]]] = defaultdict(list)
    devices = {name: d for name, _, d in sc.wpgs}
    by_call: dict[int, list[UsageRecord]] = defaultdict(list)
    for record in trace.records:
        by_call[record.call].append(record)
    for call_id, call in trace.calls.items():
        start, end = trace.dispatched[call_id], trace.completed[call_id]
        records = by_call[call_id]
        # one record per WPG, all with the same span: started and ended together
        assert [r.wpg for r in records] == list(call.wpgs)
        assert {(r.start, r.end) for r in records} == {(start, end)}
        assert all(r.devices == devices[r.wpg] and r.job == call.job and r.fn == call.fn for r in records)
        for w in call.wpgs:
            by_wpg[w].append((start, end))
    for spans in by_wpg.values():
        spans.sort()
        for (_, end), (start, _) in itertools.pairwise(spans):
            assert end <= start
    for _, decision in trace.decisions:
        if isinstance(decision, Dispatch):
            assert set(decision.switches) <= set(decision.call.wpgs)
            assert (decision.setup_s > 0) <= bool(decision.switches)
    # a job's calls start in submission order, each after the previous one completed
    by_job: dict[str, list[int]] = defaultdict(list)
    for call_id, call in sorted(trace.calls.items()):
        by_job[call.job].append(call_id)
    for ids in by_job.values():
        for prev, nxt in itertools.pairwise(ids):
            assert trace.dispatched[nxt] >= trace.completed[prev]


@settings(max_examples=150, deadline=None, database=None)
@given(
    setup=st.floats(min_value=1e-3, max_value=100.0, allow_nan=False),
    exec_s=st.floats(min_value=1e-3, max_value=100.0, allow_nan=False),
    wait=st.floats(min_value=0.0, max_value=1000.0, allow_nan=False),
    capacity=st.integers(1, 3),
    cold_first=st.booleans(),
    observed=st.booleans(),
)
def test_resident_call_first_at_equal_wait_and_exec(setup, exec_s, wait, capacity, cold_first, observed):
    s = Scheduler(Policy(max_wait_s=wait + 1.0, default_exec_s=exec_s))
    s.add_wpg("w", capacity=capacity)
    warm_dep, cold_dep = ("warm", "actor"), ("cold", "actor")
    s.set_switch_cost(cold_dep, "w", setup)
    for i in range(capacity - 1):  # fill the other slots, then make "warm" the most recent
        run_one(s, f"filler{i}", "w", 2.0 * i)
    t0 = 2.0 * capacity
    first = s.submit("warm", "actor", "f", ("w",), t0 - 2.0)
    s.decide(t0 - 2.0)
    s.complete(first.id, t0 - 1.0, exec_s=exec_s if observed else None)
    if observed:  # equal estimates from measurements instead of the default
        s.estimates.observe("cold", "f", exec_s)
    order = (cold_dep, warm_dep) if cold_first else (warm_dep, cold_dep)
    calls = {dep: s.submit(dep[0], dep[1], "f", ("w",), t0) for dep in order}
    assert s.estimates.get("warm", "f") == s.estimates.get("cold", "f")
    decisions = s.decide(t0 + wait)
    assert started(decisions) == [calls[warm_dep].id]
    assert decisions[0].setup_s == 0
    assert hints(decisions) == [Prefetch("w", cold_dep)]
    s.complete(calls[warm_dep].id, t0 + wait + 1.0)
    (dispatch,) = s.decide(t0 + wait + 1.0)
    assert dispatch.call == calls[cold_dep]
    assert dispatch.setup_s == setup
    assert dispatch.switches == ("w",)


@PROPERTY_SETTINGS
@given(scenarios())
def test_same_events_same_decisions(sc: Scenario):
    one, two = simulate(sc), simulate(sc)
    assert one.decisions == two.decisions
    assert one.records == two.records
    drained_one, drained_two = simulate(sc, drain=True), simulate(sc, drain=True)
    assert drained_one.decisions == drained_two.decisions
    assert drained_one.records == drained_two.records
    # draining only adds what happens after the last event
    assert drained_one.decisions[: len(one.decisions)] == one.decisions


class Unindexed(Scheduler):
    """The rule ``decide`` implements, without its indexes: every ready call is looked at."""

    def _ready_calls(self) -> list[Call]:
        return [c for c in (self.queue[i] for i in self._ready.values()) if c.fn != STEP]

    def _startable(self, now: float) -> list[Call]:
        cutoff = now - self.policy.max_wait_s
        return [c for c in self._ready_calls() if c.submitted <= cutoff or self._free.issuperset(c.wpgs)]

    def _executes_on(self, wpg: str) -> list[Call]:
        return [c for c in self._ready_calls() if c.wpgs[0] == wpg]


@PROPERTY_SETTINGS
@given(scenarios())
def test_decide_looks_only_where_a_call_may_start_and_decides_as_if_it_ranked_all(sc: Scenario):
    """The indexes (calls by WPG, those that may have every WPG free, by age) change nothing."""
    for drain in (False, True):
        indexed, scanned = simulate(sc, drain=drain), simulate(sc, drain=drain, scheduler=Unindexed)
        assert indexed.decisions == scanned.decisions
        assert indexed.records == scanned.records


@PROPERTY_SETTINGS
@given(scenarios())
def test_paused_calls_never_run_while_paused_and_are_never_lost(sc: Scenario):
    trace = simulate(sc)
    s = trace.scheduler
    for call_id, paused in trace.paused_at_dispatch.items():
        assert trace.calls[call_id].job not in paused
    assert s.running == {}
    left = set(trace.calls) - set(trace.completed)
    assert set(s.queue) == left  # nothing dropped, nothing invented
    for call_id in left:
        assert trace.calls[call_id].job in trace.end_paused
        assert s.queue[call_id] == trace.calls[call_id]
    assert s.eligible() == []  # every job left with calls is paused
    submitted = defaultdict(int)
    for call in trace.calls.values():
        submitted[call.job] += 1
    for job in sc.jobs:
        if job.name not in trace.end_paused:  # everything it planned was submitted and ran
            assert submitted[job.name] == len(job.calls)
    # resuming the jobs still paused runs what they kept queued
    drained = simulate(sc, drain=True)
    assert set(drained.completed) == set(drained.calls)
    assert {j.name: len(j.calls) for j in sc.jobs} == {
        j.name: sum(c.job == j.name for c in drained.calls.values()) for j in sc.jobs}
    for call_id, paused in drained.paused_at_dispatch.items():
        assert drained.calls[call_id].job not in paused


# --- budgets ---------------------------------------------------------------------------------------


def run_until_idle(s: Scheduler, now: float, seconds: float = 1.0) -> tuple[float, list[UsageRecord]]:
    """Start what may start, complete each started call ``seconds`` later, repeat until nothing
    starts; returns the clock and the usage records."""
    records = []
    while running := started(s.decide(now)):
        now += seconds
        for call_id in running:
            records += s.complete(call_id, now, exec_s=seconds)
    return now, records


def test_a_budget_stops_its_tenants_calls_mid_stream_keeps_them_queued_and_overruns_by_one_call():
    s = scheduler("w0", "w1")
    calls = [s.submit("a", "actor", "generate", ("w0",), 0.0, "acme", seq=i) for i in range(10)]
    other = [s.submit("b", "actor", "generate", ("w1",), 0.0, "globex", seq=i) for i in range(4)]
    s.set_budget("acme", 3.5)  # three and a half calls' worth
    now, records = run_until_idle(s, 0.0)
    # three fit; the fourth, with 0.5 left and nothing else running, is the last: one call over
    assert device_seconds([r for r in records if r.tenant == "acme"]) == 4.0
    assert s.budget_left("acme") == -0.5
    assert [c.id for c in calls if c.id in s.queue] == [c.id for c in calls[4:]]  # queued, none lost
    assert not any(c.id in s.queue for c in other)  # another tenant ran on
    s.set_budget("acme", 2.0)  # raised: two more calls, then it waits again
    now, records = run_until_idle(s, now)
    assert device_seconds(records) == 2.0
    assert s.budget_left("acme") == 0.0
    s.set_budget("acme", None)  # no limit any more
    _, records = run_until_idle(s, now)
    assert device_seconds(records) == 4.0
    assert not s.queue


def test_a_call_longer_than_its_estimate_is_the_only_overrun():
    s = scheduler("w0")
    s.estimates.observe("a", "generate", 1.0)
    s.submit("a", "actor", "generate", ("w0",), 0.0, "acme", seq=0)
    s.submit("a", "actor", "generate", ("w0",), 0.0, "acme", seq=1)
    s.set_budget("acme", 1.2)
    [first] = started(s.decide(0.0))
    s.complete(first, 1.5, exec_s=1.5)  # took half a second more than estimated
    assert s.budget_left("acme") == pytest.approx(-0.3)
    assert started(s.decide(1.5)) == []


def test_calls_running_at_once_reserve_their_estimates_against_the_budget():
    s = scheduler("w0", "w1", "w2")
    s.estimates.observe("a", "generate", 1.0)
    for i, w in enumerate(("w0", "w1", "w2")):
        s.submit("a", "actor", "generate", (w,), 0.0, "acme", stream=f"r{i}")
    s.set_budget("acme", 2.5)
    first = started(s.decide(0.0))
    assert len(first) == 2  # two estimated seconds fit in 2.5; a third would not
    for call_id in first:
        s.complete(call_id, 1.0, exec_s=1.0)
    assert s.budget_left("acme") == 0.5
    [last] = started(s.decide(1.0))  # 0.5 left, nothing running: the third starts as the last call
    s.complete(last, 2.0, exec_s=1.0)
    assert s.budget_left("acme") == -0.5
    with pytest.raises(ValueError, match="finite"):
        s.set_budget("acme", float("nan"))


# --- a job whose driver was replaced ----------------------------------------------------------------


def test_abandon_drops_a_jobs_queued_calls_its_running_call_finishes_and_a_new_stream_runs():
    s = scheduler("w0", "w1")
    old = [s.submit("a", "actor", "generate", ("w0",), 0.0, stream="dead", seq=i) for i in range(3)]
    s.submit("a", "actor", STEP, (), 0.0, stream="dead", seq=3)
    other = s.submit("b", "actor", "generate", ("w1",), 0.0, stream="b", seq=0)
    assert set(started(s.decide(0.0))) == {old[0].id, other.id}
    assert sorted(s.abandon("a")) == [old[1].id, old[2].id, old[2].id + 1]  # queued ones, the mark too
    assert not any(c.job == "a" for c in s.queue.values())
    assert s.abandon("b") == []  # b's one call is running: nothing queued to drop
    s.complete(old[0].id, 1.0, exec_s=1.0)  # the dead driver's running call ends as usual
    new = [s.submit("a", "actor", "generate", ("w0",), 1.0, stream="new", seq=i) for i in range(2)]
    assert started(s.decide(1.0)) == [new[0].id]
    s.complete(new[0].id, 2.0, exec_s=1.0)
    assert started(s.decide(2.0)) == [new[1].id]


def test_a_replaced_wpg_holds_no_state():
    s = scheduler(("w0", 2))
    call = s.submit("a", "actor", "generate", ("w0",), 0.0)
    [dispatched] = started(s.decide(0.0))
    s.complete(dispatched, 1.0, exec_s=1.0)
    assert s.setup_estimate(call)[1] == ()  # resident
    s.reset_wpg("w0")
    assert s.setup_estimate(call)[1] == ("w0",)  # the new group must load it again


def test_a_wpg_is_removed_only_when_no_call_runs_or_waits_for_it():
    s = Scheduler(Policy(max_wait_s=FAR))
    s.add_wpg("w", kind="rollout")
    s.add_wpg("t", kind="train")
    call = s.submit("a", "actor", "generate", ("w",), 0.0)
    with pytest.raises(ValueError, match="still has calls"):
        s.remove_wpg("w")  # queued
    assert started(s.decide(0.0)) == [call.id]
    with pytest.raises(ValueError, match="still has calls"):
        s.remove_wpg("w")  # running
    s.complete(call.id, 1.0)
    s.remove_wpg("w")
    assert "w" not in s.wpgs
    assert s.aligner.pools == {"train": 1}
    with pytest.raises(KeyError):
        s.submit("a", "actor", "generate", ("w",), 2.0)
