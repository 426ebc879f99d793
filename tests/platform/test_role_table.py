"""Who may do what, as one table (issue 30): the role table (``tests/platform/role_table.py``) names
every REST operation of the OpenAPI schema and every websocket route, and each role gets the answer
it says.

- Coverage: an operation of the schema or the routing without a row fails, naming it; so does a
  row of an operation that is gone. A new endpoint cannot ship without a decision.
- Behaviour: for each (operation, role), fresh objects in acme and globex, a valid request (an
  allowed role gets its 200/201/204, never a 400), and the answer the table gives. A refused write
  changes nothing in the database; an allowed one changes something (unless it writes nothing by
  design). A 2xx answer never shows the other organization's names (acme's to globex's owner and to
  a user of no organization, globex's to acme's members).

Nothing reaches the engine: a job's launch goes to Celery on commit, and each case runs in a
transaction that never commits. The websocket cases drive the real ASGI application
(``config.asgi``) from this thread, so that its database work runs here, in the test's transaction.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import timedelta
from functools import cached_property
from pathlib import Path
from typing import Any

import channels.db
import pytest
from asgiref.sync import async_to_sync
from channels.testing import WebsocketCommunicator
from django.apps import apps
from django.core.files.uploadedfile import SimpleUploadedFile
from django.urls import URLPattern
from django.urls.resolvers import RoutePattern
from django.utils import timezone
from drf_spectacular.generators import SchemaGenerator
from rest_framework.test import APIClient

from accounts import services as accounts_services
from accounts.models import ApiToken, Plan, Role, User, token_digest
from config.asgi import application
from config.routing import websocket_urlpatterns
from jobs.ingest import ingest_events
from jobs.models import Dataset, Job, JobEvent, JobState, RegisteredModel
from notifications.models import Webhook
from notifications.services import webhook_create
from tests.modelfiles import build_tiny_model
from tests.platform.builders import SPEC, jsonl, make_dataset, streamed_body, usage_event
from tests.platform.factories import PASSWORD, MembershipFactory, PlanFactory, UserFactory
from tests.platform.role_table import ACCEPT, ACME_ROLES, KNOWN_WRONG, ROLES, TABLE, parse
from tests.platform.sockets import ORIGIN, session_cookie
from tests.platform.tenants import Tenant, make_tenant

pytestmark = pytest.mark.django_db
HOOK_URL = "http://127.0.0.1:9/hook"  # never called: no job ends here

HTTP_METHODS = ("get", "post", "put", "patch", "delete")
WEBSOCKET_TIMEOUT = 5  # seconds for the first message of a socket; a healthy case never waits it out


# --- the operations there are ----------------------------------------------------------------------


def rest_operations() -> set[str]:
    """Every operation of the OpenAPI schema, as ``"POST /api/v1/jobs/"``."""
    schema = SchemaGenerator().get_schema(request=None, public=True)
    return {f"{method.upper()} {path}" for path, item in schema["paths"].items() for method in item
            if method in HTTP_METHODS}


def websocket_route(pattern: URLPattern) -> str:
    """A websocket route as the table names it: ``/ws/jobs/{job_id}/``; ``*`` for the catch-all."""
    if isinstance(pattern.pattern, RoutePattern):
        return "/" + re.sub(r"<(?:\w+:)?(\w+)>", r"{\1}", str(pattern.pattern))
    regex = str(pattern.pattern)
    return "*" if regex in ("", "^", ".*", "^.*") else f"re:{regex}"


def websocket_operations() -> set[str]:
    assert all(isinstance(pattern, URLPattern) for pattern in websocket_urlpatterns), "nested routers: name them"
    return {f"WS {websocket_route(pattern)}" for pattern in websocket_urlpatterns}


def test_every_operation_has_a_row():
    missing = sorted((rest_operations() | websocket_operations()) - TABLE.keys())
    assert not missing, "\n".join(
        f"add a row to the role table (tests/platform/role_table.py) for {operation}" for operation in missing)


def test_every_row_is_an_operation_there_is():
    gone = sorted(TABLE.keys() - rest_operations() - websocket_operations())
    assert not gone, "\n".join(
        f"the role table has a row for {operation}, which is neither in the schema nor in the websocket "
        f"routing: remove it" for operation in gone)


def test_the_table_decides_every_role_of_every_row():
    assert all(tuple(answers) == ROLES for answers in TABLE.values())
    assert set(KNOWN_WRONG) <= {(operation, role) for operation in TABLE for role in ROLES}
    with pytest.raises(ValueError, match="9 answers for 10 roles"):
        parse("GET /api/v1/x/ 200 200 200 200 200 200 200 200 200")
    with pytest.raises(ValueError, match="'open' is no answer"):
        parse("GET /api/v1/x/ open 200 200 200 200 200 200 200 200 200")


# --- the objects of a case -------------------------------------------------------------------------

# The state the case's job (another acme member's) is in: one each action may act on.
JOB_STATES = {"POST /api/v1/jobs/{job_id}/resume/": JobState.PAUSED}


def make_job(tenant: Tenant, user: User, name: str, state: str = JobState.RUNNING) -> Job:
    return Job.objects.create(organization=tenant.organization, created_by=user, name=name, spec=SPEC, state=state,
                              started_at=timezone.now())


class World:
    """One case's objects: acme and globex, each with a member of every role and a running job, and
    whatever the operation's path and body name (built on first use, all before the request)."""

    def __init__(self, operation: str, tmp_path: Path):
        self.operation = operation
        self.tmp_path = tmp_path
        self.acme = make_tenant("acme")
        self.globex = make_tenant("globex")
        self.globex_job = make_job(self.globex, self.globex.member, "globex-job")
        self.job = make_job(self.acme, self.bystander, "acme-job", JOB_STATES.get(operation, JobState.RUNNING))
        if "billing/" in operation or "cluster/" in operation:
            self.add_recent_usage()

    def _acme_member(self, name: str) -> User:
        return MembershipFactory(organization=self.acme.organization, role=Role.MEMBER, user__username=name).user

    @cached_property
    def bystander(self) -> User:
        """Another acme member: the job, the dataset and the token acted on are theirs."""
        return self._acme_member("acme-bystander")

    @cached_property
    def target(self) -> User:
        """The acme member shown, changed or removed."""
        return self._acme_member("acme-target")

    @cached_property
    def newcomer(self) -> User:
        """A user of no organization yet: added as a member, made an organization's owner."""
        return UserFactory(username="newcomer")

    @cached_property
    def token(self) -> ApiToken:
        return accounts_services.token_create(user=self.bystander, organization=self.acme.organization,
                                              name="acme-token")[0]

    @cached_property
    def session(self) -> Job:
        """Another acme member's session, closed by its tenant."""
        job = make_job(self.acme, self.bystander, "acme-session", JobState.SUCCEEDED)
        Job.objects.filter(pk=job.pk).update(spec={**SPEC, "algorithm": "session"}, state_reason="closed by the tenant")
        return job

    @cached_property
    def webhook(self) -> Webhook:
        return webhook_create(organization=self.acme.organization, user=self.acme.admin, url=HOOK_URL,
                              events=["job.failed"])

    @cached_property
    def dataset(self) -> Dataset:
        return make_dataset(self.acme, user=self.bystander, name="acme-data")

    @cached_property
    def artifact(self) -> tuple[str, str]:
        """The job's artifact (its name) and a file of it."""
        folder = self.tmp_path / "final"
        folder.mkdir()
        (folder / "config.json").write_text('{"model_type": "qwen2"}')
        JobEvent.objects.create(job=self.job, seq=1, kind="artifact", ts=1.0,
                                data={"name": "final", "path": str(folder), "files": ["config.json"]})
        return "final", "config.json"

    @cached_property
    def model_folder(self) -> Path:
        """A Hugging Face model folder staff may register."""
        folder = self.tmp_path / "model"
        folder.mkdir()
        (folder / "config.json").write_text("{}")
        (folder / "model.safetensors").write_bytes(b"weights")
        (folder / "tokenizer.json").write_text("{}")
        return folder

    @cached_property
    def model(self) -> RegisteredModel:
        """One of acme's uploaded models, another member's."""
        folder = self.tmp_path / "home" / "model-uploads" / str(self.acme.organization.pk) / "m"
        folder.mkdir(parents=True)
        return RegisteredModel.objects.create(organization=self.acme.organization, name="acme-model", path=str(folder),
                                              architecture="Qwen2ForCausalLM", registered_by=self.bystander)

    def model_parts(self) -> list[SimpleUploadedFile]:
        """The files of a tiny random model, as an upload's parts."""
        folder = build_tiny_model(self.tmp_path / "upload")
        return [SimpleUploadedFile(f.name, f.read_bytes()) for f in sorted(folder.iterdir())]

    def add_recent_usage(self) -> None:
        """A call of each job (acme's first) that ended a second ago: billed, on the cluster's
        timeline, and what the cluster socket replays on connect."""
        now = timezone.now().timestamp()
        for job in (self.job, self.globex_job):
            ingest_events(job=job, events=[usage_event(1, job=job, start=now - 2, end=now - 1)])

    @cached_property
    def plan(self) -> Plan:
        """A plan no organization is on yet, to put acme on."""
        return PlanFactory(name="gold", max_concurrent_jobs=3)

    # --- who calls ----------------------------------------------------------------------------------

    def credentials(self, role: str) -> str | User | None:
        """A role's token (its plaintext), session user, or None (anonymous)."""
        if role in ACME_ROLES:
            return self._plaintext(self.acme.user(role), self.acme)
        if role == "outsider":
            return self._plaintext(self.globex.owner, self.globex)
        if role == "no_org":
            return UserFactory(username="loner")
        if role == "staff":
            return UserFactory(username="root", is_staff=True)
        if role in ("expired", "revoked"):
            plaintext = self._plaintext(self.acme.owner, self.acme, expires_in_days=1)
            now = timezone.now()
            ended = {"expires_at": now - timedelta(seconds=1)} if role == "expired" else {"revoked_at": now}
            ApiToken.objects.filter(digest=token_digest(plaintext)).update(**ended)
            return plaintext
        assert role == "anonymous", role
        return None

    @staticmethod
    def _plaintext(user: User, tenant: Tenant, **kwargs) -> str:
        return accounts_services.token_create(user=user, organization=tenant.organization, name="role-table",
                                              **kwargs)[1]


