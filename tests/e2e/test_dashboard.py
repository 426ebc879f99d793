"""A user's session in the dashboard, end to end, against the live platform running real jobs:
sign in, submit a job (a bad value first: the server's error beside its field, nothing created),
watch curve points arrive live, pause and resume it, open the cluster timeline, cancel it, and
download the savings CSV. Screenshots: ``test-artifacts/browser/``."""

from __future__ import annotations

import csv
import io
import re
import time

import pytest
from playwright.sync_api import expect

from tests.e2e.browsing import sign_in
from tests.e2e.screenshots import screenshot

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

# Long enough to still be running when the test cancels it; small batches keep a step ~1 s.
STEPS = 400
OTHER_SPEC = {"task": "arith", "model": "tiny-arith", "steps": 40, "seed": 1, "rollout": "torch", "trainer": "torch",
              "grpo": {"prompts_per_step": 4, "samples_per_prompt": 4, "updates_per_step": 1, "eval_every": 20,
                       "eval_size": 10, "max_tokens": 6}}


def _rows(page) -> int:
    return page.locator("#step-rows tr").count()


def _wait_for_rows(page, at_least: int, timeout_s: float = 180) -> int:
    # a locator wait, not wait_for_function: that evaluates a string, which the page's CSP forbids
    expect(page.locator("#step-rows tr").nth(at_least - 1)).to_be_attached(timeout=timeout_s * 1000)
    return _rows(page)


def _upload_a_model_and_a_dataset(page, tmp_path) -> None:
    """The library page: a pickled model refused beside its field (nothing kept), then a tiny
    model and a CSV dataset with mapped columns uploaded; the model is then a choice of the submit
    form."""
    from jobs.models import Dataset, RegisteredModel
    from tests.datafiles import csv_bytes
    from tests.modelfiles import build_tiny_model

    folder = build_tiny_model(tmp_path / "my-qwen")
    page.get_by_role("link", name="Models & data", exact=True).click()
    expect(page.locator("#model-form")).to_have_attribute("data-ready", "true")
    page.get_by_label("Name", exact=True).first.fill("my-qwen")
    (tmp_path / "pytorch_model.bin").write_bytes(b"pickle")
    page.get_by_label("Files of the model folder").set_input_files(
        [*sorted(folder.iterdir()), tmp_path / "pytorch_model.bin"])
    page.get_by_role("button", name="Upload model", exact=True).click()
    expect(page.locator("#model-files-error")).to_contain_text("pickle-based weights are not accepted")
    expect(page.locator("#model-uploaded")).to_be_hidden()  # no "under way" left behind
    assert not RegisteredModel.objects.exists()
    page.get_by_label("Files of the model folder").set_input_files(sorted(folder.iterdir()))
    page.get_by_role("button", name="Upload model", exact=True).click()
    # the check builds the architecture (a cold server imports torch and transformers first: about 3 s
    # on an idle 2-core machine, more under the suite's load); the status line says it is under way
    expect(page.locator("#model-uploaded")).to_contain_text("Uploaded model my-qwen: Qwen2ForCausalLM",
                                                            timeout=30_000)
    expect(page.locator('#model-rows tr[data-scope="organization"]')).to_contain_text("my-qwen")

    rows = [{"question": f"{i}+{i}=", "solution": str(2 * i)} for i in range(5)]
    (tmp_path / "sums.csv").write_bytes(csv_bytes(rows))
    (tmp_path / "eval.csv").write_bytes(csv_bytes(rows[:2]))
    page.locator("#dataset-name").fill("sums")
    page.get_by_label("File", exact=True).set_input_files(tmp_path / "sums.csv")
    page.get_by_label("Evaluation file (optional)").set_input_files(tmp_path / "eval.csv")
    page.get_by_label("Prompt column").fill("question")
    page.get_by_label("Answer column").fill("solution")
    page.get_by_role("button", name="Upload dataset", exact=True).click()
    expect(page.locator("#dataset-uploaded")).to_contain_text("Uploaded dataset sums: 5 problems.")
    expect(page.locator("#dataset-rows tr")).to_have_count(1)
    assert (Dataset.objects.get().problems, Dataset.objects.get().eval_problems) == (5, 2)
    screenshot(page, "library")
    page.get_by_role("link", name="Submit", exact=True).click()
    expect(page.locator("#job-form")).to_have_attribute("data-ready", "true")
    expect(page.get_by_label("Model", exact=True).locator("option", has_text="my-qwen")).to_have_count(1)


