"""The dashboard's web pages (config.pages): who may see each, what they load, and the static files.

The pages are thin (their ES modules read the API); these tests check the server side: sign-in
first, the module each page loads, the tenant-scoped job page, the staff-only report and the
navigation bar.
"""

import json
import re

import pytest

from jobs import services
from jobs.models import Job
from tests.platform.factories import PASSWORD, UserFactory

PAGES = {
    "/jobs/": "js/jobs.js",
    "/jobs/new/": "js/job_new.js",
    "/cluster/": "js/cluster.js",
    "/billing/": "js/billing.js",
    "/tokens/": "js/tokens.js",
    "/library/": "js/library.js",
    "/notifications/": "js/notifications.js",
}


def make_job(tenant, *, name="run") -> Job:
    return services.job_create(organization=tenant.organization, user=tenant.member,
                               spec={"task": "arith", "steps": 3}, name=name)


def page_data(response) -> dict:
    """What the page hands its module (the json_script #page-data)."""
    match = re.search(rb'<script id="page-data" type="application/json">(.*?)</script>', response.content, re.S)
    assert match, "no #page-data"
    return json.loads(match.group(1))


@pytest.mark.django_db
def test_root_redirects_to_the_job_list(client):
    response = client.get("/")
    assert response.status_code == 302
    assert response["Location"] == "/jobs/"


@pytest.mark.django_db
@pytest.mark.parametrize("url", [*PAGES, "/jobs/1/", "/staff/savings/", "/compare/?jobs=1,2"])
def test_anonymous_users_are_sent_to_sign_in(client, url):
    response = client.get(url)
    assert response.status_code == 302
    assert response["Location"].startswith("/accounts/login/?next=")


@pytest.mark.django_db
@pytest.mark.parametrize(("url", "module"), PAGES.items())
def test_pages_render_for_a_member_with_their_module(tenant, session_client, url, module):
    response = session_client(tenant.viewer).get(url)
    assert response.status_code == 200
    html = response.content.decode()
    assert f'<script type="module" src="/static/{module}"></script>' in html
    assert 'name="csrf-token"' in html
    assert page_data(response)["organization"] == tenant.organization.pk


@pytest.mark.django_db
def test_the_submit_form_starts_at_the_engine_defaults_and_knows_who_may_submit(tenant, session_client):
    from engine.spec import GRPOConfig

    member = session_client(tenant.member).get("/jobs/new/")
    html = member.content.decode()
    assert 'name="spec.grpo.prompts_per_step"' in html
    assert f'value="{GRPOConfig().prompts_per_step}"' in html
    for name in ("spec.steps", "rollout_devices", "train_devices", "deployment_mode"):
        assert f'data-error-for="{name}"' in html  # where the API's field errors go
    assert page_data(member)["can_write"] is True
    assert page_data(session_client(tenant.viewer).get("/jobs/new/"))["can_write"] is False


@pytest.mark.django_db
def test_the_submit_form_has_a_labelled_estimate_and_the_job_page_estimated_vs_billed(tenant, session_client):
    from jobs import services

    html = session_client(tenant.member).get("/jobs/new/").content.decode()
    assert '<output id="estimate" for="job-form" aria-live="polite"' in html
    assert 'aria-labelledby="estimate-title"' in html
    assert '<button type="button" id="estimate-job">Estimate</button>' in html
    viewer = session_client(tenant.viewer).get("/jobs/new/").content.decode()
    assert '<button type="button" id="estimate-job" disabled>' in viewer  # the API refuses viewers
    job = services.job_create(organization=tenant.organization, user=tenant.member, spec={"steps": 3})
    detail = session_client(tenant.viewer).get(f"/jobs/{job.pk}/").content.decode()
    assert 'id="job-estimated"' in detail
    assert 'id="job-billed"' in detail


