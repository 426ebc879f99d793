"""``plexrl engine start | status | stop``: the engine service of a production deployment, a named
detached actor on a Ray cluster of its own (here a head node started for the test), which the
command only joins: the service outlives the command that started it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import pytest

from tests.platform import live

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


@pytest.fixture
def ray_head(tmp_path):
    """A Ray head node of the test's own; (its address, the environment of the commands)."""
    env = {**os.environ, "PLEXRL_HOME": str(tmp_path / "home")}
    with live.ray_cluster(env, tmp_path) as address:
        yield address, env


def plexrl(env, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "plexrl", *args], env=env, capture_output=True, text=True,
                          timeout=180)


def test_start_status_and_stop_the_engine_service_on_a_ray_cluster(ray_head):
    address, env = ray_head
    deadline = time.monotonic() + 60
    while (status := plexrl(env, "engine", "status", "--address", address)).returncode != 1:
        assert time.monotonic() < deadline, f"the Ray head never came up: {status.stderr[-2000:]}"
        time.sleep(1)
    assert "no engine service runs" in status.stderr

    started = plexrl(env, "engine", "start", "--address", address, "--json")
    assert started.returncode == 0, started.stderr[-3000:]
    snapshot = json.loads(started.stdout)
    assert snapshot["jobs"] == {}  # groups start with the first job that needs them
    assert snapshot["wpgs"] == []
    (node,) = snapshot["nodes"]  # the head node, its device slots all free
    assert node["devices"] >= 1
    assert node["free_devices"] == node["devices"]
    assert node["node_group"] == node["id"]  # no label nor resource: a node group of its own

    # the service outlived the command that started it
    status = plexrl({**env, "RAY_ADDRESS": address}, "engine", "status", "--json")
    assert status.returncode == 0, status.stderr[-3000:]
    assert json.loads(status.stdout) == snapshot
    table = plexrl({**env, "RAY_ADDRESS": address}, "engine", "status")
    assert table.returncode == 0, table.stderr[-3000:]
    assert table.stdout.split("\n")[0].split() == ["node", "node", "group", "devices", "engine", "free", "draining"]
    assert node["id"][:12] in table.stdout
    assert "no worker group yet" in table.stdout

    # an admin drains the node (by a prefix of its id), then takes it back
    drained = plexrl(env, "engine", "drain", node["id"][:8], "--address", address)
    assert drained.returncode == 0, drained.stderr[-3000:]
    assert drained.stdout.strip() == f"node {node['id']}: draining; jobs moved: none"
    (row,) = json.loads(plexrl(env, "engine", "status", "--address", address, "--json").stdout)["nodes"]
    assert row["draining"] is True
    # a service started after this one died knows the drain
    kill = f"import ray; ray.init(address={address!r}, namespace='plexrl'); " \
           "ray.kill(ray.get_actor('plexrl-engine'), no_restart=True)"
    subprocess.run([sys.executable, "-c", kill], env=env, check=True, capture_output=True, timeout=120)
    restarted = plexrl(env, "engine", "start", "--address", address, "--json")
    assert restarted.returncode == 0, restarted.stderr[-3000:]
    (row,) = json.loads(restarted.stdout)["nodes"]
    assert row["draining"] is True
    unknown = plexrl(env, "engine", "drain", "no-such-node", "--address", address)
    assert unknown.returncode == 2
    assert unknown.stderr.strip() == "plexrl: error: node: no node of the cluster has an id starting 'no-such-node'"
    undone = plexrl(env, "engine", "drain", node["id"], "--undo", "--address", address, "--json")
    assert json.loads(undone.stdout) == {"node": node["id"], "draining": False, "moved": []}

    stopped = plexrl(env, "engine", "stop", "--address", address)
    assert stopped.returncode == 0, stopped.stderr[-3000:]
    assert plexrl(env, "engine", "status", "--address", address).returncode == 1


def test_start_without_a_cluster_is_a_one_line_error(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    done = plexrl(env, "engine", "start")
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1
    assert "ray start --head" in done.stderr


def test_a_local_engine_ignores_the_last_cluster_ray_start_left_behind():
    """`ray start` records its address in Ray's temp dir and leaves it there after the cluster
    stops; a plain ray.init() would then try to join that dead cluster. The local engine starts
    a Ray of its own regardless."""
    ray_tmp = tempfile.mkdtemp(prefix="ray-", dir="/tmp")
    try:
        os.mkdir(os.path.join(ray_tmp, "ray"))  # Ray's temp dir under RAY_TMPDIR
        with open(os.path.join(ray_tmp, "ray", "ray_current_cluster"), "w") as f:
            f.write(f"127.0.0.1:{live.free_port()}")  # nobody listens there
        env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"} | {"RAY_TMPDIR": ray_tmp}
        code = ("import ray; from engine.service.runtime import EngineConfig, start_ray; start_ray(EngineConfig()); "
                "print(ray.cluster_resources()['device']); ray.shutdown()")
        done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr[-3000:]
        assert float(done.stdout.strip().splitlines()[-1]) > 0
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)