@pytest.fixture
def world(request, settings, tmp_path) -> World:
    settings.PLEXRL_HOME = tmp_path / "home"  # the dataset files
    return World(request.node.callspec.params["operation"], tmp_path)


# What the path parameters name.
PATH_PARAMETERS: dict[str, Callable[[World], Any]] = {
    "organization_id": lambda world: world.acme.organization.pk,
    "user_id": lambda world: world.target.pk,
    "token_id": lambda world: world.token.pk,
    "job_id": lambda world: world.job.pk,
    "session_id": lambda world: world.session.pk,
    "seq": lambda world: 1,
    "name": lambda world: world.artifact[0],
    "filename": lambda world: world.artifact[1],
    "dataset_id": lambda world: world.dataset.pk,
    "model_id": lambda world: world.model.pk,
    "plan_id": lambda world: world.acme.organization.plan_id,
    "webhook_id": lambda world: world.webhook.pk,
}

# A valid body of each operation that takes one: (data, format).
BODIES: dict[str, Callable[[World], tuple[dict[str, Any], str]]] = {
    "POST /api/v1/auth/token/": lambda world: (
        {"username": world.acme.viewer.username, "password": PASSWORD, "name": "login"}, "json"),
    "POST /api/v1/tokens/": lambda world: ({"name": "new-token", "expires_days": 30}, "json"),
    "POST /api/v1/organizations/": lambda world: ({"name": "Initech", "owner": world.newcomer.username}, "json"),
    "POST /api/v1/organizations/{organization_id}/members/": lambda world: (
        {"username": world.newcomer.username, "role": "member"}, "json"),
    "PATCH /api/v1/organizations/{organization_id}/members/{user_id}/": lambda world: ({"role": "viewer"}, "json"),
    "PATCH /api/v1/quota/": lambda world: ({"max_concurrent_jobs": 7}, "json"),
    "POST /api/v1/jobs/": lambda world: ({"name": "new-job", "spec": SPEC}, "json"),
    "POST /api/v1/jobs/estimate/": lambda world: ({"spec": SPEC}, "json"),
    "POST /api/v1/jobs/{job_id}/cancel/": lambda world: ({"reason": "the role table"}, "json"),
    "POST /api/v1/sessions/": lambda world: ({"name": "new-session", "model": "tiny-arith", "rollout": "torch",
                                              "trainer": "torch"}, "json"),
    "POST /api/v1/sessions/{session_id}/calls/": lambda world: ({"seq": 1, "fn": "optim_step"}, "json"),
    "POST /api/v1/datasets/": lambda world: (
        {"name": "uploaded", "file": SimpleUploadedFile("d.jsonl", jsonl())}, "multipart"),
    "POST /api/v1/models/": lambda world: ({"name": "registered", "path": str(world.model_folder)}, "json"),
    "POST /api/v1/models/upload/": lambda world: ({"name": "uploaded", "files": world.model_parts()}, "multipart"),
    "POST /api/v1/plans/": lambda world: ({"name": "platinum", "max_concurrent_jobs": 5, "weight": 2.0}, "json"),
    "PATCH /api/v1/plans/{plan_id}/": lambda world: ({"max_concurrent_jobs": 5}, "json"),
    "PUT /api/v1/organizations/{organization_id}/plan/": lambda world: ({"plan": world.plan.name}, "json"),
    "POST /api/v1/webhooks/": lambda world: ({"url": HOOK_URL, "events": ["job.failed"]}, "json"),
    "PUT /api/v1/notifications/email/": lambda world: ({"events": ["job.failed"]}, "json"),
}

