"""Isolation fuzzing of the websockets (issue 10; ``test_isolation_fuzz`` is the REST half):
hypothesis generates hostile connections to the real ASGI application (``config.asgi``: the origin
check, authentication, routing, the consumers and the channels-redis layer) while two
organizations, acme and globex, hold jobs with metrics, events and usage, every object named after
its organization:

- the handshake: every route with the other organization's job ids, missing, huge and malformed
  ids, traversal-ish and percent-encoded paths; the other organization's token, ticket or session,
  revoked, expired and forged ones, a removed member's, none, garbage in the Authorization header,
  the ticket and the cookie, a foreign Origin; good and bad ``?last_seq=``;
- what a client sends once connected: JSON of any shape, commands naming the other organization's
  objects and groups, text that is not JSON, binary, empty, deeply nested and huge frames;
- meanwhile both organizations' live points and usage are pushed to their groups.

Every case must end as the protocol says (``jobs.consumers``), computed here from the case alone:
refused at the handshake, closed once with the expected 4xxx code, or open on the caller's own job
or on the cluster. No message may carry the other organization's names or job ids, nothing may
follow a close, no consumer may raise (the communicator re-raises) or log a warning, and after
the fuzzing the same server still serves a legitimate client its job's live points.

Each test is one server: its examples run on the test's event loop (hypothesis drives them from a
worker thread), share its channel layer and database, and the fixtures are built once for all of
them. So ``@given`` wraps an inner function rather than the test: the fixtures are not arguments
of the fuzzed function, which is what hypothesis' function-scoped-fixture health check is about,
and the server can be checked after the last example.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any
from unittest import mock
from urllib.parse import quote, urlencode

import pytest
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.core import signing
from django.utils import timezone
from hypothesis import given, note, settings
from hypothesis import strategies as st

from accounts import services as accounts_services
from accounts import websocket
from accounts.models import ApiToken, Role
from billing.models import UsageEntry
from config.asgi import application
from jobs import broadcast
from jobs.consumers import (
    CLOSE_BAD_REQUEST,
    CLOSE_FORBIDDEN,
    CLOSE_NOT_FOUND,
    CLOSE_TOO_LARGE,
    CLOSE_UNAUTHENTICATED,
    MAX_CLIENT_FRAME,
)
from jobs.models import Job
from tests.platform.builders import usage
from tests.platform.factories import MembershipFactory, UserFactory
from tests.platform.sockets import ORIGIN, bearer, connect, ingest, make_job, session_cookie, token_header
from tests.platform.tenants import Tenant, make_tenant

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("own_channel_layer")]

ACME, GLOBEX = "acme", "globex"  # each organization's slug; its users', jobs' and points' names
ORGANIZATIONS = (ACME, GLOBEX)
NO_ORGANIZATION = "no organization"  # authenticated, a member of none
INVALID = "invalid"  # no credentials, or refused ones
FOREIGN = "foreign origin"  # refused at the handshake
OPEN = "open"
CLOSE_CODES = {CLOSE_BAD_REQUEST, CLOSE_UNAUTHENTICATED, CLOSE_FORBIDDEN, CLOSE_NOT_FOUND, CLOSE_TOO_LARGE}
PROBE_SEQ = 2**64 - 1  # above any ?last_seq= a consumer accepts (< 2**63); msgpack's largest int
TIMEOUT = 5  # seconds for a message that must come; a healthy case never waits for it
# Seconds for the application to end after the client's disconnect. Not longer: channels-redis
# (4.3, with redis-py 8) loses the cancellation of a receive that has only just started, so a
# consumer disconnected within a few ms of its connect (a refused handshake) keeps waiting on its
# dead channel; the wait then cancels it again, as a server's application-close timeout would.
DISCONNECT_WAIT = 1
JOBS_PER_ORGANIZATION = 2
FUZZ = settings(deadline=None, derandomize=True, database=None)

JOB_ROUTE = re.compile(r"/*ws/jobs/([0-9]+)/")  # config.routing (its router strips leading slashes)
CLUSTER_ROUTE = re.compile(r"/*ws/cluster/")


# --- the two organizations -------------------------------------------------------------------------


@dataclass(frozen=True)
class Credential:
    """What a connection presents: ``make()`` gives its headers and query pairs, fresh each time
    (tickets live a minute); ``acts_in`` is where it may act: an organization's slug,
    NO_ORGANIZATION, INVALID or FOREIGN (several where either is right)."""

    name: str
    acts_in: frozenset[str]
    make: Callable[[], tuple[tuple[tuple[bytes, bytes], ...], tuple[tuple[str, str], ...]]] = field(repr=False)


def credential(name: str, *acts_in: str, headers=(), query=()) -> Credential:
    return Credential(name, frozenset(acts_in), lambda: (tuple(headers), tuple(query)))


def authorization(value: str) -> tuple[bytes, bytes]:
    return b"authorization", value.encode()


def ticket(name: str, acts_in: str, user, organization, alter=lambda ticket: ticket) -> Credential:
    return Credential(name, frozenset({acts_in}), lambda: (
        (), (("ticket", alter(websocket.ticket_issue(user=user, organization=organization))),)))


@dataclass
class World:
    tenants: dict[str, Tenant]
    jobs: dict[str, list[Job]]  # by organization slug
    credentials: list[Credential]
    live: dict[str, list[tuple[str, dict[str, Any]]]]  # by slug: (group, message) of its live pushes
    probes: dict[str, dict[str, Any]]  # by group: the message that ends a case (seq PROBE_SEQ)
    viewer: tuple[bytes, bytes]  # an acme viewer's Authorization header: the client after the fuzzing

    def job_ids(self, slug: str) -> set[int]:
        return {job.pk for job in self.jobs.get(slug, ())}

    def owner_of(self, job_id: int) -> str | None:
        return next((slug for slug in ORGANIZATIONS if job_id in self.job_ids(slug)), None)

    @property
    def missing_ids(self) -> list[int]:
        return [max(job.pk for jobs in self.jobs.values() for job in jobs) + 1000, 0, 2**31, 2**63, 10**30]


@pytest.fixture
def world(db) -> World:
    """acme and globex, each with jobs that hold metrics, a log line and a usage entry (ended just
    now, so the cluster socket replays it), every one carrying its organization's slug; and the
    credentials the fuzzing presents."""
    tenants = {slug: make_tenant(slug) for slug in ORGANIZATIONS}
    jobs: dict[str, list[Job]] = {}
    live: dict[str, list[tuple[str, dict[str, Any]]]] = {}
    probes: dict[str, dict[str, Any]] = {}
    now = time.time()
    for slug, tenant in tenants.items():
        jobs[slug] = [make_job(tenant, f"{slug}-secret-{i}") for i in range(JOBS_PER_ORGANIZATION)]
        live[slug] = []
        for job in jobs[slug]:
            ingest(job, [
                {"seq": 1, "kind": "metrics", "ts": now, "data": {"step": 1, "reward_mean": 0.5,
                                                                  "note": f"{slug}-metric"}},
                {"seq": 2, "kind": "log", "ts": now, "data": {"line": f"{slug}-log"}},
                usage(3, 1, now - 2.0, now - 1.0, wpg="rollout-0"),
            ])
            group = broadcast.job_group(job.pk)
            live[slug].append((group, {"type": "metrics", "seq": PROBE_SEQ - 1, "step": 9,
                                       "data": {"step": 9, "note": f"{slug}-live-metric"}}))
            probes[group] = {**broadcast.job_message(Job.objects.get(pk=job.pk)), "seq": PROBE_SEQ}
        entry = UsageEntry.objects.select_related("job", "organization").filter(job=jobs[slug][0]).get()
        live[slug].append((broadcast.CLUSTER_GROUP, {**broadcast.usage_message(entry), "seq": PROBE_SEQ - 1}))
        if slug == ACME:
            probes[broadcast.CLUSTER_GROUP] = {**broadcast.usage_message(entry), "seq": PROBE_SEQ}
    return World(tenants=tenants, jobs=jobs, credentials=_credentials(tenants), live=live, probes=probes,
                 viewer=bearer(tenants[ACME].viewer, tenants[ACME].organization))


def _credentials(tenants: dict[str, Tenant]) -> list[Credential]:
    acme, globex = tenants[ACME], tenants[GLOBEX]
    loner = UserFactory(username="loner")
    leaver = MembershipFactory(organization=acme.organization, role=Role.MEMBER, user__username="acme-leaver").user
    leavers_token = bearer(leaver, acme.organization)
    accounts_services.member_remove(organization=acme.organization, actor=None, user=leaver)
    revoked, token = token_header(acme.member, acme.organization)
    accounts_services.token_revoke(token=token, actor=None)
    expired, token = token_header(acme.member, acme.organization, expires_in_days=1)
    ApiToken.objects.filter(pk=token.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    _, plaintext = accounts_services.token_create(user=acme.owner, organization=acme.organization, name="ws")
    long_ago = signing.b62_encode(int(time.time()) - 10 * websocket.TICKET_MAX_AGE_S)
    with mock.patch.object(signing.TimestampSigner, "timestamp", return_value=long_ago):
        stale = websocket.ticket_issue(user=acme.member, organization=acme.organization)
    acme_token, globex_token = bearer(acme.owner, acme.organization), bearer(globex.owner, globex.organization)
    acme_session, globex_session = session_cookie(acme.viewer), session_cookie(globex.member)
    evil = (b"origin", b"https://evil.example")
    return [
        credential("none", INVALID),
        credential("acme owner's token", ACME, headers=[acme_token]),
        credential("acme viewer's token", ACME, headers=[bearer(acme.viewer, acme.organization)]),
        credential("globex owner's token", GLOBEX, headers=[globex_token]),
        ticket("acme member's ticket", ACME, acme.member, acme.organization),
        ticket("globex viewer's ticket", GLOBEX, globex.viewer, globex.organization),
        credential("acme viewer's session", ACME, headers=[acme_session, ORIGIN]),
        credential("globex member's session", GLOBEX, headers=[globex_session, ORIGIN]),
        credential("a session without Origin", INVALID, headers=[acme_session]),
        credential("a session from another site", FOREIGN, headers=[acme_session, evil]),
        credential("a token from another site", FOREIGN, headers=[acme_token, evil]),
        credential("a member of no organization", NO_ORGANIZATION, headers=[session_cookie(loner), ORIGIN]),
        ticket("a ticket without organization of a non-staff user", INVALID, loner, None),
        credential("a revoked token", INVALID, headers=[revoked]),
        credential("an expired token", INVALID, headers=[expired]),
        credential("a removed member's token", INVALID, headers=[leavers_token]),
        ticket("a removed member's ticket", INVALID, leaver, acme.organization),
        credential("an expired ticket", INVALID, query=[("ticket", stale)]),
        ticket("a forged ticket", INVALID, acme.member, acme.organization,
               alter=lambda t: t[:-4] + ("AAAA" if not t.endswith("AAAA") else "BBBB")),
        Credential("globex's ticket beside acme's token (the ticket counts)", frozenset({GLOBEX}), lambda: (
            (acme_token,), (("ticket", websocket.ticket_issue(user=globex.viewer,
                                                              organization=globex.organization)),))),
        credential("a token with a lower-case scheme", ACME, headers=[authorization(f"bearer {plaintext}")]),
        credential("a token under another scheme", INVALID, headers=[authorization(f"Basic {plaintext}")]),
        credential("a token and more", INVALID, headers=[authorization(f"Bearer {plaintext} x")]),
        credential("a token in the query string", INVALID, query=[("token", plaintext)]),
        credential("a token as the session cookie", INVALID, headers=[(b"cookie", f"sessionid={plaintext}".encode()),
                                                                      ORIGIN]),
    ]


# --- the cases ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    path: str
    credential: Credential
    last_seq: tuple[str | None, bool | None]  # the value (None: absent), whether it is valid (None: either)
    query: tuple[tuple[str, str], ...] = ()  # other query pairs
    frames: tuple[str | bytes, ...] = ()  # sent once connected


# (value, valid): the consumers take an integer in [0, 2**63)
LAST_SEQS = [(None, True), ("0", True), ("2", True), ("0003", True), (str(2**63 - 1), True), ("-1", False),
             (str(2**63), False), ("x", False), ("1.5", False), ("0x10", False), ("1e3", False), (" ", False),
             ("9" * 40, False)]
PATH_TEMPLATES = [  # {0}, {1}: job ids
    "/ws/jobs/{0}", "/ws/jobs/{0}//", "//ws/jobs/{0}/", "/ws//jobs/{0}/", "/ws/jobs/-{0}/", "/ws/jobs/+{0}/",
    "/ws/jobs/{0}.0/", "/ws/jobs/0{0}/", "/ws/jobs/ {0}/", "/ws/jobs/{0}%20/", "/ws/jobs/%3{0}/",
    "/ws/jobs/{0}/../{1}/", "/ws/jobs/{0}/%2e%2e/{1}/", "/ws/jobs/%2e%2e/{0}/", "/ws/jobs/../cluster/",
    "/ws/cluster/../jobs/{0}/", "/ws/jobs/{0}/../../cluster/", "/ws/jobs/{0}%2F..%2F{1}/", "/ws/JOBS/{0}/",
    "/ws/jobs/{0}/metrics/", "/ws/cluster/{0}/", "/ws/cluster", "/ws/", "/", "", "/api/v1/jobs/{0}/",
    "/ws/jobs/{0}%00/", "/ws/jobs/\u0661/",
]
CLIENT_TYPES = ["subscribe", "unsubscribe", "join", "leave", "cancel", "replay", "job", "metrics", "event",
                "usage", "push", "credentials.ended", "websocket.close", "ping", ""]


def route_of(path: str) -> tuple[str, int | None]:
    """Where ``config.routing`` sends a connection's (decoded) path."""
    if match := JOB_ROUTE.fullmatch(path):
        return "job", int(match[1])
    return ("cluster", None) if CLUSTER_ROUTE.fullmatch(path) else ("none", None)


