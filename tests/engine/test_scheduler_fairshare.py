"""Fair share between tenants and job priority in the scheduler's pure core (engine.scheduler.core).

Tenants that contend for a WPG get its time in proportion to their weights; idling banks no
credit; a job's priority orders calls within its tenant's share and never widens the share; one
tenant, or tenant ``""``, is scheduled exactly as HRRS alone would. Closed loops on an injected
clock: each job's next call is submitted the moment its previous one completes. No Ray.
"""

from __future__ import annotations

import heapq
import itertools
import random
from collections import defaultdict

import pytest

from engine.accounting.metering import UsageRecord
from engine.scheduler.core import Dispatch, Policy, Prefetch, Scheduler
from engine.spec import PRIORITIES

FAR = 1e9  # a max_wait_s no test reaches: the starvation guard stays out of the way


class Loop:
    """Jobs that keep one call each backlogged on their WPG(s), on a virtual clock. A call runs
    its job's ``exec_s`` plus the switch the scheduler estimated (the switch cost set)."""

    def __init__(self, *, capacity: int = 0, switch_s: float = 0.0, wpgs: tuple[str, ...] = ("w",),
                 policy: Policy | None = None):
        self.s = Scheduler(policy or Policy(max_wait_s=FAR))
        for w in wpgs:
            self.s.add_wpg(w, capacity=capacity)
        self.switch_s = switch_s
        self.now = 0.0
        self.jobs: dict[str, tuple[str, float, tuple[str, ...]]] = {}  # job -> (tenant, exec_s, wpgs)
        self.looping: set[str] = set()  # jobs that submit again when their call completes
        self.events: list[tuple[float, int, str, float]] = []  # (end, call id, job, setup seconds)
        self.order: list[str] = []  # jobs in the order their calls started

    def add(self, job: str, tenant: str, exec_s: float = 1.0, wpgs: tuple[str, ...] = ("w",)) -> None:
        self.jobs[job] = (tenant, exec_s, wpgs)
        self.looping.add(job)
        for w in wpgs:
            self.s.set_switch_cost((job, "actor"), w, self.switch_s)
        self._submit(job)
        self._decide()

    def stop(self, job: str) -> None:
        """``job`` submits nothing more (its running call finishes)."""
        self.looping.discard(job)

    def _submit(self, job: str) -> None:
        tenant, _, wpgs = self.jobs[job]
        self.s.submit(job, "actor", "f", wpgs, self.now, tenant)

    def _decide(self) -> None:
        for d in self.s.decide(self.now):
            if isinstance(d, Dispatch):
                job = d.call.job
                heapq.heappush(self.events, (self.now + d.setup_s + self.jobs[job][1], d.call.id, job, d.setup_s))
                self.order.append(job)

    def run(self, calls: int) -> list[UsageRecord]:
        """Complete the next ``calls`` calls; their usage records."""
        records: list[UsageRecord] = []
        for _ in range(calls):
            end, call_id, job, setup = heapq.heappop(self.events)
            self.now = end
            records += self.s.complete(call_id, end, exec_s=self.jobs[job][1], setup_s=setup)
            if job in self.looping:
                self._submit(job)
            self._decide()
        return records


def seconds_by_tenant(records: list[UsageRecord]) -> dict[str, float]:
    out: dict[str, float] = defaultdict(float)
    for r in records:
        out[r.tenant] += r.device_seconds
    return out


def split(records: list[UsageRecord], heavy: str, light: str) -> float:
    by = seconds_by_tenant(records)
    return by[heavy] / by[light]


# -- proportional shares ----------------------------------------------------------------------------


@pytest.mark.parametrize(("capacity", "switch_s", "exec_heavy", "exec_light"), [
    (0, 0.0, 1.0, 1.0),  # the WPG holds both jobs' states
    (1, 0.3, 1.0, 1.0),  # one deployment at a time: every change of job switches
    (0, 0.0, 0.4, 2.5),  # unequal calls: the heavy tenant's are short
    (1, 0.3, 2.5, 0.4),  # ... long, and switching
])
def test_weights_3_to_1_split_a_contended_wpg_3_to_1(capacity, switch_s, exec_heavy, exec_light):
    loop = Loop(capacity=capacity, switch_s=switch_s)
    loop.s.set_weight("gold", 3.0)
    loop.s.set_weight("plain", 1.0)
    loop.add("p", "plain", exec_light)  # submitted first: ties go its way
    loop.add("g", "gold", exec_heavy)
    records = loop.run(400)
    assert split(records, "gold", "plain") == pytest.approx(3.0, rel=0.1)
    # over any later window too, not only on average from the start
    assert split(loop.run(200), "gold", "plain") == pytest.approx(3.0, rel=0.1)


