"""Two-phase placement of live jobs: profile, micro-shift onto the WPGs' horizon, start delays."""

import pytest

from engine.scheduler.alignment import Aligner, Slot
from engine.scheduler.core import STEP, Policy, Scheduler


def _profile(aligner: Aligner, job: str, start: float, steps: int = 2) -> list[float]:
    """``steps`` steps of 2 s from ``start``: generate 1 s on the rollout WPG, then train 1 s."""
    delays = [aligner.boundary(job, start)]
    for k in range(steps):
        t = start + 2 * k
        aligner.record(job, "generate", t, t + 1)
        aligner.record(job, "forward_backward", t + 1, t + 2)
        delays.append(aligner.boundary(job, t + 2))
    return delays


def test_a_second_job_is_shifted_into_the_first_ones_idle_windows():
    aligner = Aligner(profile_steps=2, max_delay_s=1.5, offset_steps=4)
    aligner.add_wpg("rollout")
    aligner.add_wpg("train")
    assert _profile(aligner, "a", 0.0) == [0.0, 0.0, 0.0]  # profiled, then placed on its own phase
    assert aligner.origin == 4.0
    assert aligner.slots["a"] == Slot(2.0, 0.0)
    # b's steps have a's shape; laid at offset 1 its generate fills a's train window and vice versa
    _profile(aligner, "b", 4.5)
    assert aligner.slots["b"] == Slot(2.0, 1.0)
    # b's steps start at 4 + 1 + 2k: a step due at 8.5 is held 0.5 s, one at 9.2 would wait 1.8 s
    # (over the 1.5 s limit) so it runs at once
    assert aligner.boundary("b", 8.5) == pytest.approx(0.5)
    assert aligner.boundary("b", 9.2) == 0.0
    assert aligner.boundary("a", 10.0) == 0.0  # a is on its grid


def test_steps_without_calls_are_not_placed_and_the_job_is_profiled_again():
    """A session's loop marks a step with each ``log_metrics``; several with no call between
    leave a profile without a step shape: nothing is placed or held (it used to raise, failing
    every call of every job), and the profile is taken again from there."""
    aligner = Aligner(profile_steps=2, max_delay_s=1.5, offset_steps=4)
    aligner.add_wpg("rollout")
    aligner.add_wpg("train")
    assert [aligner.boundary("s", t) for t in (0.0, 0.1, 0.2, 0.3)] == [0.0] * 4
    assert "s" not in aligner.slots
    assert aligner.boundaries["s"] == [0.2, 0.3]  # profiling again from 0.2, where placing failed
    _profile(aligner, "s", 1.0)  # then steps with calls: placed as any job
    assert aligner.slots["s"] == Slot(2.0, 0.0)


def test_one_pool_of_wpgs_that_serve_both_phases():
    aligner = Aligner(profile_steps=2, max_delay_s=5.0, offset_steps=4)
    aligner.add_wpg("both")
    _profile(aligner, "a", 0.0)
    _profile(aligner, "b", 0.0)
    # one WPG busy all period with a's steps: b cannot avoid overlap, and takes the smallest offset
    assert aligner.slots["b"] == Slot(2.0, 0.0)


def test_the_core_holds_a_late_step_and_wakes_up_for_it():
    s = Scheduler(Policy(profile_steps=1, max_start_delay_s=10.0, max_wait_s=1e9))
    s.add_wpg("r", kind="rollout")
    s.add_wpg("t", kind="train")

    def run(fn: str, wpg: str, start: float, end: float) -> None:
        call = s.submit("a", "policy", fn, (wpg,), start)
        (dispatch,) = s.decide(start)
        assert dispatch.call == call
        s.complete(call.id, end, exec_s=end - start)

    s.submit("a", "", STEP, (), 0.0)
    run("generate", "r", 0.0, 1.0)
    run("forward_backward", "t", 1.0, 3.0)
    s.submit("a", "", STEP, (), 3.0)  # one whole step profiled: placed with period 3 from t = 3
    run("generate", "r", 3.0, 4.0)
    assert s.not_before == {}
    run("forward_backward", "t", 4.0, 6.5)  # a slow step: the next one is due at 9
    s.submit("a", "", STEP, (), 6.5)
    late = s.submit("a", "policy", "generate", ("r",), 6.5)
    assert s.decide(6.5) == []
    assert s.next_wakeup(6.5) == 9.0
    assert s.decide(8.9) == []
    (dispatch,) = s.decide(9.0)
    assert dispatch.call == late


def test_a_step_mark_needs_no_wpg_and_other_calls_need_one():
    s = Scheduler()
    s.add_wpg("g")
    with pytest.raises(ValueError, match="distinct WPGs"):
        s.submit("a", "policy", "generate", (), 0.0)
    with pytest.raises(ValueError, match="distinct WPGs"):
        s.submit("a", "", STEP, ("g",), 0.0)


def test_a_sync_is_profiled_on_the_side_whose_wpgs_it_holds():
    """A gang ``sync_weights`` (rollout and train WPGs) counts as rollout time, as its function is;
    a host-tier one, on the train WPG alone, counts as train time: that WPG is the one it keeps busy."""
    s = Scheduler(Policy(profile_steps=4, max_wait_s=1e9))
    s.add_wpg("r", kind="rollout")
    s.add_wpg("t", kind="train")
    for job, wpgs in (("gang", ("r", "t")), ("host", ("t",))):
        s.submit(job, "", STEP, (), 0.0)
        call = s.submit(job, "policy", "sync_weights", wpgs, 0.0)
        assert [d.call for d in s.decide(0.0)] == [call]
        s.complete(call.id, 1.0, exec_s=1.0)
    assert [phase for phase, *_ in s.aligner.calls["gang"]] == ["rollout"]
    assert [phase for phase, *_ in s.aligner.calls["host"]] == ["train"]
