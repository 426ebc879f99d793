"""``plexrl demo``'s set-up (config.embedded): the demo organization, its admin and token made once
and remembered, the demo jobs submitted once and valid for the platform, a tool-using one among
them. (The whole demo from a clean clone: tests/e2e/test_demo.py.)"""

import stat

import pytest

from config import embedded
from jobs.models import Job


@pytest.fixture
def home(tmp_path, settings):
    settings.PLEXRL_HOME = tmp_path
    return tmp_path


@pytest.mark.django_db
def test_credentials_are_made_once_and_kept_private(home, client):
    first = embedded.demo_credentials()
    path = home / embedded.CREDENTIALS_FILE
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert embedded.demo_credentials() == first  # a second run signs in with the same ones
    assert client.login(username=first["username"], password=first["password"])
    response = client.get("/api/v1/jobs/", HTTP_AUTHORIZATION=f"Bearer {first['token']}")
    assert response.status_code == 200


@pytest.mark.django_db
def test_the_demo_jobs_are_submitted_once(home, django_capture_on_commit_callbacks):
    embedded.demo_credentials()
    with django_capture_on_commit_callbacks():  # their launches are Celery sends after commit
        ids = embedded.submit_demo_jobs()
    assert len(ids) == len(embedded.DEMO_JOBS) >= 3
    assert embedded.submit_demo_jobs() == ids
    # the demo's plan runs them all at once, side by side on the shared groups: none waits for a slot
    assert not Job.objects.filter(pk__in=ids, waiting_for_slot=True).exists()
    jobs = Job.objects.filter(pk__in=ids)
    assert {job.spec["task"] for job in jobs} >= {"arith", "arith-tools"}  # one stalls on tool calls
    assert len({(job.spec["grpo"]["updates_per_step"], job.spec["task"]) for job in jobs}) >= 3  # shapes differ
