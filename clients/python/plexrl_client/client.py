"""The client of the platform's REST API (``/api/v1/``): users' scripts and the ``plexrl`` platform
commands (``engine.cli.platform_commands``) use this one. Standard library only (http.client, json):
it installs on its own (``pip install ./clients/python``), with no Django, torch, Ray or HTTP
library.

Usage::

    from plexrl_client import ServiceClient

    token = ServiceClient.obtain_token("http://127.0.0.1:8000", "ada", "secret")
    client = ServiceClient("http://127.0.0.1:8000", token)
    job = client.submit({"task": "arith", "model": "tiny-arith", "steps": 20}, name="try")
    for update in client.watch(job["id"]):
        print(update.kind, update.data)

Every method returns the API's JSON (dicts and lists, as ``/api/schema/`` describes them). A
refusal by the server raises an ``ApiError`` (its status and field errors), of the subclass for its
status (``BadRequest``, ``NotFound``, ``Conflict``, ...); a server that cannot be reached raises
``Unreachable``, naming the URL. All are ``PlexRLError``s.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
import urllib.parse
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO, NamedTuple

from plexrl_client.errors import PlexRLError
from plexrl_client.session import Session
from plexrl_client.transport import multipart, send

API_PREFIX = "/api/v1/"
# The job states after which nothing changes (``jobs.models.TERMINAL_STATES``, by value: the
# client never imports the platform).
TERMINAL_STATES = frozenset({"succeeded", "failed", "cancelled"})
PAGE_SIZE = 200  # the API's largest page (``accounts.pagination.StandardPagination``)


class Update(NamedTuple):
    """What ``ServiceClient.watch`` yields: ``kind`` "metrics" with one step's metrics (``data``
    has ``step``, ``reward_mean``, ...), or "state" with the job (as ``job()`` returns it) when its
    state changed."""

    kind: str
    data: dict[str, Any]


class ServiceClient:
    """The REST API of one platform, acting with one token (so in the token's organization).

    ``url``: the platform's base URL (``http://127.0.0.1:8000``); ``token``: an API token (from
    the web page "Tokens", ``plexrl login`` or ``obtain_token``); ``timeout``: seconds to wait for
    each answer. Lists (``jobs``, ``metrics``, ``events``, ``usage``) follow the pagination and
    return every row.
    """

    def __init__(self, url: str, token: str, *, timeout: float = 30.0):
        self.url = url.rstrip("/")
        self.token = token
        self.timeout = timeout

    # -- transport ----------------------------------------------------------------------------

    @staticmethod
    def _send(url: str, *, method: str = "GET", body: Any = None, token: str | None = None,
              accept: str = "application/json", timeout: float = 30.0, content_type: str | None = None,
              into: BinaryIO | None = None) -> bytes:
        """The body of the answer to one request (``plexrl_client.transport``: kept-alive
        connections); ``ApiError`` for an error status, ``Unreachable`` when no answer came."""
        return send(url, method=method, body=body, token=token, accept=accept, timeout=timeout,
                    content_type=content_type, into=into)

    def _url(self, path: str, query: dict[str, Any] | None = None) -> str:
        url = f"{self.url}{API_PREFIX}{path}"
        query = {k: v for k, v in (query or {}).items() if v is not None and v != ""}
        return f"{url}?{urllib.parse.urlencode(query)}" if query else url

    def _json(self, method: str, path: str, *, query: dict[str, Any] | None = None, body: Any = None,
              waits: float = 0.0) -> Any:
        """One JSON request; ``waits``: seconds the server is asked to hold it for an answer (a
        long poll), allowed on top of ``timeout``."""
        raw = self._send(self._url(path, query), method=method, body=body, token=self.token,
                         timeout=self.timeout + waits)
        return json.loads(raw) if raw else None

    def _all(self, path: str, query: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        """Every row of a paginated list, page after page."""
        rows: list[dict[str, Any]] = []
        page = 1
        while True:
            answer = self._json("GET", path, query={**(query or {}), "page": page, "page_size": PAGE_SIZE})
            rows.extend(answer["results"])
            if not answer.get("next"):
                return rows
            page += 1

    # -- tokens -------------------------------------------------------------------------------

    @classmethod
    def obtain_token(cls, url: str, username: str, password: str, *, organization: str | None = None,
                     name: str = "plexrl-cli", timeout: float = 30.0) -> str:
        """Trade a username and password for a new API token (``POST auth/token/``); returns the
        token's plaintext, shown this once. ``organization`` (id or slug): needed when the user
        belongs to several::

            token = ServiceClient.obtain_token("http://127.0.0.1:8000", "ada", "secret")
        """
        body = {"username": username, "password": password, "name": name}
        if organization:
            body["organization"] = organization
        raw = cls._send(f"{url.rstrip('/')}{API_PREFIX}auth/token/", method="POST", body=body, timeout=timeout)
        return json.loads(raw)["token"]

    # -- artifacts ----------------------------------------------------------------------------

    def download_artifact(self, job_id: int, dest: str | os.PathLike = ".", *, name: str = "final") -> Path:
        """A finished job's artifact (``final``: its weights, a Hugging Face folder) unpacked into
        ``dest``, from one ZIP archive; returns the folder (``dest/job-<id>-<name>``), which
        ``transformers`` loads as it is::

            model = AutoModelForCausalLM.from_pretrained(client.download_artifact(7))
        """
        dest = Path(dest)
        url = self._url(f"jobs/{int(job_id)}/artifacts/{urllib.parse.quote(name)}.zip")
        with tempfile.TemporaryFile() as archive:
            self._send(url, token=self.token, accept="*/*", timeout=self.timeout, into=archive)
            archive.seek(0)
            with zipfile.ZipFile(archive) as files:
                members = [member.split("/") for member in files.namelist()]
                root = members[0][0] if members else ""
                for parts in members:  # files of one folder, nothing outside it
                    if parts[0] != root or len(parts) != 2 or root in ("", ".", "..") or parts[1] in ("", ".", ".."):
                        raise PlexRLError(f"{url}: the archive holds {'/'.join(parts)!r}, not a file of one folder")
                dest.mkdir(parents=True, exist_ok=True)
                files.extractall(dest)
        return dest / root

    # -- datasets -----------------------------------------------------------------------------

    def upload_dataset(self, path: str | os.PathLike, name: str, *, file_format: str | None = None,
                       prompt_column: str = "prompt", answer_column: str = "answer",
                       eval_path: str | os.PathLike | None = None) -> dict[str, Any]:
        """Upload a file of problems (JSONL, CSV or Parquet; ``file_format`` when its name's suffix does
        not say which) as one of the organization's datasets; its prompt and answer are in the
        fields or columns named. Returns the dataset (a job trains on it with ``{"task":
        "dataset", "dataset": <its id>}``); ``BadRequest`` names the file's first bad line or row.
        ``eval_path``: problems to evaluate on, in the same format and columns (the whole first
        file then trains; without it, a held-out split of it)::

            client.upload_dataset("gsm8k.parquet", "gsm8k", prompt_column="question")
        """
        path = Path(path)
        fields = {"name": name, "prompt_column": prompt_column, "answer_column": answer_column}
        if file_format is not None:
            fields["format"] = file_format
        files = {"file": (path.name, path.read_bytes())}
        if eval_path is not None:
            files["eval_file"] = (Path(eval_path).name, Path(eval_path).read_bytes())
        content_type, body = multipart(fields, files)
        raw = self._send(self._url("datasets/"), method="POST", body=body, content_type=content_type,
                         token=self.token, timeout=self.timeout)
        return json.loads(raw)

    def datasets(self) -> list[dict[str, Any]]:
        """The organization's datasets, newest first."""
        return self._all("datasets/")

    def delete_dataset(self, dataset_id: int) -> None:
        """Delete a dataset (``Conflict`` while an active job reads it)."""
        self._send(self._url(f"datasets/{int(dataset_id)}/"), method="DELETE", token=self.token, timeout=self.timeout)

    # -- models -------------------------------------------------------------------------------

    def upload_model(self, folder: str | os.PathLike, name: str, *, description: str = "") -> dict[str, Any]:
        """Upload a Hugging Face model folder (``config.json``, ``*.safetensors`` weights, tokenizer
        files; no pickle ``.bin``, no code) as one of the organization's models, which its jobs then
        name in ``spec.model``. The server checks it first; ``BadRequest`` names the file or tensor
        that is wrong, and nothing is kept::

            client.upload_model("out/my-qwen", "my-qwen")
        """
        folder = Path(folder)
        files = [("files", (p.name, p.read_bytes())) for p in sorted(folder.iterdir()) if p.is_file()]
        content_type, body = multipart({"name": name, "description": description}, files)
        raw = self._send(self._url("models/upload/"), method="POST", body=body, content_type=content_type,
                         token=self.token, timeout=max(self.timeout, 300.0))
        return json.loads(raw)

    def models(self) -> list[dict[str, Any]]:
        """Every model a job may name: the built-in presets, the published ones, the organization's own."""
        return self._json("GET", "models/")

    def delete_model(self, model_id: int) -> None:
        """Delete one of the organization's models (``Conflict`` while an active job trains it)."""
        self._send(self._url(f"models/{int(model_id)}/"), method="DELETE", token=self.token, timeout=self.timeout)

    # -- jobs ---------------------------------------------------------------------------------

    def submit(self, spec: dict[str, Any], *, name: str = "", rollout_devices: int = 1, train_devices: int = 1,
               deployment_mode: str = "async_split", continue_from: int | None = None,
               continue_weights: str = "final") -> dict[str, Any]:
        """Create a job (``POST jobs/``); returns it as ``job()`` does (``id``, ``state``, ...).

        ``spec``: the engine's JobSpec as a dict (``task``, ``model``, ``steps``, ``seed``,
        ``grpo: {...}``, ...; missing fields take their defaults). ``rollout_devices``,
        ``train_devices`` and ``deployment_mode`` (``async_split``, ``isolated_split``,
        ``colocated``) declare the dedicated deployment the savings compare with. An invalid spec
        raises ``BadRequest`` (400) naming the field (``spec.steps``)::

            job = client.submit({"task": "arith", "steps": 50, "grpo": {"lr": 1e-4}}, name="lr-1e-4")

        ``continue_from``: a job of the organization whose weights it starts from (its final
        weights, or with ``continue_weights="checkpoint"`` its latest checkpoint); the spec then
        names no model (the parent's is trained)::

            more = client.submit({"task": "arith", "steps": 50}, continue_from=job["id"])
        """
        return self._json("POST", "jobs/", body={
            "spec": spec, "name": name, "rollout_devices": rollout_devices, "train_devices": train_devices,
            "deployment_mode": deployment_mode, "continue_from": continue_from, "continue_weights": continue_weights})

    # -- sessions: your own loop, calling the function API (plexrl_client.session) ---------------

    def create_session(self, model: str, *, rollout: str | None = None, trainer: str | None = None,
                       tp: int | None = None, name: str = "", priority: str = "normal",
                       optimizer: dict[str, Any] | None = None) -> Session:
        """Open a session on ``model`` (a preset or registered model) with its trainable ``policy``
        (``optimizer``: ``lr``, ``betas``, ``weight_decay``, ``grad_clip``, ``warmup_steps``,
        ``decay_steps``); returns it once the platform has placed it and made the model. Backends
        and ``tp`` default as a job's do."""
        body: dict[str, Any] = {"model": model, "name": name, "priority": priority}
        body.update({k: v for k, v in (("rollout", rollout), ("trainer", trainer), ("tp", tp)) if v is not None})
        session = Session(self, self._json("POST", "sessions/", body=body))
        session.create_model("policy", trainable=True, optimizer=optimizer or {})
        return session

    def session(self, job_id: int, *, next_seq: int = 1) -> Session:
        """A handle on an open session, whose calls go on from number ``next_seq`` (the first
        number another handle, or an earlier run of this program, has not used)."""
        return Session(self, self.job(job_id), next_seq=next_seq)

    def estimate(self, spec: dict[str, Any], *, rollout_devices: int = 1, train_devices: int = 1,
                 deployment_mode: str = "async_split", continue_from: int | None = None,
                 continue_weights: str = "final") -> dict[str, Any]:
        """What a job would cost before it runs (``POST jobs/estimate/``; the arguments of ``submit``,
        nothing is created): ``dedicated_device_hours`` (its declared dedicated deployment),
        ``multiplexed_device_hours`` (what it would be billed), ``savings``, ``step_seconds`` and
        ``basis`` ("profile": from a finished job of the same shape; "model": the cost model).
        An invalid spec raises ``BadRequest`` (400) naming the field, as ``submit`` does."""
        return self._json("POST", "jobs/estimate/", body={
            "spec": spec, "rollout_devices": rollout_devices, "train_devices": train_devices,
            "deployment_mode": deployment_mode, "continue_from": continue_from, "continue_weights": continue_weights})

    def jobs(self, state: str | None = None, *, search: str | None = None) -> list[dict[str, Any]]:
        """The organization's jobs, newest first; ``state``: only those in it (``running``, ...);
        ``search``: a piece of the name."""
        return self._all("jobs/", {"state": state, "search": search})

    def job(self, job_id: int) -> dict[str, Any]:
        """One job with its spec, reservation, state, ``last_step`` and ``savings`` so far."""
        return self._json("GET", f"jobs/{int(job_id)}/")

    def cancel(self, job_id: int, reason: str = "") -> dict[str, Any]:
        """Cancel a job that has not finished (409, ``Conflict``, for one that has); returns the job."""
        return self._json("POST", f"jobs/{int(job_id)}/cancel/", body={"reason": reason})

    def pause(self, job_id: int) -> dict[str, Any]:
        """Pause a queued or running job; returns the job."""
        return self._json("POST", f"jobs/{int(job_id)}/pause/", body={})

    def resume(self, job_id: int) -> dict[str, Any]:
        """Resume a paused job; returns the job."""
        return self._json("POST", f"jobs/{int(job_id)}/resume/", body={})

    def metrics(self, job_id: int, after_step: int | None = None) -> list[dict[str, Any]]:
        """The job's metrics by step, each ``{"step": n, "data": {"reward_mean": ..., ...}}``;
        ``after_step``: only the steps after it. (The metrics endpoint takes no filter, so the
        steps are filtered here.)"""
        rows = self._all(f"jobs/{int(job_id)}/metrics/")
        return rows if after_step is None else [r for r in rows if r["step"] > after_step]

    def metrics_jsonl(self, job_id: int) -> bytes:
        """The job's ``metrics.jsonl``: each step's numbers, a JSON object a line (keys sorted), as
        ``plexrl train`` writes them; same seed, same job, same bytes."""
        return self._send(self._url(f"jobs/{int(job_id)}/metrics/", {"format": "jsonl"}), token=self.token,
                          accept="application/jsonl", timeout=self.timeout)

    def events(self, job_id: int, *, after_seq: int = 0, kind: str | None = None) -> list[dict[str, Any]]:
        """The job's events other than metrics and usage (state changes, logs, artifacts), by
        ``seq``; ``after_seq``: a cursor, only the events after it; ``kind``: only that kind."""
        return self._all(f"jobs/{int(job_id)}/events/", {"after_seq": after_seq or None, "kind": kind})

    def watch(self, job_id: int, poll_s: float = 2.0) -> Iterator[Update]:
        """Follow a job until it ends: yields ``Update("state", job)`` first and at every state
        change, ``Update("metrics", data)`` for each new step (in step order); the terminal state
        (``succeeded``, ``failed``, ``cancelled``) comes last, after every step logged before it.
        Polls every ``poll_s`` seconds::

            for update in client.watch(12):
                if update.kind == "metrics":
                    print(update.data["step"], update.data["reward_mean"])
            print(client.job(12)["state"])
        """
        last_step: int | None = None
        state = None
        while True:
            # the steps first, then the job: a state read after them is at least as new as they are
            rows = self.metrics(job_id, after_step=last_step)
            job = self.job(job_id)
            ended = job["state"] in TERMINAL_STATES
            if job["state"] != state and not ended:
                state = job["state"]
                yield Update("state", job)
            if ended:  # and every step logged before the end, after the last read
                rows += self.metrics(job_id, after_step=rows[-1]["step"] if rows else last_step)
            for row in rows:
                last_step = row["step"]
                yield Update("metrics", {"step": row["step"], **row["data"]})
            if ended:
                yield Update("state", job)
                return
            time.sleep(poll_s)

    # -- billing ------------------------------------------------------------------------------

    def savings(self) -> dict[str, Any]:
        """The savings report: ``jobs`` (per job: ``billed_device_hours``,
        ``counterfactual_device_hours``, ``savings`` as a fraction or None) and ``totals``."""
        return self._json("GET", "billing/savings/")

    def savings_csv(self) -> str:
        """The savings report's per-job rows as the server's CSV (a header row first)."""
        raw = self._send(self._url("billing/savings/", {"format": "csv"}), token=self.token, accept="text/csv",
                         timeout=self.timeout)
        return raw.decode()

    def usage(self, job_id: int | None = None) -> list[dict[str, Any]]:
        """The organization's usage ledger (one metered call per row), by job and seq;
        ``job_id``: one job's only."""
        return self._all("billing/usage/", {"job": job_id})
