"""``make demo`` on a fresh machine, as a new user would run it: a clean clone, ``make install``,
then what ``make demo`` runs with ``--exit-after-jobs --no-browser``. The demo jobs must succeed,
their held-out accuracy rise (final = mean of the last three evaluations, as for ``plexrl
train``), the savings report exist, and no process the demo started may be left running.

It takes about eight minutes here (an install into a new virtualenv, the model presets built,
four jobs trained); ``pytest -s`` prints each job's figures (accuracy, bill, savings, estimate)."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from tests.platform import live

pytestmark = [pytest.mark.slow, pytest.mark.timeout(3600)]

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


def test_make_demo_from_a_clean_clone(tmp_path):
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "--quiet", str(live.REPO), str(clone)], check=True, timeout=300)
    env = {k: v for k, v in os.environ.items() if k not in (
        "DATABASE_URL", "REDIS_URL", "RAY_ADDRESS", "DJANGO_SETTINGS_MODULE", "PYTHONPATH", "VIRTUAL_ENV")}
    env["PLEXRL_HOME"] = str(tmp_path / "home")
    install = subprocess.run(["make", "install"], cwd=clone, env=env, capture_output=True, text=True, timeout=1800)
    assert install.returncode == 0, install.stdout[-3000:] + install.stderr[-3000:]

    port = live.free_port()
    log = tmp_path / "demo.log"
    with log.open("w") as out:
        demo = subprocess.run([str(clone / ".venv" / "bin" / "plexrl"), "demo", "--exit-after-jobs", "--no-browser",
                               "--port", str(port)], cwd=clone, env=env, stdout=out, stderr=subprocess.STDOUT,
                              timeout=3000)
    assert demo.returncode == 0, log.read_text()[-5000:]
    assert not live.leftovers(env), "processes left running after the demo"

    report = subprocess.run([str(clone / ".venv" / "bin" / "python"), "manage.py", "shell", "-c", REPORT],
                            cwd=clone, env=env, capture_output=True, text=True, timeout=120, check=True)
    jobs = json.loads(report.stdout.strip().splitlines()[-1])  # the shell may print a banner first
    print(json.dumps(jobs, indent=2))  # the figures for the notes (pytest -s)
    assert len(jobs) >= 3
    for job in jobs:
        assert job["state"] == "succeeded", job
        assert job["summary"]["final_accuracy"] > job["summary"]["initial_accuracy"], job
        assert job["savings"]["billed_device_hours"] > 0, job
        assert job["savings"]["counterfactual_device_hours"] > 0, job