@pytest.mark.parametrize("capacity", [0, 1])
def test_equal_weights_split_evenly(capacity):
    loop = Loop(capacity=capacity, switch_s=0.3)
    loop.s.set_weight("a", 2.0)
    loop.s.set_weight("b", 2.0)
    loop.add("ja", "a", 0.5)
    loop.add("jb", "b", 1.5)  # three times as long: HRRS alone would favour a's short calls
    assert split(loop.run(300), "a", "b") == pytest.approx(1.0, rel=0.1)


def test_three_tenants_share_in_proportion_to_their_weights():
    loop = Loop()
    for tenant, weight in (("t1", 1.0), ("t2", 2.0), ("t3", 4.0)):
        loop.s.set_weight(tenant, weight)
        loop.add(f"job-{tenant}", tenant, 1.0)
    by = seconds_by_tenant(loop.run(700))
    total = sum(by.values())
    for tenant, weight in (("t1", 1.0), ("t2", 2.0), ("t3", 4.0)):
        assert by[tenant] / total == pytest.approx(weight / 7.0, rel=0.1)


def test_a_tenant_alone_uses_the_whole_wpg():
    """Shares bind only under contention: the scheduler never idles a WPG for an absent tenant."""
    loop = Loop()
    loop.s.set_weight("gold", 3.0)
    loop.add("p", "plain")
    loop.add("g", "gold")
    loop.run(50)
    loop.stop("g")
    loop.run(1)  # g's last call, or p's
    records = loop.run(30)
    assert seconds_by_tenant(records)["plain"] >= 29.0
    assert loop.now - records[0].start == pytest.approx(30.0)  # back to back: no gap


def test_a_tenant_back_from_idle_banks_no_credit():
    loop = Loop()
    loop.s.set_weight("gold", 3.0)
    loop.add("p", "plain")
    loop.add("g", "gold")
    loop.run(100)
    loop.stop("g")
    loop.run(101)  # gold idles for 100 of plain's calls (and its own last one ends)
    assert "g" not in loop.order[-100:]
    loop.add("g", "gold")
    started = len(loop.order)
    records = loop.run(80)
    after = loop.order[started - 1:]
    # without the clamp, gold would run its 100 s of arrears: the next 300 calls alone
    longest = max(len(list(run)) for job, run in itertools.groupby(after) if job == "g")
    assert longest <= 8, after
    assert split(records, "gold", "plain") == pytest.approx(3.0, rel=0.25)


def test_overdue_calls_still_go_first_past_the_share():
    """The starvation guard outranks the share: a light tenant's call that waited max_wait_s
    starts next, however far its tenant ran ahead."""
    loop = Loop(policy=Policy(max_wait_s=10.0))
    loop.s.set_weight("gold", 100.0)
    loop.add("p", "plain")
    loop.add("g", "gold")
    loop.run(200)
    gaps = [len(list(run)) for job, run in itertools.groupby(loop.order) if job == "g"]
    assert max(gaps) <= 11  # plain's call is overdue after 10 of gold's one-second calls


# -- job priority -----------------------------------------------------------------------------------


def test_priorities_are_named_factors():
    assert PRIORITIES == {"low": 0.5, "normal": 1.0, "high": 2.0}


def test_priority_scales_the_ratio_and_is_forgotten_with_the_job():
    s = Scheduler(Policy(max_wait_s=FAR))
    s.add_wpg("w")
    s.set_weight("acme", 3.0)
    s.set_priority("hi", PRIORITIES["high"])
    call = s.submit("hi", "actor", "f", ("w",), 0.0, "acme")
    assert s.ratio(call, 1.0) == pytest.approx(3.0 * 2.0 * (1.0 + 0.5) / 0.5)  # weight * priority * HRRS
    for bad in (0.0, -1.0, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="priority"):
            s.set_priority("hi", bad)
    (dispatch,) = s.decide(1.0)
    s.complete(dispatch.call.id, 2.0)
    s.forget("hi")
    assert "hi" not in s.priorities


def test_within_a_tenant_a_high_priority_job_gets_more_than_a_low_one():
    loop = Loop()
    loop.s.set_priority("hi", PRIORITIES["high"])
    loop.s.set_priority("lo", PRIORITIES["low"])
    loop.add("lo", "acme")
    loop.add("hi", "acme")
    records = loop.run(200)
    by_job: dict[str, float] = defaultdict(float)
    for r in records:
        by_job[r.job] += r.device_seconds
    assert by_job["hi"] > 2.0 * by_job["lo"]


