"""``plexrl engine start | status | stop``: the engine service of a production deployment, a named
detached actor on a Ray cluster of its own (here a head node started for the test), which the
command only joins: the service outlives the command that started it."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def ray_head(tmp_path):
    """``ray start --head --block`` in a session of its own: stopping it stops its daemons, and no
    other Ray on the machine (``ray stop`` would stop them all)."""
    port = _free_port()
    env = {**os.environ, "RAY_AUTH_MODE": "disabled"}
    env.pop("RAY_ADDRESS", None)
    log = (tmp_path / "ray-head.log").open("w")
    # A temp dir of its own (short: Ray's socket paths must fit in 107 bytes), so the "last
    # cluster" address `ray start` records is not left in /tmp/ray for every later ray.init().
    ray_tmp = tempfile.mkdtemp(prefix="ray-", dir="/tmp")
    head = subprocess.Popen(
        [sys.executable, "-m", "ray.scripts.scripts", "start", "--head", "--block", f"--port={port}",
         f"--temp-dir={ray_tmp}", "--num-cpus=2", '--resources={"device": 2}', "--include-dashboard=false",
         "--disable-usage-stats"],
        env=env, start_new_session=True, stdout=log, stderr=subprocess.STDOUT)
    address = f"127.0.0.1:{port}"
    yield address, env | {"PLEXRL_HOME": str(tmp_path / "home")}
    os.killpg(head.pid, signal.SIGTERM)
    try:
        head.wait(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(head.pid, signal.SIGKILL)
    shutil.rmtree(ray_tmp, ignore_errors=True)


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

    started = plexrl(env, "engine", "start", "--address", address)
    assert started.returncode == 0, started.stderr[-3000:]
    snapshot = json.loads(started.stdout)
    assert snapshot["jobs"] == {}  # groups start with the first job that needs them

    # the service outlived the command that started it
    status = plexrl({**env, "RAY_ADDRESS": address}, "engine", "status")
    assert status.returncode == 0, status.stderr[-3000:]
    assert json.loads(status.stdout) == snapshot

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
            f.write(f"127.0.0.1:{_free_port()}")  # nobody listens there
        env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"} | {"RAY_TMPDIR": ray_tmp}
        code = ("import ray; from engine.runtime import EngineConfig, start_ray; start_ray(EngineConfig()); "
                "print(ray.cluster_resources()['device']); ray.shutdown()")
        done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr[-3000:]
        assert float(done.stdout.strip().splitlines()[-1]) > 0
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)
