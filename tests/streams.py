"""How ``pytest -n 2`` (pytest-xdist) spreads the suite over two workers: two fixed streams and a
shared tail.

- The engine's tests (Ray, models; no database, Redis or Celery) run in one worker, everything
  else (PostgreSQL, Redis, the suite's one Celery broker, the browser, and the jobs they run) in
  the other, each in its usual order: the platform's tests share one broker and must not run side
  by side, and each worker keeps its own session fixtures (its own Ray instance, test database,
  tiny preset).
- A few engine modules that share nothing with either stream (they run ``plexrl`` in
  subprocesses or are pure code: ``FLOATING``) wait in a shared tail, taken a whole module at a
  time by whichever worker runs out of its own tests first, the longest first. How long each stream
  takes varies with the machine's load, and a fixed split leaves one worker idle while the other
  still works; the tail evens that out.

Items are handed out by index, not node id: schemathesis's generated tests (one per API
operation) share one node id under pytest 9, and xdist's own schedulers, which key on node ids,
would run only one of them (and ``--dist loadgroup`` cannot rename pytest 9's node ids).
"""

from __future__ import annotations

from xdist.scheduler import EachScheduling

# Longest first: the first worker to run dry takes the largest module.
FLOATING = (
    "tests/engine/test_cli.py",
    "tests/engine/test_engine_service_cli.py",
    "tests/engine/test_bench_state.py",
    "tests/engine/test_sim.py",
)


def module_of(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def split(collection: list[str], floating: tuple[str, ...] = FLOATING) -> tuple[list[int], list[int], list[list[int]]]:
    """The engine stream, the other stream (indices into ``collection``, in its order) and the
    floating modules' items, one list per module in ``floating``'s order (modules not collected are
    left out)."""
    engine: list[int] = []
    rest: list[int] = []
    tail: dict[str, list[int]] = {module: [] for module in floating}
    for index, nodeid in enumerate(collection):
        module = module_of(nodeid)
        if module in tail:
            tail[module].append(index)
        elif nodeid.startswith("tests/engine/"):
            engine.append(index)
        else:
            rest.append(index)
    return engine, rest, [items for items in tail.values() if items]


class TwoStreamsAndATail(EachScheduling):
    """Worker 0 runs the engine stream, worker 1 the other (with one worker, worker 0 runs both; a
    third and later ones start on the tail); then each takes floating modules until none is left.
    (A worker that replaces a crashed one gets the dead one's rest, as xdist's ``each`` scheduler
    does.)"""

    def __init__(self, config, log=None) -> None:
        super().__init__(config, log)
        self.streams: list[list[int]] = []  # worker i's own items (indices), for the first workers
        self.tail: list[list[int]] | None = None  # the floating modules not taken yet

    @property
    def tests_finished(self) -> bool:
        return bool(super().tests_finished and self.tail is not None and not self.tail)

    @property
    def has_pending(self) -> bool:
        return bool(super().has_pending or self.tail)

    def schedule(self) -> None:
        assert self.collection_is_completed
        if self.tail is None:  # every worker collected the same run's items: split them once
            engine, rest, self.tail = split(next(iter(self.node2collection.values())))
            # -n 1: one stream of everything, in the collection's order
            self.streams = [sorted(engine + rest)] if self.numnodes == 1 else [engine, rest]
        for i, (node, pending) in enumerate(self.node2pending.items()):
            if node in self._started:
                continue
            self._started.append(node)
            if pending:  # a replacement: the dead worker's rest
                node.send_runtest_some(pending)
                continue
            pending[:] = self.streams[i] if i < len(self.streams) else []  # a third worker on: the tail only
            if pending:
                node.send_runtest_some(pending)
            self._top_up(node)

    def mark_test_complete(self, node, item_index: int, duration: float = 0) -> None:
        super().mark_test_complete(node, item_index, duration)
        self._top_up(node)

    def _top_up(self, node) -> None:
        """A worker runs an item once it knows the next one (or that none follows), so it gets the
        next floating module while it still has one item to run, or is told to finish."""
        pending = self.node2pending[node]
        if node.shutting_down or len(pending) >= 2:
            return
        if self.tail:
            module = self.tail.pop(0)
            pending.extend(module)
            node.send_runtest_some(module)
        else:
            node.shutdown()


def pytest_xdist_make_scheduler(config, log):
    return TwoStreamsAndATail(config, log)
