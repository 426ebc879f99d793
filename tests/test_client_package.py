"""The Python client (``clients/python``, ``plexrl_client``) as users get it: a package of its own
that installs without the platform's dependencies, with one error class per kind of refusal."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from plexrl_client import errors

ROOT = Path(__file__).resolve().parents[1]
PLATFORM_DEPENDENCIES = ("django", "rest_framework", "celery", "torch", "ray", "numpy", "vllm", "megatron")


@pytest.mark.parametrize(("status", "kind"), [
    (400, errors.BadRequest), (401, errors.Unauthorized), (403, errors.Forbidden), (404, errors.NotFound),
    (409, errors.Conflict), (413, errors.PayloadTooLarge), (429, errors.RateLimited), (500, errors.ServerError),
    (503, errors.ServerError), (418, errors.ApiError),
])
def test_each_status_raises_its_own_error_class_carrying_the_field_messages(status, kind):
    exc = errors.api_error(status, {"spec.steps": ["must be a positive integer, got 0"]}, "http://x/api/v1/jobs/")
    assert type(exc) is kind
    assert isinstance(exc, errors.ApiError)
    assert isinstance(exc, errors.PlexRLError)
    assert exc.status == status
    assert exc.errors == {"spec.steps": ["must be a positive integer, got 0"]}
    assert str(exc) == f"HTTP {status}: spec.steps: must be a positive integer, got 0"
    assert exc.client_error == (status < 500)


def test_server_error_shapes_flatten_to_dotted_fields():
    raw = {"detail": "no", "spec": {"grpo": {"lr": ["must be > 0"]}}, "non_field_errors": ["both set"]}
    assert errors.flatten(raw) == {"detail": ["no", "both set"], "spec.grpo.lr": ["must be > 0"]}


def test_the_client_installs_into_a_fresh_virtualenv_without_the_platforms_dependencies(tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    # its wheel, built here (this interpreter has setuptools and wheel), installed with no index at
    # all: whatever it needed from elsewhere would fail the install
    wheels = tmp_path / "wheels"
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                            str(wheels), str(ROOT / "clients" / "python")], capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stderr
    install = subprocess.run([str(python), "-m", "pip", "install", "--no-index", "-q", *map(str, wheels.glob("*.whl"))],
                             capture_output=True, text=True, timeout=300)
    assert install.returncode == 0, install.stderr
    listed = subprocess.run([str(python), "-m", "pip", "list", "--format", "json"], capture_output=True, text=True,
                            check=True, timeout=120)
    assert {p["name"] for p in json.loads(listed.stdout)} <= {"plexrl-client", "pip", "setuptools", "wheel"}
    probe = ("import json, sys, plexrl_client; from plexrl_client import ServiceClient, NotFound; "
             "print(plexrl_client.__file__); print(json.dumps(sorted({m.split('.')[0] for m in sys.modules})))")
    ran = subprocess.run([str(python), "-c", probe], capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert ran.returncode == 0, ran.stderr
    where, loaded = ran.stdout.splitlines()
    assert where.startswith(str(venv))  # the installed copy, not the checkout
    assert not set(PLATFORM_DEPENDENCIES) & set(json.loads(loaded))
    for module in PLATFORM_DEPENDENCIES[:3]:
        missing = subprocess.run([str(python), "-c", f"import {module}"], capture_output=True, text=True, timeout=60)
        assert missing.returncode != 0  # the platform's dependencies are not there at all