def frame_close(frame: str | bytes) -> int | None:
    """What a client's frame does (``jobs.consumers``): clients only listen, so a JSON text frame is
    ignored (None) and any other closes the socket."""
    if len(frame) > MAX_CLIENT_FRAME:
        return CLOSE_TOO_LARGE
    if isinstance(frame, bytes):
        return CLOSE_BAD_REQUEST
    try:
        json.loads(frame)
    except (ValueError, RecursionError):
        return CLOSE_BAD_REQUEST
    return None


def outcomes(world: World, acts_in: str, route: tuple[str, int | None], last_seq_valid: bool | None) -> set:
    """What a connection gets at once (``jobs.consumers``' step 1, in its order): None (refused at
    the handshake), a close code, or OPEN."""
    kind, job_id = route
    if acts_in == FOREIGN:
        return {None}
    if kind == "none":
        return {CLOSE_NOT_FOUND}
    if acts_in == INVALID:
        return {CLOSE_UNAUTHENTICATED}
    if kind == "cluster" and acts_in == NO_ORGANIZATION:
        return {CLOSE_FORBIDDEN}
    found = {CLOSE_BAD_REQUEST} if last_seq_valid is not True else set()
    if last_seq_valid is not False:
        found.add(OPEN if kind == "cluster" or world.owner_of(job_id) == acts_in else CLOSE_NOT_FOUND)
    return found


