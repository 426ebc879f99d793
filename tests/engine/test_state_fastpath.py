"""A swap's calls to the StateManager actor go over its node socket (``engine.state.fastpath``):
answered there, errors included, and through the actor when the manager has no socket."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest
import ray
import torch

from engine.state.layout import WHOLE
from engine.state.manager import StateManager
from engine.state.rank_client import StateClient
from engine.state.store import UnknownKey


def _manager(tmp_path, host_dir: str):
    return StateManager.options(num_cpus=0).remote(str(tmp_path / "state"), host_dir, 1 << 30)


def _round_trip(client: StateClient) -> None:
    state = {(f"layer.{i}.weight", WHOLE): torch.full((64, 8), float(i)) for i in range(4)}
    client.write("job/policy", state)
    out, _ = client.read("job/policy", list(state))
    assert all(torch.equal(out[k], t) for k, t in state.items())
    with pytest.raises(UnknownKey, match="nope"):  # raised in the manager, re-raised here
        client.read("job/policy", [("nope", WHOLE)])


def test_swap_calls_go_over_the_node_socket(ray_engine, tmp_path):
    short = tempfile.mkdtemp(prefix="plexrl-test-")  # a socket's path must stay under 108 bytes
    manager = _manager(tmp_path, str(Path(short) / "host"))
    try:
        path = ray.get(manager.endpoint.remote())
        assert path is not None
        client = StateClient(lambda: manager, "wpg")
        _round_trip(client)
        # reserve, commit, plan_read, done_read and the failed plan_read: all on the socket
        assert ray.get(manager.socket_calls.remote()) == 5
    finally:
        ray.get(manager.close.remote())
        ray.kill(manager)
        shutil.rmtree(short, ignore_errors=True)


def test_a_reads_release_goes_unanswered_and_is_served_before_the_next_call(ray_engine, tmp_path):
    short = tempfile.mkdtemp(prefix="plexrl-test-")
    manager = _manager(tmp_path, str(Path(short) / "host"))
    try:
        client = StateClient(lambda: manager, "wpg")
        state = {(f"layer.{i}.weight", WHOLE): torch.full((64, 8), float(i)) for i in range(4)}
        client.write("job/policy", state)
        client.read("job/policy", list(state))  # its release is sent, not answered
        # this thread's next call gets its own answer (no stray reply) and finds the release done
        token, items = client.plan("job/policy", list(state))
        assert [(name, shard) for name, shard, _ in items] == list(state)
        transfers = ray.get(manager.stats.remote())["transfers"]["job/policy"]
        read = transfers["host->device"]
        assert (read["bytes"], read["count"]) == (4 * 64 * 8 * 4, 1)
        assert read["seconds"] > 0
        client.release(token)
        # an unanswered call that fails is the manager's to log; the connection goes on
        client._fast.send("record", ("job/policy", "sideways", 1, 0.1))
        token, items = client.plan("job/policy", list(state))
        client.release(token)
        assert len(items) == len(state)
        client.call("abort", "no-such-token")  # answered: everything sent before it was served
        # reserve, commit, three plans and their releases, the record, the abort
        assert ray.get(manager.socket_calls.remote()) == 10
    finally:
        ray.get(manager.close.remote())
        ray.kill(manager)
        shutil.rmtree(short, ignore_errors=True)


def test_a_manager_without_a_socket_serves_swaps_through_the_actor(ray_engine, tmp_path):
    long_dir = str(tmp_path / ("h" * 120))  # longer than a Unix socket's path may be
    manager = _manager(tmp_path, long_dir)
    try:
        assert ray.get(manager.endpoint.remote()) is None
        client = StateClient(lambda: manager, "wpg")
        _round_trip(client)
        assert ray.get(manager.socket_calls.remote()) == 0
        assert not client._fast.available  # asked once, then straight to the actor
    finally:
        ray.get(manager.close.remote())
        ray.kill(manager)


def test_a_read_whose_manager_died_ends_on_the_next_one(ray_engine, tmp_path, kill_state_manager):
    """A rank plans a read, the manager is killed before the rank releases it: the release goes to
    the new manager (a no-op there: the pins died with the old one) instead of failing the read,
    and the state is read back from disk through the new manager."""
    from ray.exceptions import RayActorError

    short = tempfile.mkdtemp(prefix="plexrl-test-")
    host = str(Path(short) / "host")
    managers = [_manager(tmp_path, host)]

    def connect():
        try:
            ray.get(managers[-1].endpoint.remote())
        except RayActorError:
            managers.append(_manager(tmp_path, host))
        return managers[-1]

    try:
        client = StateClient(connect, "wpg")
        state = {(f"layer.{i}.weight", WHOLE): torch.full((64, 8), float(i)) for i in range(4)}
        client.write("job/policy", state)
        client.call("materialize", "job/policy")
        token, _ = client.plan("job/policy", list(state))
        kill_state_manager(managers[0])
        client.call("done_read", token, ("job/policy", 1, 0.1))  # must not raise
        assert len(managers) == 2
        out, _ = client.read("job/policy", list(state))
        assert all(torch.equal(out[k], t) for k, t in state.items())
    finally:
        ray.get(managers[-1].close.remote())
        for m in managers:
            ray.kill(m)
        shutil.rmtree(short, ignore_errors=True)
