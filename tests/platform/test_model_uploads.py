"""An organization's own models (issue 34): members upload a Hugging Face folder (REST multipart,
one part a file), checked by the engine before it is kept; the organization alone lists, uses and
deletes it; platform staff publish it to every organization. A bad folder answers 400 naming the
file or tensor, and nothing is stored: no row, no file."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile

from accounts.models import Role
from jobs.models import Job, JobState, RegisteredModel
from tests.modelfiles import build_tiny_model
from tests.platform.builders import JOBS
from tests.platform.factories import MembershipFactory, UserFactory
from tests.platform.tenants import give_plan

pytestmark = pytest.mark.django_db

MODELS = "/api/v1/models/"
UPLOAD = "/api/v1/models/upload/"


@pytest.fixture(scope="module")
def qwen(tmp_path_factory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("models") / "qwen2", "qwen2")


@pytest.fixture(autouse=True)
def home(settings, tmp_path) -> Path:
    settings.PLEXRL_HOME = tmp_path / "home"
    return settings.PLEXRL_HOME


def parts(folder: Path) -> list[SimpleUploadedFile]:
    return [SimpleUploadedFile(p.name, p.read_bytes()) for p in sorted(folder.iterdir())]


def upload(client, folder: Path, name: str = "my-qwen", **extra):
    return client.post(UPLOAD, {"name": name, "files": parts(folder), **extra}, format="multipart")


def stored(home: Path) -> list[Path]:
    root = home / "model-uploads"
    return sorted(root.rglob("*")) if root.exists() else []


def test_a_member_uploads_a_folder_and_the_organization_trains_on_it(tenant, token_client, home, qwen):
    client = token_client(tenant.member, tenant.organization)
    response = upload(client, qwen, description="tiny")
    assert response.status_code == 201, response.json()
    body = response.json()
    model = RegisteredModel.objects.get()
    assert body == {
        "id": model.pk, "name": "my-qwen", "builtin": False, "scope": "organization", "path": model.path,
        "description": "tiny", "architecture": "Qwen2ForCausalLM", "parameters": body["parameters"],
        "size_bytes": sum(p.stat().st_size for p in qwen.iterdir()), "dtype": "float32",
        "created_at": body["created_at"],
    }  # fmt: skip
    layer = 64 * 128 + 2 * 64 * 64 + 128 + 64 + 64 + 128 * 64 + 3 * 64 * 128 + 2 * 64  # attention (biased), MLP, norms
    assert body["parameters"] == 64 * 64 + 2 * layer + 64  # embeddings (tied), 2 layers, the final norm
    folder = Path(model.path)
    assert folder.parent == home / "model-uploads" / str(tenant.organization.pk)
    assert sorted(p.name for p in folder.iterdir()) == sorted(p.name for p in qwen.iterdir())
    assert (folder / "model.safetensors").read_bytes() == (qwen / "model.safetensors").read_bytes()
    assert not [p for p in folder.parent.iterdir() if p.name.startswith(".")]  # no temporary folder left
    assert ("my-qwen", "organization") in [(m["name"], m["scope"]) for m in client.get(MODELS).json()]
    assert client.get(f"{MODELS}{model.pk}/").json()["name"] == "my-qwen"
    job = client.post(JOBS, {"spec": {"model": "my-qwen", "steps": 2, "rollout": "torch", "trainer": "torch"}},
                      format="json")
    assert job.status_code == 201, job.json()
    assert Job.objects.get().spec["model"] == model.path


def test_another_organization_can_neither_list_show_delete_nor_train_it(tenant, other_tenant, token_client, qwen):
    assert upload(token_client(tenant.member, tenant.organization), qwen).status_code == 201
    model = RegisteredModel.objects.get()
    theirs = token_client(other_tenant.owner, other_tenant.organization)
    assert "my-qwen" not in [m["name"] for m in theirs.get(MODELS).json()]
    assert theirs.get(f"{MODELS}{model.pk}/").status_code == 404
    assert theirs.delete(f"{MODELS}{model.pk}/").status_code == 404
    response = theirs.post(JOBS, {"spec": {"model": "my-qwen", "steps": 2}}, format="json")
    assert response.status_code == 400
    assert "unknown model 'my-qwen'" in response.json()["spec.model"][0]
    assert model.path not in json.dumps(response.json())
    assert not Job.objects.exists()
    assert RegisteredModel.objects.filter(pk=model.pk).exists()


def _pickle(folder: Path) -> None:
    (folder / "pytorch_model.bin").write_bytes(b"\x80\x04K\x01.")


def _mismatched(folder: Path) -> None:
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "intermediate_size": 96}))


def _missing_tensor(folder: Path) -> None:
    from safetensors.torch import load_file, save_file

    tensors = load_file(folder / "model.safetensors")
    del tensors["model.layers.1.self_attn.k_proj.weight"]
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})


def _unsupported(folder: Path) -> None:
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "architectures": ["GPT2LMHeadModel"]}))


BAD = {
    "pickle": (_pickle, "pytorch_model.bin: pickle-based weights are not accepted"),
    "code": (lambda f: (f / "modeling_evil.py").write_text("import os"), "modeling_evil.py: code files are not"),
    "no-config": (lambda f: (f / "config.json").unlink(), "no config.json"),
    "bad-config": (lambda f: (f / "config.json").write_text("{"), "config.json: not valid JSON"),
    "unsupported": (_unsupported, "architecture GPT2LMHeadModel is not supported"),
    "mismatched-shapes": (_mismatched, "tensor model.layers.0.mlp.down_proj.weight has shape [64, 128] in the "
                                       "weights but [64, 96] by config.json"),
    "missing-tensor": (_missing_tensor, "the weights lack tensor model.layers.1.self_attn.k_proj.weight"),
    "not-safetensors": (lambda f: (f / "model.safetensors").write_bytes(b"\x10\x00junk"),
                        "model.safetensors: not a readable safetensors file"),
    "no-weights": (lambda f: (f / "model.safetensors").unlink(), "no weights"),
    "no-tokenizer": (lambda f: [(f / n).unlink() for n in ("tokenizer.json", "tokenizer_config.json")],
                     "no tokenizer file"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_a_bad_folder_answers_400_naming_what_is_wrong_and_stores_nothing(tenant, token_client, home, qwen,
                                                                          tmp_path, case):
    folder = shutil.copytree(qwen, tmp_path / "bad")
    spoil, message = BAD[case]
    spoil(folder)
    response = upload(token_client(tenant.member, tenant.organization), folder)
    assert response.status_code == 400
    assert message in response.json()["files"][0], response.json()
    assert not RegisteredModel.objects.exists()
    assert stored(home) in ([], [home / "model-uploads" / str(tenant.organization.pk)])  # the folder, empty


def test_a_model_over_the_plans_size_answers_400_and_stores_nothing(tenant, token_client, home, qwen):
    size = sum(p.stat().st_size for p in qwen.iterdir())
    give_plan(tenant.organization, max_model_bytes=size - 1)  # the request's framing passes, its files do not
    response = upload(token_client(tenant.member, tenant.organization), qwen)
    assert response.status_code == 400
    assert response.json()["files"] == [f"the model is {size} bytes; the plan allows {size - 1} bytes"]
    assert not RegisteredModel.objects.exists()
    assert stored(home) == []


def test_an_oversize_request_is_refused_before_its_body_is_read(tenant, token_client, home, qwen, monkeypatch):
    give_plan(tenant.organization, max_model_bytes=1000)
    client = token_client(tenant.member, tenant.organization)
    monkeypatch.setattr("rest_framework.request.Request.data", property(lambda self: pytest.fail("body parsed")))
    response = upload(client, qwen)
    assert response.status_code == 400
    assert "the plan allows 1000 bytes" in response.json()["files"][0]


@pytest.mark.parametrize(
    ("name", "message"),
    [("tiny-arith", "is a built-in preset"), ("../evil", "use 1 to 100 letters"), ("mine", "already registered"),
     ("published", "already registered")],
)
def test_a_name_taken_or_malformed_answers_400(tenant, token_client, qwen, tmp_path, name, message):
    client = token_client(tenant.member, tenant.organization)
    assert upload(client, qwen, name="mine").status_code == 201
    RegisteredModel.objects.create(name="published", path=str(tmp_path))
    response = upload(client, qwen, name=name)
    assert response.status_code == 400
    assert message in response.json()["name"][0]
    assert RegisteredModel.objects.count() == 2


def test_names_are_per_organization(tenant, other_tenant, token_client, qwen):
    assert upload(token_client(tenant.member, tenant.organization), qwen).status_code == 201
    assert upload(token_client(other_tenant.member, other_tenant.organization), qwen).status_code == 201


def test_viewers_cannot_upload(tenant, token_client, home, qwen):
    assert upload(token_client(tenant.viewer, tenant.organization), qwen).status_code == 403
    assert stored(home) == []


@pytest.mark.parametrize(("who", "answer"), [("uploader", 204), ("other-member", 403), ("admin", 204),
                                             ("viewer", 403)])
def test_who_deletes_an_uploaded_model(tenant, token_client, home, qwen, who, answer,
                                      django_capture_on_commit_callbacks):
    assert upload(token_client(tenant.member, tenant.organization), qwen).status_code == 201
    model = RegisteredModel.objects.get()
    other = MembershipFactory(organization=tenant.organization, role=Role.MEMBER, user__username="acme-member2").user
    user = {"uploader": tenant.member, "other-member": other, "admin": tenant.admin, "viewer": tenant.viewer}[who]
    with django_capture_on_commit_callbacks(execute=True):
        response = token_client(user, tenant.organization).delete(f"{MODELS}{model.pk}/")
    assert response.status_code == answer
    assert RegisteredModel.objects.exists() == (answer != 204)
    assert Path(model.path).exists() == (answer != 204)


def test_a_model_an_active_job_trains_cannot_be_deleted(tenant, token_client, qwen):
    client = token_client(tenant.member, tenant.organization)
    assert upload(client, qwen).status_code == 201
    model = RegisteredModel.objects.get()
    assert client.post(JOBS, {"spec": {"model": "my-qwen", "rollout": "torch", "trainer": "torch"}},
                       format="json").status_code == 201
    response = client.delete(f"{MODELS}{model.pk}/")
    assert response.status_code == 409
    assert "active jobs train this model" in response.json()["detail"]
    Job.objects.update(state=JobState.SUCCEEDED)
    assert client.delete(f"{MODELS}{model.pk}/").status_code == 204


def test_staff_publish_an_upload_to_every_organization(tenant, other_tenant, token_client, session_client, qwen):
    assert upload(token_client(tenant.member, tenant.organization), qwen).status_code == 201
    model = RegisteredModel.objects.get()
    publish = f"{MODELS}{model.pk}/publish/"
    assert token_client(tenant.owner, tenant.organization).post(publish).status_code == 403
    staff = UserFactory(username="root", is_staff=True)
    response = session_client(staff).post(publish)
    assert response.status_code == 200, response.json()
    assert response.json()["scope"] == "published"
    theirs = token_client(other_tenant.member, other_tenant.organization)
    assert "my-qwen" in [m["name"] for m in theirs.get(MODELS).json()]
    job = theirs.post(JOBS, {"spec": {"model": "my-qwen", "rollout": "torch", "trainer": "torch"}}, format="json")
    assert job.status_code == 201, job.json()
    assert session_client(staff).post(publish).status_code == 400  # already published


def test_a_job_whose_backends_do_not_run_the_architecture_is_refused(tenant, token_client, tmp_path):
    RegisteredModel.objects.create(organization=tenant.organization, name="gpt", path=str(tmp_path),
                                   architecture="GPT2LMHeadModel")
    response = token_client(tenant.member, tenant.organization).post(
        JOBS, {"spec": {"model": "gpt", "rollout": "torch", "trainer": "torch"}}, format="json")
    assert response.status_code == 400
    assert response.json()["spec.model"] == ["'gpt' cannot run on the torch rollout: it is a GPT2LMHeadModel; "
                                               "torch runs LlamaForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM"]


@pytest.mark.parametrize(("spoil", "backends", "message"), [
    ({"rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                       "original_max_position_embeddings": 32}},
     {"trainer": "megatron"}, "cannot run on the megatron trainer: unsupported rope scaling 'llama3'"),
    ({}, {"trainer": "megatron", "tp": 4}, "num_key_value_heads=2 is not divisible by tensor parallel size 4"),
    ({}, {"rollout": "vllm"}, "cannot run on the vllm rollout: vLLM's Qwen2 takes head_dim as hidden_size / "
                              "num_attention_heads (16), not config.json's 32"),
], ids=["llama3-rope-on-megatron", "tp4-on-two-kv-heads", "qwen2-head-dim-on-vllm"])
def test_a_job_whose_backend_cannot_run_the_models_configuration_is_refused(tenant, token_client, tmp_path, qwen,
                                                                            spoil, backends, message):
    folder = shutil.copytree(qwen, tmp_path / "m")
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, **spoil}))
    client = token_client(tenant.member, tenant.organization)
    assert upload(client, folder).status_code == 201  # another backend runs it
    spec = {"model": "my-qwen", "rollout": "torch", "trainer": "torch", **backends}
    response = client.post(JOBS, {"spec": spec}, format="json")
    assert response.status_code == 400
    assert message in response.json()["spec.model"][0], response.json()
    assert not Job.objects.exists()
    assert client.post(JOBS, {"spec": {**spec, "rollout": "torch", "trainer": "torch", "tp": 1}},
                       format="json").status_code == 201
