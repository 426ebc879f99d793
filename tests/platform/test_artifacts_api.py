"""``jobs/{id}/artifacts/``: a finished job's files (its final weights), listed and downloaded
within the organization only."""

import pytest

from jobs import ingest, services
from tests.platform.builders import SPEC, streamed_body

pytestmark = pytest.mark.django_db



@pytest.fixture
def job_with_artifact(tenant, tmp_path):
    job = services.job_create(organization=tenant.organization, user=tenant.member, spec=SPEC, name="done")
    folder = tmp_path / "final"
    folder.mkdir()
    (folder / "model.safetensors").write_bytes(b"weights" * 10)
    (folder / "config.json").write_text('{"model_type": "qwen2"}')
    ingest.ingest_events(job=job, events=[
        {"seq": 1, "kind": "artifact", "ts": 1.0,
         "data": {"name": "final", "path": str(folder), "files": ["config.json", "model.safetensors"]}}])
    return job


def test_artifacts_are_listed_with_download_urls_and_download(tenant, token_client, job_with_artifact):
    client = token_client(tenant.user("viewer"), tenant.organization)
    response = client.get(f"/api/v1/jobs/{job_with_artifact.pk}/artifacts/")
    assert response.status_code == 200
    [artifact] = response.json()
    assert (artifact["name"], artifact["format"]) == ("final", "huggingface")
    files = {f["name"]: f for f in artifact["files"]}
    assert files["model.safetensors"]["size_bytes"] == 70
    download = client.get(files["model.safetensors"]["url"])
    assert download.status_code == 200
    assert streamed_body(download) == b"weights" * 10
    assert download["Content-Disposition"] == 'attachment; filename="model.safetensors"'
    assert download["Content-Length"] == "70"


def test_an_artifact_downloads_as_one_zip_archive_of_its_folder(tenant, token_client, job_with_artifact):
    import io
    import zipfile

    client = token_client(tenant.user("viewer"), tenant.organization)
    [artifact] = client.get(f"/api/v1/jobs/{job_with_artifact.pk}/artifacts/").json()
    assert artifact["archive_url"].endswith(f"/api/v1/jobs/{job_with_artifact.pk}/artifacts/final.zip")
    download = client.get(artifact["archive_url"])
    assert download.status_code == 200
    assert download["Content-Type"] == "application/zip"
    root = f"job-{job_with_artifact.pk}-final"
    assert download["Content-Disposition"] == f'attachment; filename="{root}.zip"'
    with zipfile.ZipFile(io.BytesIO(streamed_body(download))) as archive:
        assert archive.namelist() == [f"{root}/config.json", f"{root}/model.safetensors"]
        assert archive.read(f"{root}/model.safetensors") == b"weights" * 10
        assert archive.testzip() is None  # every file's CRC checks


def test_another_organization_gets_404_and_no_file_escapes_the_folder(tenant, other_tenant, token_client,
                                                                      job_with_artifact):
    outsider = token_client(other_tenant.user("owner"), other_tenant.organization)
    base = f"/api/v1/jobs/{job_with_artifact.pk}/artifacts/"
    assert outsider.get(base).status_code == 404
    assert outsider.get(f"{base}final/config.json").status_code == 404
    assert outsider.get(f"{base}final.zip").status_code == 404
    insider = token_client(tenant.user("viewer"), tenant.organization)
    assert insider.get(f"{base}final/..%2Fsecret").status_code == 404
    assert insider.get(f"{base}final/.hidden").status_code == 404
    assert insider.get(f"{base}other/config.json").status_code == 404
    assert insider.get(f"{base}other.zip").status_code == 404
    assert insider.get(f"{base}final/missing.bin").status_code == 404


def test_a_job_without_artifacts_lists_none(tenant, token_client):
    job = services.job_create(organization=tenant.organization, user=tenant.member, spec=SPEC)
    client = token_client(tenant.user("viewer"), tenant.organization)
    assert client.get(f"/api/v1/jobs/{job.pk}/artifacts/").json() == []