# Writes that store nothing when allowed (the rest must change the database).
WRITES_NOTHING = {
    "POST /api/v1/ws-ticket/",  # a signed ticket, never stored
    "POST /api/v1/organizations/{organization_id}/switch/",  # the session's organization
    "POST /api/v1/jobs/estimate/",
}

# What a websocket route connects to, and how many messages an accepted connection gets at once:
# the job's snapshot; the replay of both organizations' usage.
WEBSOCKETS: dict[str, tuple[Callable[[World], str], int]] = {
    "/ws/jobs/{job_id}/": (lambda world: f"/ws/jobs/{world.job.pk}/", 1),
    "/ws/cluster/": (lambda world: "/ws/cluster/", 2),
    "*": (lambda world: "/ws/no-such-route/", 0),
}

# Fields a request may change without writing anything (when a token or a user was last used).
VOLATILE_FIELDS = {"last_used_at", "last_login"}


def url_of(world: World, path: str) -> str:
    def value(match: re.Match) -> str:
        name = match.group(1)
        assert name in PATH_PARAMETERS, f"the role table's test cannot fill {{{name}}}: add it to PATH_PARAMETERS"
        return str(PATH_PARAMETERS[name](world))

    return re.sub(r"\{(\w+)\}", value, path)


def database_state() -> dict[str, list[tuple]]:
    """Every row of the apps' tables (but the volatile fields): what a refused write must leave as it was."""
    state = {}
    for label in ("accounts", "jobs", "billing", "notifications"):
        for model in apps.get_app_config(label).get_models():
            fields = [f.attname for f in model._meta.concrete_fields if f.name not in VOLATILE_FIELDS]
            state[model._meta.label] = list(model._base_manager.order_by("pk").values_list(*fields))
    return state


