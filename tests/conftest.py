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

# ``pytest -n 2``: the engine's tests and the platform's in two streams, and a shared tail.
from tests.streams import pytest_xdist_make_scheduler  # noqa: F401 (a hook of this conftest)


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