def json_values() -> st.SearchStrategy[Any]:
    scalars = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=16)
    return st.recursive(scalars, lambda children: st.lists(children, max_size=4)
                        | st.dictionaries(st.text(max_size=8), children, max_size=4), max_leaves=10)


def padded(size: int) -> str:
    """A JSON text frame of exactly ``size`` characters."""
    return json.dumps({"pad": "x" * (size - len(json.dumps({"pad": ""})))})


def frames(world: World) -> st.SearchStrategy[str | bytes]:
    every_id = [job.pk for jobs in world.jobs.values() for job in jobs] + world.missing_ids
    names = [job.name for jobs in world.jobs.values() for job in jobs]
    groups = [broadcast.job_group(i) for i in every_id] + [broadcast.CLUSTER_GROUP, "auth-token-1"]
    anything = json_values()
    commands = st.fixed_dictionaries(
        {"type": st.sampled_from(CLIENT_TYPES) | st.text(max_size=12)},
        optional={"job": st.sampled_from(every_id) | anything, "job_id": st.sampled_from(every_id) | anything,
                  "name": st.sampled_from(names), "group": st.sampled_from(groups), "organization":
                  st.sampled_from([*ORGANIZATIONS, 1, 2]), "last_seq": anything, "messages": anything,
                  "seq": st.integers()})
    malformed = st.sampled_from(["", "{", "}", "[1,", "nul", '{"type": "subscribe"', "'x'", "\x00",
                                 "[" * 2000 + "]" * 2000, "{}" * 3])
    huge = st.builds(lambda size, binary: b"\x00" * size if binary else padded(size),
                     st.sampled_from([MAX_CLIENT_FRAME, MAX_CLIENT_FRAME + 1, 2**16, 2**20, 2**24]), st.booleans())
    return st.one_of(commands.map(json.dumps), anything.map(json.dumps), st.text(max_size=40), malformed,
                     st.binary(max_size=64), huge)


