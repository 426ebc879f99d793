"""``pytest -n 2``'s scheduler (tests/streams.py): the engine's tests in one worker, the rest in the
other, and the floating modules taken whole by whichever worker runs dry first."""

from __future__ import annotations

import itertools
import random
import textwrap
from types import SimpleNamespace

import pytest

from tests.engine.repo import REPO
from tests.streams import TwoStreamsAndATail, split

pytest_plugins = ["pytester"]

COLLECTION = [
    "tests/e2e/test_demo.py::test_demo",
    "tests/engine/test_api.py::test_a",
    "tests/engine/test_api.py::test_b",
    "tests/engine/test_cli.py::test_train",
    "tests/engine/test_cli.py::test_errors[x]",
    "tests/engine/test_cli.py::test_errors[y]",
    "tests/engine/test_recovery.py::test_c",
    "tests/engine/test_sim.py::test_d",
    "tests/platform/test_jobs_api.py::test_e",
    "tests/platform/test_isolation_fuzz.py::test_api",  # schemathesis: one node id, several items
    "tests/platform/test_isolation_fuzz.py::test_api",
    "tests/test_layout.py::test_f",
]
FLOATING = ("tests/engine/test_cli.py", "tests/engine/test_bench_state.py", "tests/engine/test_sim.py")


class FakeWorker:
    """What the scheduler sends a worker: the items, then whether it was told to finish."""

    def __init__(self, name: str) -> None:
        self.gateway = SimpleNamespace(id=name, spec=name)
        self.sent: list[int] = []
        self.shutting_down = False

    def send_runtest_some(self, indices) -> None:
        assert not self.shutting_down, "items sent after shutdown"
        self.sent += list(indices)

    def shutdown(self) -> None:
        self.shutting_down = True


def test_the_split_keeps_each_module_whole_and_in_the_collections_order():
    engine, rest, tail = split(COLLECTION, FLOATING)
    assert [COLLECTION[i] for i in engine] == [COLLECTION[i] for i in (1, 2, 6)]
    assert rest == [0, 8, 9, 10, 11]
    assert tail == [[3, 4, 5], [7]]  # test_bench_state was not collected


def _run(monkeypatch, seed: int, n: int) -> dict[str, list[int]]:
    """Schedule COLLECTION on ``n`` fake workers that finish items in a random interleaving; the
    items each ran, by worker."""
    monkeypatch.setattr("tests.streams.split", lambda collection: split(collection, FLOATING))
    config = SimpleNamespace(getvalue=lambda name: [f"{n}*popen"])
    sched = TwoStreamsAndATail(config)
    workers = [FakeWorker(f"gw{i}") for i in range(n)]
    for worker in workers:
        sched.add_node(worker)
    for worker in workers:
        sched.add_node_collection(worker, COLLECTION)
    sched.schedule()
    ran: dict[str, list[int]] = {w.gateway.id: [] for w in workers}
    rng = random.Random(seed)
    # a worker runs its next item only while it knows what follows it, or has been told to finish
    while not sched.tests_finished:
        ready = [w for w in workers if len(sched.node2pending[w]) >= 2
                 or (sched.node2pending[w] and w.shutting_down)]
        assert ready, "no worker can go on: the run would hang"
        worker = rng.choice(ready)
        index = sched.node2pending[worker][0]
        ran[worker.gateway.id].append(index)
        sched.mark_test_complete(worker, index)
    for worker in workers:  # what is left runs once each worker is told to finish
        assert worker.shutting_down
        ran[worker.gateway.id] += list(sched.node2pending[worker])
    assert sorted(itertools.chain(*ran.values())) == list(range(len(COLLECTION))), "an item ran twice or never"
    for module in ([3, 4, 5], [7]):  # each floating module whole on one worker
        assert sum(set(module) <= set(items) for items in ran.values()) == 1
    return ran


@pytest.mark.parametrize("seed", range(20))
def test_every_item_runs_once_floating_modules_whole_and_each_stream_on_its_worker(monkeypatch, seed):
    ran = _run(monkeypatch, seed, 2)
    assert {1, 2, 6} <= set(ran["gw0"])
    assert {0, 8, 9, 10, 11} <= set(ran["gw1"])


@pytest.mark.parametrize("n", [1, 3])
def test_one_worker_runs_everything_in_order_and_a_third_only_takes_from_the_tail(monkeypatch, n):
    ran = _run(monkeypatch, 0, n)
    if n == 1:
        assert ran["gw0"] == [0, 1, 2, 6, 8, 9, 10, 11, 3, 4, 5, 7]
    else:
        assert set(ran["gw2"]) <= {3, 4, 5, 7}


def test_a_real_two_worker_run_places_the_streams_and_the_tail(pytester, monkeypatch):
    """Through pytest-xdist itself: every item runs once (a parametrised module's items included),
    the engine's on one worker, the rest on the other, and the floating modules whole on the worker
    that ran dry first (here the other stream's: the engine's has a module of slow items)."""
    pytester.makeconftest(f"""
        import sys
        sys.path.insert(0, {str(REPO)!r})
        from tests.streams import pytest_xdist_make_scheduler  # noqa: F401
    """)
    body = textwrap.dedent("""
        import os, pytest
        @pytest.mark.parametrize("i", range(3))
        def test_item(request, i):
            with open(os.environ["LEDGER"], "a") as ledger:
                ledger.write(f"{request.node.nodeid} {os.environ['PYTEST_XDIST_WORKER']}\\n")
    """)
    for module in ("tests/engine/test_api.py", "tests/engine/test_recovery.py", "tests/engine/test_cli.py",
                   "tests/engine/test_sim.py", "tests/platform/test_jobs_api.py", "tests/test_layout.py"):
        path = pytester.path / module
        path.parent.mkdir(parents=True, exist_ok=True)
        slow = module.endswith("test_recovery.py")
        path.write_text(body.replace("):\n", "):\n    __import__('time').sleep(1)\n", 1) if slow else body)
    ledger = pytester.path / "ledger.txt"
    monkeypatch.setenv("LEDGER", str(ledger))
    result = pytester.runpytest_subprocess("-n", "2", "-p", "no:django", "-p", "no:cacheprovider",
                                           "--import-mode=importlib", "-q")
    result.assert_outcomes(passed=18)
    where: dict[str, set[str]] = {}
    lines = ledger.read_text().split("\n")[:-1]
    assert len(lines) == 18
    for line in lines:
        nodeid, worker = line.split()
        where.setdefault(nodeid.split("::")[0], set()).add(worker)
    assert all(len(workers) == 1 for workers in where.values()), where
    assert where["tests/engine/test_api.py"] == where["tests/engine/test_recovery.py"]
    assert where["tests/platform/test_jobs_api.py"] == where["tests/test_layout.py"]
    assert where["tests/engine/test_api.py"] != where["tests/platform/test_jobs_api.py"]
    assert where["tests/engine/test_cli.py"] == where["tests/engine/test_sim.py"] == where["tests/test_layout.py"]