def other_organization(role: str) -> str | None:
    """The organization whose names a role's 2xx answers must not show."""
    if role in ACME_ROLES:
        return "globex"
    if role in ("outsider", "no_org"):
        return "acme"
    return None  # staff see every organization; the others get nothing


# --- the behaviour ---------------------------------------------------------------------------------


def cases() -> list:
    return [
        pytest.param(operation, role, id=f"{operation} as {role}", marks=(
            [pytest.mark.xfail(strict=True, reason=KNOWN_WRONG[operation, role])]
            if (operation, role) in KNOWN_WRONG else []))
        for operation in TABLE for role in ROLES
    ]


@pytest.mark.parametrize(("operation", "role"), cases())
def test_each_role_gets_the_tables_answer(operation, role, world, settings, monkeypatch):
    method, path = operation.split(" ", 1)
    expected = TABLE[operation][role]
    if method == "WS":
        # The in-memory layer: the answer does not depend on the layer, and channels-redis keeps a
        # consumer refused within milliseconds of its connect waiting a second on its dead channel.
        settings.CHANNEL_LAYERS = {"default": {"BACKEND": "config.layers.LoopSafeInMemoryChannelLayer"}}
        # The consumers' database work runs in this thread (see websocket_answer), inside the test's
        # transaction: channels must not close the connection around it.
        monkeypatch.setattr(channels.db, "close_old_connections", lambda **kwargs: None)
        answer, text = websocket_answer(world, path, role)
        assert answer == expected, f"{operation} as {role}: {answer}, the table says {expected}"
    else:
        status, text = rest_answer(world, operation, role)
        assert status == expected, f"{operation} as {role}: {status}, the table says {expected}: {text[:500]}"
    other = other_organization(role)
    if other and operation != "POST /api/v1/auth/token/":  # the login answers for the body's user
        assert other not in text.lower(), f"{operation} as {role} shows {other}'s data: {text[:500]}"


