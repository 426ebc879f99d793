"""The models a job may name: the engine's presets and the folders platform staff register.

Anyone in an organization lists them; only staff register (REST or the admin), and a folder must
hold config.json, *.safetensors weights and a tokenizer file. A job naming a registered model
stores its folder; a preset or an unknown name is left to the engine; a path is refused.
"""

import datetime as dt
from pathlib import Path

import pytest

from accounts.models import Membership
from engine.models import PRESETS
from jobs.models import Job, RegisteredModel
from tests.platform.builders import JOBS
from tests.platform.factories import UserFactory

pytestmark = pytest.mark.django_db

MODELS = "/api/v1/models/"


def hf_folder(root: Path, *, config=True, weights="model.safetensors", tokenizer="tokenizer.json") -> Path:
    root.mkdir(parents=True)
    if config:
        (root / "config.json").write_text("{}")
    if weights:
        (root / weights).write_bytes(b"\0")
    if tokenizer:
        (root / tokenizer).write_text("{}")
    return root


@pytest.fixture
def staff(tenant):
    tenant.owner.is_staff = True
    tenant.owner.save()
    return tenant.owner


def test_everyone_in_an_organization_lists_presets_then_registered_models(tenant, token_client, tmp_path):
    RegisteredModel.objects.create(name="qwen-small", path=str(hf_folder(tmp_path / "q")), description="Qwen")
    response = token_client(tenant.viewer, tenant.organization).get(MODELS)
    assert response.status_code == 200
    body = response.json()
    assert [(m["name"], m["builtin"]) for m in body] == [
        *((name, True) for name in sorted(PRESETS)),
        ("qwen-small", False),
    ]
    assert body[-1]["path"] == str(tmp_path / "q")
    assert body[0]["path"] is None


def test_listing_needs_an_organization_or_staff(session_client, api_client):
    assert api_client.get(MODELS).status_code in (401, 403)
    loner = UserFactory(username="loner")
    assert session_client(loner).get(MODELS).status_code == 403
    loner.is_staff = True
    loner.save()
    assert session_client(loner).get(MODELS).status_code == 200


def test_staff_register_a_model(staff, tenant, token_client, tmp_path):
    folder = hf_folder(tmp_path / "m", weights="model-00001-of-00002.safetensors", tokenizer="tokenizer_config.json")
    response = token_client(staff, tenant.organization).post(
        MODELS, {"name": "my-model", "path": str(folder), "description": "mine"}, format="json"
    )
    assert response.status_code == 201, response.json()
    assert response.json()["builtin"] is False
    model = RegisteredModel.objects.get()
    assert (model.name, model.path, model.description, model.registered_by) == (
        "my-model", str(folder.resolve()), "mine", staff
    )


def test_staff_without_an_organization_register_by_session(session_client, tmp_path):
    admin = UserFactory(username="root", is_staff=True)
    assert not Membership.objects.filter(user=admin).exists()  # staff, in no organization
    folder = hf_folder(tmp_path / "m")
    response = session_client(admin).post(MODELS, {"name": "m", "path": str(folder)}, format="json")
    assert response.status_code == 201, response.json()
    model = RegisteredModel.objects.get()
    assert (model.name, model.path, model.description, model.registered_by) == (
        "m", str(folder.resolve()), "", admin
    )
    body = response.json()
    assert body == {
        "id": model.pk, "name": "m", "builtin": False, "scope": "published", "path": str(folder.resolve()),
        "description": "", "architecture": None, "parameters": None, "size_bytes": None, "dtype": None,
        "created_at": body["created_at"],
    }  # fmt: skip
    assert dt.datetime.fromisoformat(body["created_at"]) == model.created_at


@pytest.mark.parametrize("role", ["owner", "admin", "member", "viewer"])
def test_non_staff_cannot_register(tenant, token_client, tmp_path, role):
    response = token_client(tenant.user(role), tenant.organization).post(
        MODELS, {"name": "m", "path": str(hf_folder(tmp_path / "m"))}, format="json"
    )
    assert response.status_code == 403
    assert not RegisteredModel.objects.exists()