def garbage_credentials() -> st.SearchStrategy[Credential]:
    raw = st.binary(max_size=120)
    return st.one_of(
        raw.map(lambda v: credential("garbage Authorization", INVALID, headers=[(b"authorization", v)])),
        raw.map(lambda v: credential("garbage bearer token", INVALID, headers=[(b"authorization", b"Bearer " + v)])),
        st.text(min_size=1, max_size=60).map(lambda v: credential("garbage ticket", INVALID, query=[("ticket", v)])),
        # Django looks up keys of 8 characters or more
        (st.binary(min_size=8, max_size=40) | st.sampled_from([b"abcdefgh\x00ijk", b"\xff" * 32, b"../" * 12])).map(
            lambda v: credential("garbage session id", INVALID, headers=[(b"cookie", b"sessionid=" + v), ORIGIN])),
        raw.map(lambda v: credential("garbage cookie", INVALID, headers=[(b"cookie", v), ORIGIN])),
        (raw | st.sampled_from([b"http://[", b"//[::1", b"http://]", b"null", b"http://localhost:99999"])).map(
            lambda v: credential("garbage Origin", INVALID, FOREIGN, headers=[(b"origin", v)])),
    )


def weighted(*choices: tuple[int, st.SearchStrategy]) -> st.SearchStrategy:
    """One of the strategies, each drawn ``weight`` times as often as one of weight 1."""
    return st.sampled_from([strategy for weight, strategy in choices for _ in range(weight)]).flatmap(
        lambda strategy: strategy)


