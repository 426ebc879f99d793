"""Fixtures shared by the platform's integration tests and the browser (e2e) tests."""

from pathlib import Path

import pytest

# The machine's CPU-seconds per test and for the whole run, in every run's summary.
from tests.cpu_report import (  # noqa: F401 (hooks of this conftest)
    pytest_addoption,
    pytest_configure,
    pytest_runtest_protocol,
    pytest_terminal_summary,
)


def pytest_xdist_make_scheduler(config, log):
    """Two streams for ``pytest -n 2``: the engine's tests (Ray, models; no database,
    Redis or Celery) in one worker, everything else (PostgreSQL, Redis, Celery, the browser, and the
    jobs they run) in the other, each in its usual order. The halves take about as long, and
    neither keeps this machine's two CPUs busy alone (the platform's tests wait on servers and
    workers most of the time), so side by side they end sooner than one after the other (about a
    quarter, on 2 cores: the README has the runs). Each worker has its own session fixtures (its
    own Ray instance, its own test database).

    Items are handed out by index, not node id: schemathesis's generated tests (one per API
    operation) share one node id under pytest 9, and xdist's own schedulers, which key on node ids,
    would run only one of them (and ``--dist loadgroup`` cannot rename pytest 9's node ids)."""
    from xdist.scheduler import EachScheduling

    class TwoStreams(EachScheduling):
        def schedule(self) -> None:
            assert self.collection_is_completed
            for i, (node, pending) in enumerate(self.node2pending.items()):
                if node in self._started:
                    continue
                if not pending:  # a fresh worker: its stream (a replacement gets the dead one's rest)
                    collection = self.node2collection[node]
                    engine = i % 2 == 0
                    pending[:] = [k for k, nodeid in enumerate(collection)
                                  if nodeid.startswith("tests/engine/") == engine]
                    if pending:
                        node.send_runtest_some(pending)
                    node.shutdown()
                else:
                    node.send_runtest_some(pending)
                self._started.append(node)

    return TwoStreams(config, log)


@pytest.fixture(scope="session")
def engine_home(tmp_path_factory) -> Path:
    """A data directory with the tiny-arith preset built, shared by the tests that run real jobs."""
    from tests.platform.live import build_engine_home

    return build_engine_home(tmp_path_factory.mktemp("engine-home"))


@pytest.fixture(autouse=True)
def _default_plan(request, django_db_blocker):
    """The default plan exists as the migrations made it: a transactional test's flush empties
    every table, the rows migrations wrote included, so it is put back before each test."""
    if "django_db_setup" not in request.fixturenames and not request.node.get_closest_marker("django_db"):
        return
    import importlib

    from accounts.models import Plan

    starter = importlib.import_module("accounts.migrations.0003_plans").STARTER
    request.getfixturevalue("django_db_setup")
    with django_db_blocker.unblock():
        Plan.objects.get_or_create(name="starter", defaults=starter)
