"""The suite's CPU report (``tests/cpu_report.py``): each test's share of the machine's CPU-seconds
and the run's total, in the summary of a run in one process; the whole run's total under xdist;
nothing where it is turned off."""

import pytest

from tests.engine.repo import REPO

pytest_plugins = ["pytester"]

# the inner run, in this process: no cache, no pytest-django (this session's Django is set up), no asyncio
ALONE = ("-p", "no:cacheprovider", "-p", "no:django", "-p", "no:asyncio")

SPIN_AND_SLEEP = """
import time

def test_spins():
    end = time.process_time() + 1.0
    while time.process_time() < end:
        pass

def test_sleeps():
    time.sleep(0.3)  # at most 0.6 CPU-seconds of anything else on 2 CPUs meanwhile
"""


@pytest.fixture
def inner(pytester):
    pytester.makeconftest('pytest_plugins = ["tests.cpu_report"]')
    pytester.makepyfile(test_inner=SPIN_AND_SLEEP)
    return pytester


def test_the_costliest_tests_and_the_total_are_in_the_summary(inner):
    result = inner.runpytest_inprocess("--cpu-report", "1", *ALONE)
    result.assert_outcomes(passed=2)
    lines = result.outlines
    at = next(i for i, line in enumerate(lines) if "most machine CPU-seconds while a test ran (top 1)" in line)
    cpu_s, unit, wall_s, _, nodeid = lines[at + 1].split()
    assert nodeid == "test_inner.py::test_spins"  # the one that burned CPU, not the one that slept
    assert unit == "CPU-s"
    assert float(cpu_s) >= 0.95
    assert float(wall_s) >= 0.95
    total = lines[at + 2]
    assert total.startswith("2 tests: ")
    assert " CPU-seconds in " in total
    assert "busy" in total


def test_zero_turns_it_off(inner):
    result = inner.runpytest_inprocess("--cpu-report", "0", *ALONE)
    result.assert_outcomes(passed=2)
    assert not any("machine CPU-seconds" in line for line in result.outlines)


def test_a_run_in_workers_reports_the_whole_runs_total(inner):
    """Under ``-n 2`` the workers' per-test figures would mix both workers' load: the controller
    reports the whole run instead, at least the CPU-second the spinning test burned."""
    inner.makeconftest(f'import sys\nsys.path.insert(0, {str(REPO)!r})\npytest_plugins = ["tests.cpu_report"]')
    result = inner.runpytest_subprocess("-n", "2", *ALONE)
    result.assert_outcomes(passed=2)
    line = next(line for line in result.outlines if line.startswith("the whole run: "))
    cpu_s, wall_s = float(line.split()[3]), float(line.split()[6])
    assert cpu_s >= 0.95
    assert wall_s >= 0.95
    assert not any("while a test ran" in line for line in result.outlines)