def members(world: World) -> list[Credential]:
    """The credentials of a member of acme or globex (their sockets open)."""
    return [c for c in world.credentials if len(c.acts_in) == 1 and next(iter(c.acts_in)) in ORGANIZATIONS]


def handshakes(world: World) -> st.SearchStrategy[Case]:
    every_id = st.sampled_from([job.pk for jobs in world.jobs.values() for job in jobs] + world.missing_ids)
    job_paths = every_id.map(lambda i: f"/ws/jobs/{i}/")
    paths = weighted(
        (2, job_paths),
        (1, st.just("/ws/cluster/")),
        (1, st.builds(str.format, st.sampled_from(PATH_TEMPLATES), every_id, every_id)),
        (1, st.builds(lambda prefix, junk: prefix + quote(junk, safe=""),
                      st.sampled_from(["/ws/jobs/", "/ws/cluster/", "/ws/", "/"]) | job_paths, st.text(max_size=20))),
    )
    other_keys = st.text(max_size=8).filter(lambda key: key not in ("ticket", "last_seq"))
    return st.builds(
        Case, path=paths,
        credential=weighted((2, st.sampled_from(members(world))), (2, st.sampled_from(world.credentials)),
                            (2, garbage_credentials())),
        last_seq=weighted((2, st.just((None, True))), (2, st.sampled_from(LAST_SEQS)),
                          (1, st.text(max_size=12).map(lambda v: (v, None)))),
        query=st.lists(st.tuples(other_keys, st.text(max_size=12)), max_size=2).map(tuple),
        frames=weighted((1, st.just(())), (1, st.lists(frames(world), min_size=1, max_size=2).map(tuple))),
    )


def open_sockets(world: World) -> st.SearchStrategy[Case]:
    """Connections that open (a member's credentials, their own job or the cluster) and then send."""
    return st.sampled_from(members(world)).flatmap(lambda member: st.builds(
        Case, credential=st.just(member),
        path=st.sampled_from([f"/ws/jobs/{job.pk}/" for job in world.jobs[next(iter(member.acts_in))]]
                             + ["/ws/cluster/"]),
        last_seq=st.sampled_from([seq for seq in LAST_SEQS if seq[1]]),
        frames=st.lists(frames(world), min_size=1, max_size=5).map(tuple),
    ))


# --- one case against the server ---------------------------------------------------------------------