@pytest.mark.parametrize(("weights", "expected"), [((1.0, 1.0), 1.0), ((3.0, 1.0), 3.0)])
def test_priority_never_widens_a_tenants_share(weights, expected):
    """The lighter tenant's job is high priority, the heavier's low: the split stays the weights'."""
    loop = Loop()
    loop.s.set_weight("heavy", weights[0])
    loop.s.set_weight("light", weights[1])
    loop.s.set_priority("jh", PRIORITIES["low"])
    loop.s.set_priority("jl", PRIORITIES["high"])
    loop.add("jh", "heavy")
    loop.add("jl", "light")
    assert split(loop.run(400), "heavy", "light") == pytest.approx(expected, rel=0.1)


def test_priority_orders_a_tenants_jobs_within_its_share():
    """Two jobs of gold (one high, one low priority) against one of plain: gold keeps 3:1, and
    its high-priority job gets most of gold's part."""
    loop = Loop()
    loop.s.set_weight("gold", 3.0)
    loop.s.set_priority("g-hi", PRIORITIES["high"])
    loop.s.set_priority("g-lo", PRIORITIES["low"])
    loop.add("p", "plain")
    loop.add("g-lo", "gold")
    loop.add("g-hi", "gold")
    records = loop.run(400)
    assert split(records, "gold", "plain") == pytest.approx(3.0, rel=0.1)
    hi = sum(r.device_seconds for r in records if r.job == "g-hi")
    lo = sum(r.device_seconds for r in records if r.job == "g-lo")
    assert hi > 1.5 * lo


# -- one tenant: HRRS alone -------------------------------------------------------------------------


def random_run(seed: int, tenant_of, weight: float = 1.0) -> list[tuple]:
    """A random workload, the same for every ``seed``, under the tenants ``tenant_of(job)`` names
    (each weighing ``weight``): up to 3 WPGs (some holding one or two deployments, with switch costs), 2 to
    5 jobs submitting closed-loop calls of random lengths after random gaps, on one or two WPGs,
    sometimes a tight starvation guard. Returns what was decided, without the calls' tenants."""
    rng = random.Random(seed)
    s = Scheduler(Policy(max_wait_s=rng.choice((2.0, 8.0, FAR)), default_setup_s=rng.choice((0.0, 0.5))))
    wpgs = [f"w{i}" for i in range(rng.randint(1, 3))]
    for w in wpgs:
        s.add_wpg(w, capacity=rng.randint(0, 2))
    jobs = [f"j{i}" for i in range(rng.randint(2, 5))]
    for job in jobs:
        if tenant_of(job):
            s.set_weight(tenant_of(job), weight)
        for w in wpgs:
            if rng.random() < 0.5:
                s.set_switch_cost((job, "actor"), w, rng.choice((0.1, 1.0)))
    # per job, its calls: (WPGs, seconds it runs, gap before it is submitted)
    plans = {job: [(tuple(rng.sample(wpgs, rng.randint(1, min(2, len(wpgs))))), rng.randint(1, 12) * 0.25,
                    rng.randint(0, 4) * 0.25) for _ in range(rng.randint(5, 25))] for job in jobs}
    events = [(plans[job][0][2], 1, job, 0) for job in jobs]  # (time, 0 completes / 1 submits, job, call index)
    heapq.heapify(events)
    out: list[tuple] = []
    calls: dict[str, tuple[int, int]] = {}  # job -> (its call's id, index)
    while events:
        now, kind, job, i = heapq.heappop(events)
        if kind == 0:
            s.complete(calls[job][0], now, exec_s=plans[job][i][1])
            if i + 1 < len(plans[job]):
                heapq.heappush(events, (now + plans[job][i + 1][2], 1, job, i + 1))
        else:
            calls[job] = (s.submit(job, "actor", "f", plans[job][i][0], now, tenant_of(job)).id, i)
        for d in s.decide(now):
            if isinstance(d, Prefetch):
                out.append((now, "prefetch", d.wpg, d.deployment))
                continue
            out.append((now, d.call.id, d.call.job, d.call.wpgs, d.setup_s, d.switches, d.queued_s))
            index = calls[d.call.job][1]
            heapq.heappush(events, (now + d.setup_s + plans[d.call.job][index][1], 0, d.call.job, index))
    return out


@pytest.mark.parametrize("seed", range(300))
def test_one_tenant_or_blank_beside_one_is_scheduled_by_hrrs_alone(seed):
    """Tenant "" (not share-accounted, as the simulator's), one named tenant for every job (its
    weight scales every ratio alike: a power of two, exactly), or some jobs of one named tenant
    weighing 1 beside "": the same decisions at the same times."""
    blank = random_run(seed, lambda job: "")
    assert random_run(seed, lambda job: "solo", weight=2.0) == blank
    assert random_run(seed, lambda job: "solo" if job in ("j0", "j2") else "") == blank
    assert len({d[2] for d in blank if d[1] != "prefetch"}) > 1  # several jobs did run