def test_sign_in_submit_watch_pause_resume_cluster_cancel_and_download(page, live_platform, tmp_path):
    from accounts.services import organization_create
    from jobs import services
    from jobs.models import Job, JobEvent, JobMetric, JobState
    from tests.platform.factories import PASSWORD, UserFactory

    owner = UserFactory(username="ada")
    organization_create(name="Acme", owner=owner)
    rival = UserFactory(username="grace")
    globex = organization_create(name="Globex", owner=rival)
    sign_in(page, "ada", PASSWORD)
    _upload_a_model_and_a_dataset(page, tmp_path)

    # --- submit: a bad value first ---------------------------------------------------------------
    page.get_by_role("link", name="Submit", exact=True).click()
    expect(page.locator("#job-form")).to_have_attribute("data-ready", "true")
    page.get_by_label("Name", exact=True).fill("browser job")
    page.get_by_label("Model", exact=True).select_option("tiny-arith")
    page.get_by_label("Rollout backend", exact=True).select_option("torch")  # the small, quick backends
    page.get_by_label("Training backend", exact=True).select_option("torch")
    page.get_by_label("Steps", exact=True).fill("0")
    page.get_by_role("button", name="Submit job", exact=True).click()
    expect(page.locator('[data-error-for="spec.steps"]')).not_to_be_empty()
    assert not Job.objects.exists(), "a rejected submission created a job"

    page.get_by_label("Steps", exact=True).fill(str(STEPS))
    page.get_by_label("Seed", exact=True).fill("3")
    page.get_by_label("Prompts per step", exact=True).fill("4")
    page.get_by_label("Samples per prompt", exact=True).fill("4")
    page.get_by_label("Updates per step", exact=True).fill("1")
    page.get_by_label("Max tokens", exact=True).fill("6")
    page.get_by_label("Evaluate every (steps)", exact=True).fill("5")
    page.get_by_label("Evaluation problems", exact=True).fill("10")
    # --- the pre-run estimate of the form as it is ---------------------------------------------------
    page.get_by_role("button", name="Estimate", exact=True).click()
    estimate = page.locator("#estimate")
    expect(estimate).to_have_attribute("data-state", "ready")
    expect(estimate).to_contain_text("Dedicated:")
    shown = float(estimate.get_attribute("data-multiplexed"))
    assert 0 < shown < float(estimate.get_attribute("data-dedicated"))
    page.get_by_role("button", name="Submit job", exact=True).click()
    expect(page).to_have_url(re.compile(r"/jobs/\d+/$"), timeout=30_000)
    job = Job.objects.get(organization__name="Acme")
    assert job.estimate["multiplexed_device_hours"] == shown  # what the form showed is what was stored
    expect(page.locator("#job-estimated")).to_have_attribute(
        "data-multiplexed", str(job.estimate["multiplexed_device_hours"]))
    # another organization's job shares the worker groups: on the timeline it is "other organization"
    services.job_create(organization=globex, user=rival, spec=OTHER_SPEC, name="globex secret")
    assert page.url.endswith(f"/jobs/{job.pk}/")
    assert job.spec["steps"] == STEPS
    assert job.spec["seed"] == 3

    # --- live points ------------------------------------------------------------------------------
    _wait_for_rows(page, 3)
    expect(page.locator("#live-status")).to_have_attribute("data-connected", "true")
    points = int(page.locator("#chart-reward").get_attribute("data-points"))
    assert points >= 3
    # each step's phase timings as a stacked bar, and any other logged metric as a chart on demand
    expect(page.locator("#chart-timings")).not_to_have_attribute("data-points", "0")
    page.locator("#metric-add").select_option("response_length")
    expect(page.locator('figure[data-metric="response_length"]')).not_to_have_attribute("data-points", "0")
    screenshot(page, "job-detail-live")

    # --- pause: the engine stops between calls; no step completes while it is paused -------------
    page.get_by_role("button", name="Pause", exact=True).click()
    expect(page.locator("#job-state")).to_have_attribute("data-state", "paused")
    live_platform.wait_until(
        lambda: JobEvent.objects.filter(job=job, kind="state", data__state="paused").exists(), 60,
        "the engine did not report the job paused")
    # the call that was running when it paused may still end its step: wait until the table settles
    held, deadline = _rows(page), time.monotonic() + 60
    while time.monotonic() < deadline:
        time.sleep(3)
        if _rows(page) == held:
            break
        held = _rows(page)
    time.sleep(6)
    assert _rows(page) == held, "steps arrived while the job was paused"
    assert Job.objects.get(pk=job.pk).state == JobState.PAUSED

    page.get_by_role("button", name="Resume", exact=True).click()
    expect(page.locator("#job-state")).to_have_attribute("data-state", "running")
    _wait_for_rows(page, held + 2)

    # --- the cluster's device timeline shows the job's calls -------------------------------------
    page.get_by_role("link", name="Cluster", exact=True).click()
    expect(page.locator("#timeline")).to_have_attribute("data-window", "600")  # drawn: the module runs
    page.get_by_label("Window", exact=True).select_option("120")
    expect(page.locator("#timeline")).to_have_attribute("data-window", "120")
    expect(page.locator(f'#timeline [data-job="{job.pk}"]').first).to_be_visible(timeout=30_000)
    expect(page.locator('#timeline [data-job="other"]').first).to_be_visible(timeout=30_000)
    expect(page.locator("#timeline-legend")).to_contain_text("other organization")
    expect(page.get_by_text("globex secret")).to_have_count(0)
    screenshot(page, "cluster-timeline")

    # --- cancel -----------------------------------------------------------------------------------
    page.goto(f"/jobs/{job.pk}/")
    page.get_by_role("button", name="Cancel", exact=True).click()
    expect(page.locator("#job-state")).to_have_attribute("data-state", "cancelled")
    live_platform.wait_until(lambda: Job.objects.get(pk=job.pk).events_complete, 120,
                             "the cancelled job's event log was not fully ingested")

    # every step the engine logged is in the table exactly once
    page.reload()
    steps = list(JobMetric.objects.filter(job=job).order_by("step").values_list("step", flat=True))
    _wait_for_rows(page, len(steps), timeout_s=30)
    shown = [int(s) for s in page.locator("#step-rows tr").evaluate_all("rows => rows.map(r => r.dataset.step)")]
    assert sorted(shown) == steps

    # --- billing: the job's savings row and the CSV download ------------------------------------
    page.get_by_role("link", name="Billing", exact=True).click()
    expect(page.locator(f'[data-job="{job.pk}"]').first).to_be_visible()
    screenshot(page, "billing")
    with page.expect_download() as download:
        page.get_by_role("link", name="Download CSV", exact=True).click()
    rows = list(csv.DictReader(io.StringIO(download.value.path().read_text())))
    assert [row for row in rows if str(job.pk) in row.values()], f"no row for job {job.pk} in {rows[:3]}"