def push_live(world: World, route: tuple[str, int | None]) -> None:
    """Both organizations' live points and usage to their groups, then the probe of the case's
    group: a socket that forwards any of them has done so before it forwards the probe."""
    for pushes in world.live.values():
        for group, message in pushes:
            broadcast.send(group, [message])
    group = broadcast.CLUSTER_GROUP if route[0] == "cluster" else broadcast.job_group(route[1] or 0)
    if group in world.probes:
        broadcast.send(group, [world.probes[group]])


async def exchange(world: World, case: Case) -> set[str | int]:
    """Run one case and check what came back; returns its outcomes for the tally: OPEN when the
    socket opened, the close code when it closed."""
    headers, query = case.credential.make()
    pairs = [*query, *case.query] + ([("last_seq", case.last_seq[0])] if case.last_seq[0] is not None else [])
    url = case.path + ("?" + urlencode(pairs) if pairs else "")
    communicator = WebsocketCommunicator(application, url, headers=list(headers))
    route = route_of(communicator.scope["path"])
    expected = set().union(*(outcomes(world, acts_in, route, case.last_seq[1]) for acts_in in case.credential.acts_in))
    connected, _ = await communicator.connect(timeout=TIMEOUT)
    if not connected:
        # channels' denier, on a receive just started (see DISCONNECT_WAIT): ended at once, as no
        # platform code runs after a refused handshake
        await communicator.disconnect(timeout=0.01)
        assert None in expected, f"refused at the handshake, expected {expected}"
        return {"refused at the handshake"}

    hostile = next((code for code in map(frame_close, case.frames) if code is not None), None)
    for frame in case.frames:
        await communicator.send_input({"type": "websocket.receive", "text" if isinstance(frame, str) else "bytes":
                                       frame})
    await database_sync_to_async(push_live)(world, route)
    outputs: list[dict[str, Any]] = []
    while not outputs or outputs[-1]["type"] != "websocket.close":
        try:
            outputs.append(await communicator.receive_output(timeout=TIMEOUT))
        except TimeoutError:
            raise AssertionError(f"neither a close nor the probe within {TIMEOUT} s (expected {expected}, "
                                 f"frames close with {hostile}); received {outputs}") from None
        if hostile is None and _is_probe(outputs[-1]):
            break
    await communicator.disconnect(timeout=DISCONNECT_WAIT)  # re-raises whatever the consumer raised
    while not communicator.output_queue.empty():  # what it sent before it saw the disconnect
        outputs.append(communicator.output_queue.get_nowait())

    closes = [output for output in outputs if output["type"] == "websocket.close"]
    assert all(output["type"] in ("websocket.send", "websocket.close") for output in outputs), outputs
    assert len(closes) <= 1, f"closed more than once: {closes}"
    assert not closes or outputs[-1] is closes[0], f"sent after the close: {outputs}"
    assert all("text" in output for output in outputs if output["type"] == "websocket.send"), "a binary frame"
    texts = [output["text"] for output in outputs if output["type"] == "websocket.send"]
    messages = [json.loads(text) for text in texts]
    acts_in = next(iter(case.credential.acts_in)) if len(case.credential.acts_in) == 1 else INVALID
    assert_isolated(world, acts_in, route, texts, messages)
    if not closes:
        assert OPEN in expected, f"left open, expected {expected}"
        assert hostile is None, f"left open after a frame that closes with {hostile}"
        assert any(_is_probe(output) for output in outputs), "open, but the probe never came"
        return {OPEN}
    code = closes[0].get("code")
    assert code in CLOSE_CODES, closes
    assert not any(slug in str(closes[0].get("reason", "")).lower() for slug in ORGANIZATIONS), closes
    assert (code in expected and not messages) or (OPEN in expected and code == hostile), (
        f"closed with {code} after {len(messages)} messages; expected {expected} (frames close with {hostile})")
    return {code, OPEN} if messages else {code}


def _is_probe(output: dict[str, Any]) -> bool:
    if output["type"] != "websocket.send" or not isinstance(output.get("text"), str):
        return False
    try:
        message = json.loads(output["text"])
    except ValueError:
        return False
    return isinstance(message, dict) and message.get("seq") == PROBE_SEQ