@pytest.mark.django_db
def test_the_submit_form_offers_the_engines_backends_at_their_defaults(tenant, session_client):
    from engine.spec import ROLLOUT_BACKENDS, TRAINER_BACKENDS, default_rollout, default_trainer

    html = session_client(tenant.member).get("/jobs/new/").content.decode()
    for name, known, default in (("rollout", ROLLOUT_BACKENDS, default_rollout()),
                                 ("trainer", TRAINER_BACKENDS, default_trainer())):
        assert f'name="spec.{name}"' in html
        assert f'data-error-for="spec.{name}"' in html
        for choice in known:
            assert f'<option value="{choice}"' in html
        assert f'<option value="{default}" selected>' in html


@pytest.mark.django_db
@pytest.mark.parametrize(("query", "window"), [("", 600), ("?window=120", 120), ("?window=3600", 3600),
                                               ("?window=7", 600), ("?window=x", 600)])
def test_the_cluster_page_window_is_one_of_its_choices(tenant, session_client, query, window):
    response = session_client(tenant.viewer).get(f"/cluster/{query}")
    assert response.status_code == 200
    assert page_data(response)["window"] == window
    assert f'<option value="{window}" selected>' in response.content.decode()


@pytest.mark.django_db
def test_job_page_of_the_organization(tenant, session_client):
    job = make_job(tenant, name="mine")
    response = session_client(tenant.viewer).get(f"/jobs/{job.pk}/")
    assert response.status_code == 200
    html = response.content.decode()
    assert '<script type="module" src="/static/js/job_detail.js"></script>' in html
    assert f'data-state="{job.state}"' in html
    data = page_data(response)
    assert data["job"] == job.pk
    assert data["ws_path"] == f"/ws/jobs/{job.pk}/"
    assert data["may_act"] is False  # a viewer
    assert page_data(session_client(tenant.member).get(f"/jobs/{job.pk}/"))["may_act"] is True  # its creator
    assert page_data(session_client(tenant.admin).get(f"/jobs/{job.pk}/"))["may_act"] is True


@pytest.mark.django_db
def test_a_finished_jobs_page_links_its_weights_archive(tenant, session_client, tmp_path):
    from jobs import ingest

    job = make_job(tenant, name="done")
    url = f"/api/v1/jobs/{job.pk}/artifacts/final.zip"
    assert url not in session_client(tenant.viewer).get(f"/jobs/{job.pk}/").content.decode()  # none yet
    (tmp_path / "final").mkdir()
    ingest.ingest_events(job=job, events=[{"seq": 1, "kind": "artifact", "ts": 1.0,
                                           "data": {"name": "final", "path": str(tmp_path / "final"), "files": []}}])
    client = session_client(tenant.viewer)
    html = client.get(f"/jobs/{job.pk}/").content.decode()
    assert f'<a href="{url}" download>Download the final weights (.zip)</a>' in html
    assert client.get(url).status_code == 200  # the browser's session is enough to fetch it


@pytest.mark.django_db
def test_job_page_of_another_organization_is_404(tenant, other_tenant, session_client):
    theirs = make_job(other_tenant, name="secret-plan")
    response = session_client(tenant.owner).get(f"/jobs/{theirs.pk}/")
    assert response.status_code == 404
    assert b"secret-plan" not in response.content
    assert session_client(tenant.owner).get("/jobs/999999/").status_code == 404


@pytest.mark.django_db
def test_staff_savings_refuses_non_staff(tenant, session_client):
    for role in ("owner", "admin", "member", "viewer"):
        assert session_client(tenant.user(role)).get("/staff/savings/").status_code == 403


@pytest.mark.django_db
def test_staff_savings_renders_for_staff_without_an_organization(session_client):
    staff = UserFactory(username="root", is_staff=True)
    response = session_client(staff).get("/staff/savings/")
    assert response.status_code == 200
    assert b'src="/static/js/staff_savings.js"' in response.content


