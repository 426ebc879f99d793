"""``make demo`` as a new user would run it: what ``make demo`` runs (``plexrl demo``), with
``--exit-after-jobs --no-browser``, on a fresh data directory, so the model presets are built first
as on a new machine. The demo jobs must succeed, their held-out accuracy rise (final = mean of the
last three evaluations, as for ``plexrl train``), the savings report exist, and no process the demo
started may be left running.

The install half of ``make demo`` (``make install`` from a clean clone) is what ``.ci/run`` itself
does before ``make test``, so this test uses that installation instead of making a second one.
``pytest -s`` prints each job's figures (accuracy, bill, savings, estimate)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.platform import live

pytestmark = [pytest.mark.slow, pytest.mark.timeout(3600)]

# Each demo job for at most this many steps (30-40 in full; the full demo takes ~9 minutes here,
# a third of the suite): enough for every job's held-out accuracy to rise.
DEMO_STEPS = 20

REPORT = """
import json
from billing.selectors import job_savings
from jobs.models import Job
rows = []
for job in Job.objects.order_by("id"):
    summary = job.events.filter(kind="summary").values_list("data", flat=True).first() or {}
    rows.append({"id": job.pk, "name": job.name, "state": job.state, "summary": summary,
                 "savings": job_savings(job=job), "estimate": getattr(job, "estimate", None)})
print(json.dumps(rows, default=str))
"""


def test_make_demo_runs_plexrl_demo():
    plan = subprocess.run(["make", "-n", "demo"], cwd=live.REPO, capture_output=True, text=True, timeout=60,
                          check=True)
    assert ".venv/bin/plexrl demo" in plan.stdout, plan.stdout


def test_demo_on_a_fresh_data_directory(tmp_path):
    plexrl = Path(sys.executable).parent / "plexrl"
    env = {k: v for k, v in os.environ.items() if k not in (
        "DATABASE_URL", "REDIS_URL", "RAY_ADDRESS", "DJANGO_SETTINGS_MODULE", "PYTHONPATH")}
    env["PLEXRL_HOME"] = str(tmp_path / "home")
    port = live.free_port()
    log = tmp_path / "demo.log"
    with log.open("w") as out:
        demo = subprocess.run([str(plexrl), "demo", "--exit-after-jobs", "--no-browser", "--port", str(port),
                               "--steps", str(DEMO_STEPS)],
                              cwd=tmp_path, env=env, stdout=out, stderr=subprocess.STDOUT, timeout=3000)
    assert demo.returncode == 0, log.read_text()[-5000:]
    assert not live.leftovers(env), "processes left running after the demo"

    report = subprocess.run([sys.executable, str(live.REPO / "manage.py"), "shell", "-c", REPORT],
                            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120, check=True)
    jobs = json.loads(report.stdout.strip().splitlines()[-1])  # the shell may print a banner first
    print(json.dumps(jobs, indent=2))  # the figures for the notes (pytest -s)
    assert len(jobs) >= 3
    for job in jobs:
        assert job["state"] == "succeeded", job
        assert job["summary"]["final_accuracy"] > job["summary"]["initial_accuracy"], job
        assert job["savings"]["billed_device_hours"] > 0, job
        assert job["savings"]["counterfactual_device_hours"] > 0, job