def assert_isolated(world: World, acts_in: str, route: tuple[str, int | None], texts: list[str],
                    messages: list[Any]) -> None:
    """Nothing a connection acting in ``acts_in`` received names another organization or carries
    one of its job ids; every message is of the socket's own job, or the cluster's (anonymised)."""
    others = [slug for slug in ORGANIZATIONS if slug != acts_in]
    own = world.job_ids(acts_in)
    for text, message in zip(texts, messages, strict=True):
        assert not any(slug in text.lower() for slug in others), f"acting in {acts_in}, received {text[:300]}"
        assert isinstance(message, dict), text[:300]
        if message.get("type") == "usage":
            interval = message["interval"]
            assert route[0] == "cluster", (route, text[:300])
            assert interval["job"] is None or interval["job"] in own, (acts_in, text[:300])
            assert interval["own"] == (interval["job"] is not None), text[:300]
            assert interval["organization"] in (None, world.tenants[acts_in].organization.name), text[:300]
        else:
            assert message.get("type") in ("job", "metrics", "event"), text[:300]
            assert route[0] == "job", (route, text[:300])
            assert route[1] in own, (acts_in, route, text[:300])
            assert message["type"] != "job" or message["job"]["id"] == route[1], text[:300]
    if route[0] == "job" and messages:
        assert messages[0]["type"] == "job", "a job socket starts with the job's snapshot"


# --- after the fuzzing -------------------------------------------------------------------------------


async def assert_still_serves(world: World) -> None:
    """A legitimate client still connects and gets its job's replay and live points, and the
    cluster's live usage: nothing the fuzzing did wedged the server."""
    job = world.jobs[ACME][0]
    socket = await connect(f"/ws/jobs/{job.pk}/", world.viewer)
    cluster = await connect("/ws/cluster/", world.viewer)
    replay = [await socket.receive_json_from(timeout=TIMEOUT) for _ in range(3)]
    assert [(m["type"], m["seq"]) for m in replay] == [("job", 3), ("metrics", 1), ("event", 2)]
    assert replay[0]["job"]["id"] == job.pk
    now = time.time()
    await database_sync_to_async(ingest)(job, [
        {"seq": 4, "kind": "metrics", "ts": now, "data": {"step": 2, "reward_mean": 0.75}},
        usage(5, 2, now - 1.0, now, wpg="rollout-0")])
    while (message := await socket.receive_json_from(timeout=TIMEOUT))["type"] != "metrics":
        assert message["type"] == "job", message
    assert (message["seq"], message["data"]["reward_mean"]) == (4, 0.75)
    while (message := await cluster.receive_json_from(timeout=TIMEOUT))["interval"]["end"] != now:
        pass
    assert (message["interval"]["job"], message["interval"]["own"]) == (job.pk, True)
    for communicator in (socket, cluster):
        await communicator.disconnect()


async def fuzz(world: World, cases: st.SearchStrategy[Case], max_examples: int) -> Counter:
    """Run ``max_examples`` cases on this loop (one server); the tally of their outcomes."""
    loop = asyncio.get_running_loop()
    tally: Counter = Counter()

    @settings(FUZZ, max_examples=max_examples)
    @given(case=cases)
    def run(case: Case) -> None:
        note(f"{case.credential.name}: {case.credential.make()[0]} {case.path!r} last_seq={case.last_seq[0]!r} "
             f"query={case.query} frames={[frame[:100] for frame in case.frames]}")
        tally.update(asyncio.run_coroutine_threadsafe(exchange(world, case), loop).result(timeout=60))

    await asyncio.to_thread(run)
    return tally


def complaints(caplog) -> list[str]:
    return [f"{r.name}: {r.getMessage()}" for r in caplog.records if r.levelno >= logging.WARNING]


# --- the fuzzing -------------------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_no_handshake_errs_opens_another_organizations_job_or_wedges_the_server(world, caplog):
    tally = await fuzz(world, handshakes(world), max_examples=150)
    assert not complaints(caplog)
    await assert_still_serves(world)
    # the fuzzing reached every answer, not only the door
    assert {OPEN, CLOSE_UNAUTHENTICATED, CLOSE_NOT_FOUND, CLOSE_BAD_REQUEST} <= set(tally), tally
    assert tally[OPEN] >= 10, tally


@pytest.mark.asyncio
async def test_no_client_frame_errs_leaks_or_wedges_the_server(world, caplog):
    tally = await fuzz(world, open_sockets(world), max_examples=75)
    assert not complaints(caplog)
    await assert_still_serves(world)
    assert {OPEN, CLOSE_BAD_REQUEST, CLOSE_TOO_LARGE} <= set(tally), tally
