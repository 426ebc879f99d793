"""engine.support.collector: the cyclic collector paused around a block, and restored after it."""

from __future__ import annotations

import gc

import pytest

from engine.support.collector import collector_paused


def _fails_inside() -> None:
    with collector_paused():
        assert not gc.isenabled()
        raise RuntimeError("boom")


def test_the_collector_is_off_inside_and_back_on_after_even_on_error():
    assert gc.isenabled()
    with pytest.raises(RuntimeError, match="boom"):
        _fails_inside()
    assert gc.isenabled()


def test_a_collector_that_was_off_stays_off():
    gc.disable()
    try:
        with collector_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()
    finally:
        gc.enable()