@pytest.mark.parametrize(
    ("folder", "message"),
    [
        ({"config": False}, "has no config.json"),
        ({"weights": None}, "has no weights"),
        ({"weights": "pytorch_model.bin"}, "has only .bin weights"),
        ({"tokenizer": None}, "has no tokenizer file"),
    ],
    ids=["no-config", "no-weights", "bin-only", "no-tokenizer"],
)
def test_the_folder_must_be_a_loadable_model(staff, tenant, token_client, tmp_path, folder, message):
    path = hf_folder(tmp_path / "m", **folder)
    response = token_client(staff, tenant.organization).post(MODELS, {"name": "m", "path": str(path)}, format="json")
    assert response.status_code == 400
    assert message in response.json()["path"][0]
    assert not RegisteredModel.objects.exists()


@pytest.mark.parametrize(
    ("payload", "field"),
    [
        ({"name": "m", "path": "relative/folder"}, "path"),
        ({"name": "m", "path": "/no/such/folder"}, "path"),
        ({"name": "tiny-arith"}, "name"),
        ({"name": "../evil"}, "name"),
        ({"name": "taken"}, "name"),
        ({"name": "m", "weights": "x"}, "weights"),
    ],
    ids=["relative", "missing", "preset-name", "bad-name", "duplicate", "unknown-field"],
)
def test_registration_errors_name_the_field(staff, tenant, token_client, tmp_path, payload, field):
    folder = hf_folder(tmp_path / "m")
    RegisteredModel.objects.create(name="taken", path=str(folder))
    payload = {"path": str(folder), **payload}
    response = token_client(staff, tenant.organization).post(MODELS, payload, format="json")
    assert response.status_code == 400
    assert field in response.json()
    assert RegisteredModel.objects.count() == 1


def test_a_file_is_not_a_folder(staff, tenant, token_client, tmp_path):
    file = tmp_path / "file"
    file.write_text("x")
    response = token_client(staff, tenant.organization).post(MODELS, {"name": "m", "path": str(file)}, format="json")
    assert "is not a folder" in response.json()["path"][0]


# --- the admin -------------------------------------------------------------------------------------


def test_staff_register_in_the_admin_with_the_same_checks(client, tmp_path):
    admin = UserFactory(username="root", is_staff=True, is_superuser=True)
    client.force_login(admin)
    assert client.get("/admin/jobs/registeredmodel/add/").status_code == 200
    bad = client.post("/admin/jobs/registeredmodel/add/", {"name": "m", "path": str(tmp_path), "description": ""})
    assert bad.status_code == 200  # the form again, with its error
    assert "has no config.json" in bad.content.decode()
    folder = hf_folder(tmp_path / "m")
    good = client.post("/admin/jobs/registeredmodel/add/", {"name": "m", "path": str(folder), "description": ""})
    assert good.status_code == 302
    assert RegisteredModel.objects.get().registered_by == admin
    assert client.get("/admin/jobs/dataset/").status_code == 200


# --- jobs on models -----------------------------------------------------------------------------


def test_a_job_naming_a_registered_model_stores_its_folder(tenant, token_client, tmp_path):
    folder = hf_folder(tmp_path / "m")
    RegisteredModel.objects.create(name="mine", path=str(folder))
    response = token_client(tenant.member, tenant.organization).post(
        JOBS, {"spec": {"task": "arith", "model": "mine"}}, format="json"
    )
    assert response.status_code == 201, response.json()
    assert Job.objects.get().spec["model"] == str(folder)


def test_a_preset_name_is_left_to_the_engine(tenant, token_client):
    response = token_client(tenant.member, tenant.organization).post(
        JOBS, {"spec": {"task": "arith", "model": "tiny-arith"}}, format="json"
    )
    assert response.status_code == 201, response.json()
    assert Job.objects.get().spec["model"] == "tiny-arith"


def test_a_name_neither_preset_nor_registered_is_refused(tenant, token_client, tmp_path):
    model = RegisteredModel.objects.create(name="mine", path=str(tmp_path))
    response = token_client(tenant.member, tenant.organization).post(
        JOBS, {"spec": {"task": "arith", "model": "not-registered"}}, format="json"
    )
    assert response.status_code == 400
    assert "unknown model 'not-registered'" in response.json()["spec.model"][0]
    assert model.name in response.json()["spec.model"][0]  # registered models are named too
    assert not Job.objects.exists()


@pytest.mark.parametrize("model", ["/srv/plexrl/runs/job-1/checkpoint", "~/models/x", "./x", "..\\x"])
def test_a_job_cannot_name_a_path(tenant, token_client, model):
    response = token_client(tenant.member, tenant.organization).post(
        JOBS, {"spec": {"task": "arith", "model": model}}, format="json"
    )
    assert response.status_code == 400
    assert "not a path" in response.json()["spec.model"][0]
    assert not Job.objects.exists()