def rest_answer(world: World, operation: str, role: str) -> tuple[int, str]:
    """Send the operation as ``role`` with a valid body; the status and the body. A refused write
    must change nothing; an allowed one must change something (but ``WRITES_NOTHING``)."""
    method, path = operation.split(" ", 1)
    client = APIClient()
    credentials = world.credentials(role)
    if isinstance(credentials, str):
        client.credentials(HTTP_AUTHORIZATION=f"Bearer {credentials}")
    elif credentials is not None:
        client.force_login(credentials)
    url = url_of(world, path)
    data, format_ = BODIES[operation](world) if operation in BODIES else (None, "json")
    writes = method != "GET"
    before = database_state() if writes else None
    response = getattr(client, method.lower())(url, data, format=format_)
    if response.streaming:
        text = streamed_body(response).decode(errors="replace")
        response.close()
    else:
        text = response.content.decode(errors="replace")
    if writes:
        after = database_state()
        if not 200 <= response.status_code < 300:
            changed = sorted(label for label in after if after[label] != before[label])
            assert not changed, f"{operation} as {role} was refused ({response.status_code}) but changed {changed}"
        elif operation not in WRITES_NOTHING:
            assert after != before, f"{operation} as {role} answered {response.status_code} but wrote nothing"
    return response.status_code, text


def websocket_answer(world: World, route: str, role: str) -> tuple[int | str, str]:
    """Open the route as ``role``: ACCEPT and the messages it sends at once, or the close code (and "").

    Run by ``async_to_sync`` from this thread, so each ``database_sync_to_async`` call of the
    application runs in this thread too (asgiref sends thread-sensitive work back to the outermost
    sync thread), inside the test's transaction."""
    credentials = world.credentials(role)
    if isinstance(credentials, str):
        headers = [(b"authorization", f"Bearer {credentials}".encode())]
    elif credentials is not None:
        headers = [session_cookie(credentials), ORIGIN]  # a browser: its cookie and the platform's Origin
    else:
        headers = []
    path, messages = WEBSOCKETS[route]
    return async_to_sync(_connect)(path(world), headers, messages)


async def _connect(path: str, headers: list[tuple[bytes, bytes]], messages: int) -> tuple[int | str, str]:
    communicator = WebsocketCommunicator(application, path, headers=headers)
    connected, code = await communicator.connect(timeout=WEBSOCKET_TIMEOUT)
    if not connected:
        return f"refused at the handshake ({code})", ""
    received = [await communicator.receive_output(timeout=WEBSOCKET_TIMEOUT)]
    while received[-1]["type"] != "websocket.close" and len(received) < messages:
        received.append(await communicator.receive_output(timeout=WEBSOCKET_TIMEOUT))
    await communicator.disconnect()
    if received[-1]["type"] == "websocket.close":
        return received[-1].get("code"), ""
    return ACCEPT, "\n".join(message.get("text") or "" for message in received)