@pytest.mark.django_db
def test_nav_shows_the_staff_link_only_to_staff(tenant, session_client):
    html = session_client(tenant.owner).get("/jobs/").content.decode()
    assert 'href="/jobs/"' in html
    assert 'href="/tokens/"' in html
    assert 'id="nav-staff"' not in html
    tenant.owner.is_staff = True
    tenant.owner.save()
    assert 'id="nav-staff"' in session_client(tenant.owner).get("/jobs/").content.decode()


@pytest.mark.django_db
def test_nav_offers_the_user_s_organizations_and_marks_the_current_one(tenant, other_tenant, session_client):
    from accounts.models import Membership, Role

    Membership.objects.create(user=tenant.owner, organization=other_tenant.organization, role=Role.VIEWER)
    html = session_client(tenant.owner).get("/jobs/").content.decode()
    assert f'<option value="{tenant.organization.pk}" selected>' in html
    assert f'<option value="{other_tenant.organization.pk}">' in html
    assert 'action="/accounts/logout/"' in html  # signing out is a POST form


@pytest.mark.django_db
def test_a_user_of_no_organization_gets_a_notice(session_client):
    response = session_client(UserFactory(username="loner")).get("/jobs/")
    assert response.status_code == 403
    assert b"not a member of any organization" in response.content


@pytest.mark.django_db
def test_the_sign_in_page_uses_the_site_layout_and_leads_to_the_jobs(client):
    UserFactory(username="ada")
    page = client.get("/accounts/login/").content.decode()
    assert 'href="/static/css/plexrl.css"' in page
    assert 'for="id_username"' in page
    response = client.post("/accounts/login/", {"username": "ada", "password": PASSWORD})
    assert response["Location"] == "/jobs/"


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("path", "content_type"),
    [
        ("/static/js/api.js", "text/javascript"),
        ("/static/js/live.js", "text/javascript"),
        ("/static/css/plexrl.css", "text/css"),
        ("/static/vendor/uplot/uPlot.esm.js", "text/javascript"),
        ("/static/vendor/uplot/uPlot.min.css", "text/css"),
    ],
)
def test_static_files_are_served_by_the_app(client, path, content_type):
    response = client.get(path)
    assert response.status_code == 200
    assert response["Content-Type"].startswith(content_type)
    body = b"".join(response.streaming_content) if response.streaming else response.content
    assert body


@pytest.mark.django_db
def test_the_library_page_has_upload_forms_for_members_only_and_the_plans_limits(tenant, session_client):
    from tests.platform.tenants import give_plan

    give_plan(tenant.organization, max_model_bytes=123456, max_dataset_bytes=4321)
    member = session_client(tenant.member).get("/library/")
    assert (page_data(member)["max_model_bytes"], page_data(member)["max_dataset_bytes"]) == (123456, 4321)
    assert page_data(member)["dataset_formats"] == ["jsonl", "csv", "parquet"]
    html = member.content.decode()
    viewer = session_client(tenant.viewer).get("/library/").content.decode()
    for form in ('id="model-form"', 'id="dataset-form"'):
        assert form in html
        assert form not in viewer
    for table in ('id="model-table"', 'id="dataset-table"'):
        assert table in viewer


