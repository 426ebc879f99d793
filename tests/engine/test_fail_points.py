"""Fail points (``engine.workers.faults``): an armed one kills the process that reaches it with matching
context, on the nth pass, with SIGKILL, once; unarmed or unmatched, nothing happens."""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest

from engine.workers import faults

PASS = """
import sys
from engine.workers import faults
for n in range(1, 4):
    faults.check(sys.argv[1], "rank", job="a", fn=sys.argv[2], rank=0)
    print(n, flush=True)
"""


def passes(data_dir, fn: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", PASS, str(data_dir), fn], capture_output=True, text=True,
                          timeout=60)


def test_the_nth_matching_pass_dies_by_sigkill_once(tmp_path):
    faults.arm(tmp_path, "rank", nth=2, job="a", fn="generate")
    assert not faults.tripped(tmp_path, "rank")
    other = passes(tmp_path, "forward")  # another function: not matched
    assert other.returncode == 0
    assert other.stdout.split() == ["1", "2", "3"]
    died = passes(tmp_path, "generate")
    assert died.returncode == -signal.SIGKILL
    assert died.stdout.split() == ["1"]  # the second pass never printed
    assert faults.tripped(tmp_path, "rank")
    again = passes(tmp_path, "generate")  # what replaces the dead process is not killed too
    assert again.returncode == 0
    assert again.stdout.split() == ["1", "2", "3"]


def test_unknown_sites_are_refused(tmp_path):
    with pytest.raises(ValueError, match="unknown fail point 'disk'"):
        faults.arm(tmp_path, "disk")
    faults.check(None, "rank", job="a")  # no data dir: nothing to check


def test_a_fault_armed_to_raise_raises_on_its_nth_pass_once_and_kills_nothing(tmp_path):
    faults.arm(tmp_path, "watch", nth=2, action="raise")
    faults.check(tmp_path, "watch")  # the first pass
    with pytest.raises(faults.InjectedFault, match="fail point 'watch'"):
        faults.check(tmp_path, "watch")
    assert faults.tripped(tmp_path, "watch")
    faults.check(tmp_path, "watch")  # once: the next pass goes through
    with pytest.raises(ValueError, match="unknown fault action 'hang'; known: kill, raise"):
        faults.arm(tmp_path, "watch", action="hang")
