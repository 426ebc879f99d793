"""Runs side by side in the browser: on the job list a user sorts by reward, ticks two runs and
opens the compare page, which draws both runs' curves on each chart and shows where their specs
differ. The server is daphne on the test database; the runs' metrics are ingested as the worker's
pull brings them. Screenshots: ``test-artifacts/browser/``."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest
from playwright.sync_api import expect

from tests.e2e.browsing import sign_in
from tests.e2e.screenshots import screenshot
from tests.platform import live

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(300)]

SPEC = {"task": "arith", "model": "tiny-arith", "steps": 6, "seed": 1, "rollout": "torch", "trainer": "torch"}


@pytest.fixture(scope="module")
def server(django_db_setup, tmp_path_factory) -> Iterator[str]:
    home = tmp_path_factory.mktemp("compare")
    env = live.platform_env(home)
    del env["REDIS_URL"]  # no worker: nothing the pages send to Celery runs
    proc, url = live.asgi_server(env, home)
    yield url
    proc.stop()


def run(organization, owner, name: str, lr: float, rewards: list[float]):
    """A finished job whose engine log held these steps."""
    from jobs.ingest import ingest_events
    from jobs.models import Job, JobState

    job = Job.objects.create(organization=organization, created_by=owner, name=name, state=JobState.RUNNING,
                             spec={**SPEC, "grpo": {"lr": lr, "prompts_per_step": 8}})
    events = []
    for step, reward in enumerate(rewards, start=1):
        events.append({"seq": 2 * step - 1, "kind": "metrics", "ts": 1000.0 + step, "data": {
            "step": step, "reward_mean": reward, "loss": 0.1 / step, "grad_norm": 1.0 + step,
            "phase_seconds": {"generate": 0.5, "train": 0.25},
            **({"eval_accuracy": reward / 2} if step % 3 == 0 else {})}})
        events.append({"seq": 2 * step, "kind": "timings", "ts": 1000.5 + step, "data": {
            "step": step, "generate": 0.6, "reward": 0.01, "logprobs": 0.1, "train": 0.3, "sync": 0.05, "eval": 0.0,
            "total": 1.06}})
    ingest_events(job=job, events=[*events, {"seq": 2 * len(rewards) + 1, "kind": "state", "ts": 2000.0,
                                              "data": {"state": "succeeded"}}])
    return job


def test_two_runs_picked_on_the_job_list_are_compared_curve_by_curve_with_their_spec_difference(browser, server):
    from accounts.services import organization_create
    from tests.platform.factories import PASSWORD, UserFactory

    owner = UserFactory(username="ada")
    organization = organization_create(name="Acme", owner=owner)
    slow = run(organization, owner, "slow lr", 1e-4, [0.1, 0.15, 0.2, 0.22, 0.25, 0.3])
    fast = run(organization, owner, "fast lr", 1e-3, [0.1, 0.3, 0.5, 0.6, 0.7, 0.8])
    run(organization, owner, "third", 1e-3, [0.4])

    context = browser.new_context(base_url=server, viewport={"width": 1366, "height": 900})
    page = context.new_page()
    sign_in(page, "ada", PASSWORD)
    expect(page.locator("#job-table")).to_have_attribute("data-loaded", "true")

    # the list's reward column, sorted by the server: best first, then (a second click) worst first
    page.get_by_role("button", name="Reward", exact=True).click()
    expect(page).to_have_url(re.compile(r"ordering=-latest_reward"))
    expect(page.locator("#job-rows tr td:nth-child(3)")).to_have_text(["fast lr", "third", "slow lr"])
    page.get_by_role("button", name="Reward", exact=True).click()
    expect(page.locator("#job-rows tr td:nth-child(3)")).to_have_text(["slow lr", "third", "fast lr"])
    expect(page.locator("th", has=page.get_by_role("button", name="Reward", exact=True))).to_have_attribute(
        "aria-sort", "ascending")
    expect(page.locator(f'tr[data-job="{fast.pk}"] td:nth-child(6)')).to_have_text("0.800")
    compare = page.get_by_role("button", name=re.compile("Compare selected runs"))
    expect(compare).to_be_disabled()
    page.get_by_label(f"Compare job {slow.pk}").check()
    page.get_by_label(f"Compare job {fast.pk}").check()
    expect(compare).to_be_enabled()
    screenshot(page, "job-list-compare")
    compare.click()
    expect(page).to_have_url(re.compile(rf"/compare/\?jobs={slow.pk},{fast.pk}$"))

    # both runs' curves on each chart, and the one spec field that differs
    charts = page.locator("#compare-charts")
    expect(charts).to_have_attribute("data-loaded", "true")
    for metric, points in (("reward_mean", "6"), ("eval_accuracy", "2"), ("loss", "6")):
        figure = page.locator(f'figure[data-metric="{metric}"]')
        expect(figure).to_have_attribute("data-points", points)
        expect(figure).to_have_attribute(f"data-run{slow.pk}", "drawn")
        expect(figure).to_have_attribute(f"data-run{fast.pk}", "drawn")
    page.locator("#metric-add").select_option("phase_seconds/generate")  # any logged metric, timings too
    expect(page.locator('figure[data-metric="phase_seconds/generate"]')).to_have_attribute("data-points", "6")
    rows = page.locator("#spec-differences tbody tr")
    expect(rows).to_have_count(1)
    expect(rows.first).to_have_attribute("data-field", "grpo.lr")
    expect(rows.first.locator("td")).to_have_text(["0.0001", "0.001"])
    screenshot(page, "compare")

    # one run's page: each step's phases as a stacked bar, any other logged metric as a chart on demand
    page.goto(f"/jobs/{fast.pk}/")
    expect(page.locator("#chart-timings")).to_have_attribute("data-points", "6")
    page.locator("#metric-add").select_option("grad_norm")
    expect(page.locator('#more-charts figure[data-metric="grad_norm"]')).to_have_attribute("data-points", "6")
    screenshot(page, "job-detail-timings")

    page.goto(f"/compare/?jobs={slow.pk}")  # one run is nothing to compare
    expect(page.locator("#compare-error")).to_contain_text("Pick 2 to 8 runs")
    context.close()


def test_a_yaml_spec_submitted_by_the_cli_gives_the_same_job_as_the_same_values_in_the_form(browser, server,
                                                                                           tmp_path):
    import os
    import subprocess
    import sys

    from accounts.services import organization_create, token_create
    from jobs.models import Job
    from tests.platform.factories import PASSWORD, UserFactory

    owner = UserFactory(username="grace")
    organization = organization_create(name="Initech", owner=owner)
    context = browser.new_context(base_url=server, viewport={"width": 1366, "height": 900})
    page = context.new_page()
    sign_in(page, "grace", PASSWORD)
    page.goto("/jobs/new/")
    expect(page.locator("#job-form")).to_have_attribute("data-ready", "true")
    page.get_by_label("Name", exact=True).fill("same")
    page.get_by_label("Model", exact=True).select_option("tiny-arith")
    page.get_by_label("Rollout backend", exact=True).select_option("torch")
    page.get_by_label("Training backend", exact=True).select_option("torch")
    page.get_by_label("Steps", exact=True).fill("7")
    page.get_by_label("Seed", exact=True).fill("3")
    page.get_by_label("Learning rate", exact=True).fill("0.001")
    page.get_by_label("Max tokens", exact=True).fill("12")
    page.get_by_label("Upper clip ε (0: clip ε)", exact=True).fill("0.28")  # a field the form lacked before
    page.get_by_label("Learning-rate schedule", exact=True).select_option("constant")
    page.get_by_label("Shuffle rewards (negative control)").check()
    page.get_by_role("button", name="Submit job", exact=True).click()
    expect(page).to_have_url(re.compile(r"/jobs/\d+/$"), timeout=30_000)
    context.close()

    spec_file = tmp_path / "spec.yaml"
    spec_file.write_text("name: same\nmodel: tiny-arith\nrollout: torch\ntrainer: torch\nsteps: 7\nseed: 3\n"
                         "grpo:\n  lr: 0.001\n  max_tokens: 12\n  clip_eps_high: 0.28\n  lr_schedule: constant\n"
                         "  shuffle_rewards: true\n")
    token = token_create(user=owner, organization=organization, name="cli")[1]
    env = {k: v for k, v in os.environ.items() if not k.startswith("PLEXRL_")} | {
        "PLEXRL_URL": server, "PLEXRL_TOKEN": token}
    done = subprocess.run([sys.executable, "-m", "plexrl", "jobs", "submit", str(spec_file)], env=env,
                          capture_output=True, text=True, timeout=120, cwd=live.REPO)
    assert done.returncode == 0, done.stderr
    from_form, from_cli = Job.objects.filter(organization=organization).order_by("pk")
    assert from_cli.pk == int(done.stdout.strip())
    assert from_form.spec == from_cli.spec
    assert (from_form.spec["grpo"]["clip_eps_high"], from_form.spec["grpo"]["shuffle_rewards"]) == (0.28, True)
    assert (from_form.name, from_form.rollout_devices, from_form.deployment_mode) == (
        from_cli.name, from_cli.rollout_devices, from_cli.deployment_mode)
