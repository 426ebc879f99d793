"""A pytest plugin: how much CPU the whole machine used while each test ran, and in the whole run.

Most of the suite's work runs outside pytest's process (servers, Celery workers, Ray actors,
``plexrl`` subprocesses), so a test's cost is read from the machine's counters around it: in one
process that is the test's own (and whatever it left running); under xdist the other worker's
share mixes in, so workers report nothing and the controller reports the whole run's total.
``--cpu-report N`` lists the N costliest tests (0: off).
"""

from __future__ import annotations

import time

import psutil
import pytest

_ROWS = pytest.StashKey[list]()  # (node id, machine CPU-seconds, seconds) per test
_START = pytest.StashKey[tuple]()  # the machine's busy CPU-seconds and the clock when the run began


def pytest_addoption(parser):
    parser.addoption("--cpu-report", type=int, default=20, metavar="N",
                     help="list the N tests during which the machine used the most CPU-seconds, and the "
                          "whole run's CPU-seconds and busy share (0: off)")


def _machine_busy_s() -> float:
    """CPU-seconds every CPU of this machine has spent busy since boot (idle, I/O wait and time
    stolen by a hypervisor excluded)."""
    t = psutil.cpu_times()
    return t.user + t.nice + t.system + getattr(t, "irq", 0.0) + getattr(t, "softirq", 0.0)


def pytest_configure(config):
    config.stash[_ROWS] = []
    config.stash[_START] = (_machine_busy_s(), time.monotonic())


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item, nextitem):
    busy, wall = _machine_busy_s(), time.monotonic()
    try:
        return (yield)
    finally:
        item.config.stash[_ROWS].append((item.nodeid, _machine_busy_s() - busy, time.monotonic() - wall))


def pytest_terminal_summary(terminalreporter, config):
    rows, count = config.stash.get(_ROWS, []), config.getoption("cpu_report")
    if count <= 0 or hasattr(config, "workerinput"):
        return
    cpus = psutil.cpu_count()
    if not rows:  # xdist's controller: the tests ran in its workers, side by side
        busy, started = config.stash[_START]
        cpu, wall = _machine_busy_s() - busy, time.monotonic() - started
        terminalreporter.write_sep("=", "machine CPU-seconds")
        terminalreporter.write_line(f"the whole run: {cpu:.0f} CPU-seconds in {wall:.0f} s, the machine's "
                                    f"{cpus} CPUs busy {cpu / wall / cpus:.2f} of the time")
        return
    cpu, wall = sum(r[1] for r in rows), sum(r[2] for r in rows)
    terminalreporter.write_sep("=", f"most machine CPU-seconds while a test ran (top {count})")
    for nodeid, cpu_s, wall_s in sorted(rows, key=lambda r: r[1], reverse=True)[:count]:
        terminalreporter.write_line(f"{cpu_s:8.1f} CPU-s {wall_s:8.1f} s  {nodeid}")
    terminalreporter.write_line(f"{len(rows)} tests: {cpu:.0f} CPU-seconds in {wall:.0f} s, the machine's "
                                f"{cpus} CPUs busy {cpu / wall / cpus:.2f} of the time")