@pytest.mark.django_db
def test_a_job_page_shows_its_lineage_and_continue_links_and_the_form_continues(tenant, other_tenant, session_client,
                                                                                 tmp_path):
    from tests.platform.builders import ingest

    parent = make_job(tenant, name="parent")
    ingest(parent, {"seq": 1, "kind": "checkpoint", "ts": 1.0,
                    "data": {"step": 2, "tag": "step-2", "path": "/ck", "state": {}}},
           {"seq": 2, "kind": "artifact", "ts": 2.0,
            "data": {"name": "final", "path": str(tmp_path), "files": ["config.json"]}})
    child = services.job_create(organization=tenant.organization, user=tenant.member, spec={"task": "arith"},
                                name="child", continue_from=parent.pk, continue_weights="checkpoint")
    page = session_client(tenant.member).get(f"/jobs/{parent.pk}/")
    assert [link["url"] for link in page_data(page)["continue_links"]] == [
        f"/jobs/new/?continue_from={parent.pk}", f"/jobs/new/?continue_from={parent.pk}&weights=checkpoint"]
    assert f'href="/jobs/{child.pk}/">#{child.pk} child</a>' in page.content.decode()
    shown = session_client(tenant.member).get(f"/jobs/{child.pk}/").content.decode()
    assert f'Continues job <a href="/jobs/{parent.pk}/">#{parent.pk} parent</a>' in shown
    assert "from its latest checkpoint" in shown
    assert page_data(session_client(tenant.viewer).get(f"/jobs/{parent.pk}/"))["continue_links"] == []

    form = session_client(tenant.member).get(f"/jobs/new/?continue_from={parent.pk}&weights=checkpoint")
    assert page_data(form)["continues"] == {"id": parent.pk, "name": "parent", "weights": "checkpoint"}
    html = form.content.decode()
    assert f'name="continue_from" data-type="int" value="{parent.pk}"' in html
    assert re.search(r'<select id="f-model"[^>]* disabled>', html)
    theirs = session_client(other_tenant.member).get(f"/jobs/new/?continue_from={parent.pk}")
    assert theirs.status_code == 404


@pytest.mark.django_db
def test_the_notifications_page_shows_the_webhooks_to_admins_and_owners_only(tenant, session_client):
    for role, manages in (("owner", True), ("admin", True), ("member", False), ("viewer", False)):
        data = page_data(session_client(tenant.user(role)).get("/notifications/"))
        assert data["manages_webhooks"] is manages, role
        assert [e["value"] for e in data["events"]] == ["job.succeeded", "job.failed", "job.cancelled", "job.held"]


@pytest.mark.django_db
def test_the_job_page_links_the_metrics_as_tensorboard_files(tenant, session_client):
    job = make_job(tenant)
    response = session_client(tenant.viewer).get(f"/jobs/{job.pk}/")
    assert page_data(response)["tensorboard_url"] == f"/api/v1/jobs/{job.pk}/tensorboard.zip"
    link = f'id="tensorboard-download" href="/api/v1/jobs/{job.pk}/tensorboard.zip" download'
    assert link in response.content.decode()


@pytest.mark.django_db
def test_the_compare_page_takes_two_to_eight_of_the_organizations_runs_and_lists_their_spec_differences(
        tenant, other_tenant, session_client):
    from config.pages import spec_differences

    first, second = make_job(tenant, name="a"), make_job(tenant, name="b")
    Job.objects.filter(pk=second.pk).update(spec={**second.spec, "seed": 9, "grpo": {**second.spec["grpo"], "lr": 0.5}})
    viewer = session_client(tenant.viewer)
    response = viewer.get(f"/compare/?jobs={first.pk},{second.pk}")
    assert response.status_code == 200
    data = page_data(response)
    assert [run["id"] for run in data["runs"]] == [first.pk, second.pk]
    assert [row["key"] for row in data["differences"]] == ["grpo.lr", "seed"]
    assert data["differences"][1]["values"] == [first.spec["seed"], 9]
    assert '<script type="module" src="/static/js/compare.js"></script>' in response.content.decode()
    for bad in (f"{first.pk}", "", "a,b", ",".join(str(first.pk) for _ in range(3)),
                ",".join(str(n) for n in range(1, 10))):
        assert viewer.get(f"/compare/?jobs={bad}").status_code == 400, bad
    theirs = make_job(other_tenant, name="c")
    assert viewer.get(f"/compare/?jobs={first.pk},{theirs.pk}").status_code == 404
    assert spec_differences([{"a": 1, "b": {"c": 2}}, {"a": 1, "b": {"c": 3}, "d": 4}]) == [
        {"key": "b.c", "values": [2, 3]}, {"key": "d", "values": [None, 4]}]
