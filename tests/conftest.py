"""Fixtures shared by the platform's integration tests and the browser (e2e) tests."""

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def engine_home(tmp_path_factory) -> Path:
    """A data directory with the tiny-arith preset built, shared by the tests that run real jobs."""
    from tests.platform.live import build_engine_home

    return build_engine_home(tmp_path_factory.mktemp("engine-home"))
