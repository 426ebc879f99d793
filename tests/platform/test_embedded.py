"""``plexrl up``: the whole platform in one process tree on the embedded defaults (SQLite, an
in-memory Celery broker and channel layer, a local Ray) serves the API, runs a job through its
in-process worker and engine, pushes the job's points live over a websocket, and stops cleanly on
Ctrl-C, leaving no process behind."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from tests.platform import live

SPEC = {"task": "arith", "model": "tiny-arith", "steps": 3, "seed": 2, "rollout": "torch", "trainer": "torch",
        "grpo": {"prompts_per_step": 4, "samples_per_prompt": 4, "updates_per_step": 1, "eval_every": 3,
                 "eval_size": 10, "max_tokens": 6}}


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_plexrl_up_runs_a_job_end_to_end_and_stops_cleanly_on_ctrl_c(engine_home, tmp_path):
    from websockets.sync.client import connect

    from plexrl_client import ServiceClient

    home = tmp_path / "home"
    (home / "models").mkdir(parents=True)
    (home / "models" / "tiny-arith").symlink_to(engine_home / "models" / "tiny-arith")
    env = {k: v for k, v in os.environ.items()
           if k not in ("DATABASE_URL", "REDIS_URL", "RAY_ADDRESS", "DJANGO_SETTINGS_MODULE")}
    env |= {"PLEXRL_HOME": str(home), "PYTHONPATH": str(live.REPO)}
    port = live.free_port()
    url = f"http://127.0.0.1:{port}"
    proc = live.start([sys.executable, "-m", "plexrl", "up", "--port", str(port), "--no-browser"], env=env,
                      log=tmp_path / "up.log")
    try:
        live.wait_until(lambda: live.healthy(url), 180, "plexrl up did not serve", [proc])

        def manage(*args: str) -> str:
            done = subprocess.run([sys.executable, str(live.REPO / "manage.py"), *args], env=env, capture_output=True,
                                  text=True, timeout=120, check=True)
            return done.stdout.strip()

        manage("create_organization", "Lab", "--owner", "ada", "--password", "a-long-pass-phrase")
        token = manage("create_token", "ada")
        client = ServiceClient(url, token, timeout=30)
        job = client.submit(SPEC, name="embedded")

        points, states = set(), []
        with connect(f"ws://127.0.0.1:{port}/ws/jobs/{job['id']}/",
                     additional_headers={"Authorization": f"Bearer {token}"}) as socket:
            while not (states and states[-1] == "succeeded" and len(points) == SPEC["steps"]):
                message = json.loads(socket.recv(timeout=240))
                if message["type"] == "metrics":
                    assert message["step"] not in points, "a point arrived twice"
                    points.add(message["step"])
                elif message["type"] == "job":
                    states.append(message["job"]["state"])
                proc.check_alive()
        assert points == {1, 2, 3}
        assert client.job(job["id"])["state"] == "succeeded"
        assert len(client.metrics(job["id"])) == SPEC["steps"]
        assert [row for row in client.savings()["jobs"] if row["job"] == job["id"]]
    finally:
        proc.send_signal(signal.SIGINT)  # Ctrl-C
        try:
            code = proc.wait(timeout=90)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGUSR1)  # its threads' stacks into the log, to see where it hangs
            time.sleep(2)
            proc.stop()
            pytest.fail(f"plexrl up did not stop on Ctrl-C; its log ends:\n{proc.tail(12000)}")
    assert code == 0, proc.tail()
    assert "PlexRL: stopped." in proc.log.read_text()
    assert not live.leftovers(env), "processes left running after Ctrl-C"

    # a second run reuses the data directory: the same database, the job and its metrics still there
    again = live.start([sys.executable, "-m", "plexrl", "up", "--port", str(port), "--no-browser"], env=env,
                       log=tmp_path / "up-again.log")
    try:
        live.wait_until(lambda: live.healthy(url), 180, "plexrl up did not serve again", [again])
        assert client.job(job["id"])["state"] == "succeeded"
        assert len(client.metrics(job["id"])) == SPEC["steps"]
    finally:
        again.send_signal(signal.SIGINT)
        assert again.wait(timeout=90) == 0, again.tail()
    assert not live.leftovers(env), "processes left running after the second Ctrl-C"


def test_a_stopped_platform_exits_even_when_a_thread_never_returns():
    """What ``plexrl up`` runs after its stop: a thread left running (as a third-party one could be)
    does not keep the process alive; its stack is printed and the stop's exit status kept."""
    script = (
        "import sys, threading, time\n"
        f"sys.path.insert(0, {str(live.REPO / 'platform')!r})\n"
        "from config.embedded import exit_within\n"
        "def stuck():\n    time.sleep(3600)\n"
        "threading.Thread(target=stuck).start()\n"
        "exit_within(3, grace=1)\n"
        "sys.exit(3)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 3, done.stderr
    assert "did not exit within 1 s of stopping" in done.stderr
    assert "in stuck" in done.stderr, done.stderr  # the stalled thread's stack


def test_a_stop_that_hangs_is_bounded_and_named(capsys):
    import threading

    sys.path.insert(0, str(live.REPO / "platform"))
    from config.embedded import _bounded

    release = threading.Event()
    started = time.monotonic()
    _bounded(release.wait, 0.3, "the stuck part")
    assert time.monotonic() - started < 5
    assert "PlexRL: the stuck part did not stop within 0 s; stopping the rest" in capsys.readouterr().out
    release.set()
    _bounded(lambda: None, 5, "the quick part")
    assert "quick part" not in capsys.readouterr().out


def test_sigusr1_prints_every_threads_stack_and_ctrl_c_works_where_sigint_was_ignored():
    script = (
        "import signal, sys, time\n"
        f"sys.path.insert(0, {str(live.REPO / 'platform')!r})\n"
        "from config.embedded import install_signal_handlers\n"
        "assert signal.getsignal(signal.SIGINT) == signal.SIG_IGN, 'started as a background job'\n"
        "install_signal_handlers()\n"
        "assert signal.getsignal(signal.SIGINT) is signal.default_int_handler\n"
        "def waiting_here():\n    print('ready', flush=True)\n    time.sleep(30)\n"
        "waiting_here()\n"
    )
    # SIGINT ignored from the start, as `cmd &` in a shell without job control leaves it (CI runs so)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    try:
        assert proc.stdout.readline().strip() == "ready"
        proc.send_signal(signal.SIGUSR1)
        time.sleep(1)
        assert proc.poll() is None  # it only prints: the process goes on
    finally:
        proc.kill()
        _, err = proc.communicate(timeout=30)
    assert "in waiting_here" in err, err


@pytest.mark.parametrize("steps", ["0", "-2", "many"])
def test_demo_steps_must_be_a_positive_number(steps):
    plexrl = os.path.join(os.path.dirname(sys.executable), "plexrl")
    done = subprocess.run([plexrl, "demo", "--no-browser", "--steps", steps], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert "--steps" in lines[0]
    assert "positive number of steps" in lines[0]


@pytest.mark.django_db
def test_demo_steps_cap_each_demo_job(settings, tmp_path):
    from config import embedded
    from jobs.models import Job

    settings.PLEXRL_HOME = tmp_path  # where the demo's credentials are remembered
    embedded.demo_credentials()
    ids = embedded.submit_demo_jobs(steps=35)
    steps = [Job.objects.get(pk=pk).spec["steps"] for pk in ids]
    assert steps == [min(35, job["spec"]["steps"]) for job in embedded.DEMO_JOBS] == [35, 35, 35, 30]
    assert embedded.submit_demo_jobs(steps=5) == ids  # a second run shows the same jobs
