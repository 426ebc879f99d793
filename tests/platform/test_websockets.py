"""The live dashboard's websockets (``/ws/jobs/<id>/``, ``/ws/cluster/``) against the real ASGI
application and the channels-redis layer: who may connect, the replay and the live pushes after
``ingest_events`` commits, exactly once across a reconnect, nothing from a rolled-back ingest, and
another organization's usage anonymised on the cluster socket.

The database work runs in transactional tests (the consumers read it from other threads, and the
pushes happen on commit), always through ``database_sync_to_async``.
"""

from __future__ import annotations

from datetime import timedelta
from types import SimpleNamespace
from typing import Any

import pytest
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.conf import settings as django_settings
from django.db import transaction
from django.utils import timezone

from accounts import services as accounts_services
from accounts import websocket
from accounts.models import ApiToken
from config.asgi import application
from jobs import consumers, services
from jobs.consumers import MAX_CLIENT_FRAME
from jobs.models import Job
from tests.platform.builders import metrics, state, usage
from tests.platform.factories import UserFactory
from tests.platform.sockets import ORIGIN, bearer, connect, ingest, make_job, session_cookie, token_header

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("own_channel_layer")]

QUIET = 0.3  # seconds to wait for a message that must not come


# --- helpers ---------------------------------------------------------------------------------------


async def closed_with(path: str, *headers: tuple[bytes, bytes]) -> int | None:
    """The close code a connection gets right away (None: refused at the handshake)."""
    communicator = WebsocketCommunicator(application, path, headers=list(headers))
    connected, code = await communicator.connect()
    if not connected:
        await communicator.disconnect()
        return None if code in (None, 1000) else code
    message = await communicator.receive_output(timeout=2)
    await communicator.disconnect()
    assert message["type"] == "websocket.close", message
    return message["code"]


async def receive(communicator: WebsocketCommunicator, count: int) -> list[dict[str, Any]]:
    return [await communicator.receive_json_from(timeout=3) for _ in range(count)]


def seqs(messages, kind=("metrics", "event")) -> list[int]:
    return [m["seq"] for m in messages if m["type"] in kind]


# --- authentication --------------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_an_unauthenticated_connection_is_closed_with_4401(tenant):
    job = await database_sync_to_async(make_job)(tenant)
    assert await closed_with(f"/ws/jobs/{job.pk}/") == 4401
    assert await closed_with("/ws/cluster/") == 4401
    assert await closed_with(f"/ws/jobs/{job.pk}/", (b"authorization", b"Bearer plx_nonsense")) == 4401
    assert await closed_with(f"/ws/jobs/{job.pk}/", (b"authorization", b"Basic abc")) == 4401


@pytest.mark.asyncio
async def test_another_organizations_job_or_a_missing_one_is_4404(tenant, other_tenant):
    theirs = await database_sync_to_async(make_job)(other_tenant, "secret")
    header = await database_sync_to_async(bearer)(tenant.owner, tenant.organization)
    assert await closed_with(f"/ws/jobs/{theirs.pk}/", header) == 4404
    assert await closed_with(f"/ws/jobs/{theirs.pk + 1000}/", header) == 4404


@pytest.mark.asyncio
async def test_a_revoked_or_expired_token_is_refused(tenant):
    job = await database_sync_to_async(make_job)(tenant)

    def tokens():
        revoked = bearer(tenant.member, tenant.organization)
        ApiToken.objects.filter(user=tenant.member).update(revoked_at=timezone.now())
        expired = bearer(tenant.viewer, tenant.organization, expires_in_days=1)
        ApiToken.objects.filter(user=tenant.viewer).update(expires_at=timezone.now() - timedelta(seconds=1))
        return revoked, expired

    revoked, expired = await database_sync_to_async(tokens)()
    assert await closed_with(f"/ws/jobs/{job.pk}/", revoked) == 4401
    assert await closed_with(f"/ws/jobs/{job.pk}/", expired) == 4401


@pytest.mark.asyncio
async def test_a_viewer_reads_a_job_with_a_token(tenant):
    job = await database_sync_to_async(make_job)(tenant)
    communicator = await connect(f"/ws/jobs/{job.pk}/", await database_sync_to_async(bearer)(tenant.viewer,
                                                                                              tenant.organization))
    snapshot = await communicator.receive_json_from(timeout=3)
    assert snapshot == {"type": "job", "seq": 0, "job": {
        "id": job.pk, "name": "run", "state": "running", "state_reason": "",
        "started_at": snapshot["job"]["started_at"], "finished_at": None, "event_cursor": 0}}  # fmt: skip
    assert await communicator.receive_nothing(QUIET)
    await communicator.disconnect()


def test_the_ticket_endpoint_answers_a_short_lived_ticket(tenant, token_client, api_client, session_client):
    response = token_client(tenant.viewer, tenant.organization).post("/api/v1/ws-ticket/")
    assert response.status_code == 200
    body = response.json()
    assert set(body) == {"ticket", "expires_in"}
    assert body["expires_in"] == 60
    assert websocket.ticket_membership(body["ticket"])[1].organization == tenant.organization
    assert api_client.post("/api/v1/ws-ticket/").status_code == 401
    assert token_client(tenant.viewer, tenant.organization).post("/api/v1/ws-ticket/", {"x": 1}).status_code == 400
    # a user of no organization gets none; platform staff without one get one for the cluster socket
    assert session_client(UserFactory(username="loner")).post("/api/v1/ws-ticket/").status_code == 403
    root = session_client(UserFactory(username="root", is_staff=True)).post("/api/v1/ws-ticket/")
    assert root.status_code == 200
    assert websocket.ticket_membership(root.json()["ticket"])[1] is None


@pytest.mark.asyncio
async def test_a_ticket_opens_a_socket_and_an_expired_or_forged_one_does_not(tenant, other_tenant, monkeypatch):
    job = await database_sync_to_async(make_job)(tenant)
    ticket = await database_sync_to_async(websocket.ticket_issue)(user=tenant.member, organization=tenant.organization)
    communicator = await connect(f"/ws/jobs/{job.pk}/?ticket={ticket}")
    assert (await communicator.receive_json_from(timeout=3))["type"] == "job"
    await communicator.disconnect()

    forged = ticket[:-4] + ("AAAA" if not ticket.endswith("AAAA") else "BBBB")
    assert await closed_with(f"/ws/jobs/{job.pk}/?ticket={forged}") == 4401
    # a ticket of the other organization does not open this one's job
    theirs = await database_sync_to_async(websocket.ticket_issue)(user=other_tenant.owner,
                                                                  organization=other_tenant.organization)
    assert await closed_with(f"/ws/jobs/{job.pk}/?ticket={theirs}") == 4404
    monkeypatch.setattr(websocket, "TICKET_MAX_AGE_S", -1)  # every ticket is now past its age
    assert await closed_with(f"/ws/jobs/{job.pk}/?ticket={ticket}") == 4401


@pytest.mark.asyncio
async def test_a_session_cookie_needs_an_allowed_origin(tenant):
    job = await database_sync_to_async(make_job)(tenant)
    cookie = await database_sync_to_async(session_cookie)(tenant.viewer)
    # a program (no Origin) never gets in by cookie alone
    assert await closed_with(f"/ws/jobs/{job.pk}/", cookie) == 4401
    # another site's page is refused at the handshake
    assert await closed_with(f"/ws/jobs/{job.pk}/", cookie, (b"origin", b"https://evil.example")) is None
    # the platform's own page: the session's organization
    communicator = await connect(f"/ws/jobs/{job.pk}/", cookie, ORIGIN)
    assert (await communicator.receive_json_from(timeout=3))["job"]["id"] == job.pk
    await communicator.disconnect()


# --- credentials that end close their sockets ------------------------------------------------------


async def closes_with(communicator: WebsocketCommunicator, timeout: float = 3) -> int:
    """The close code of an open connection's next close (skipping data messages)."""
    while True:
        message = await communicator.receive_output(timeout=timeout)
        if message["type"] == "websocket.close":
            return message["code"]


@pytest.mark.asyncio
async def test_revoking_a_token_closes_the_sockets_it_opened_and_no_others(tenant):
    job = await database_sync_to_async(make_job)(tenant)
    header, token = await database_sync_to_async(token_header)(tenant.member, tenant.organization)
    other, _ = await database_sync_to_async(token_header)(tenant.member, tenant.organization)
    on_job = await connect(f"/ws/jobs/{job.pk}/", header)
    on_cluster = await connect("/ws/cluster/", header)
    bystander = await connect(f"/ws/jobs/{job.pk}/", other)
    assert (await on_job.receive_json_from(timeout=3))["type"] == "job"
    assert (await bystander.receive_json_from(timeout=3))["type"] == "job"
    await database_sync_to_async(accounts_services.token_revoke)(token=token, actor=tenant.member)
    assert await closes_with(on_job) == 4401
    assert await closes_with(on_cluster) == 4401
    assert await bystander.receive_nothing(QUIET)
    # the other token's socket still receives live points
    await database_sync_to_async(ingest)(job, [metrics(1, 1)])
    assert [(m["type"], m["seq"]) for m in await receive(bystander, 1)] == [("metrics", 1)]
    for communicator in (on_job, on_cluster, bystander):
        await communicator.disconnect()


@pytest.mark.asyncio
async def test_removing_a_member_closes_their_sockets_in_that_organization(tenant, other_tenant):
    job = await database_sync_to_async(make_job)(tenant)

    def setup():
        accounts_services.member_add(organization=other_tenant.organization, actor=None, user=tenant.member,
                                     role="viewer")
        cookie = session_cookie(tenant.member)
        ticket = websocket.ticket_issue(user=tenant.member, organization=tenant.organization)
        elsewhere = websocket.ticket_issue(user=tenant.member, organization=other_tenant.organization)
        return cookie, ticket, elsewhere

    cookie, ticket, elsewhere = await database_sync_to_async(setup)()
    by_session = await connect(f"/ws/jobs/{job.pk}/", cookie, ORIGIN)
    by_ticket = await connect("/ws/cluster/?ticket=" + ticket)
    in_other = await connect("/ws/cluster/?ticket=" + elsewhere)
    assert (await by_session.receive_json_from(timeout=3))["type"] == "job"
    await database_sync_to_async(accounts_services.member_remove)(organization=tenant.organization, actor=None,
                                                                  user=tenant.member)
    assert await closes_with(by_session) == 4401
    assert await closes_with(by_ticket) == 4401
    assert await in_other.receive_nothing(QUIET)  # still a member there
    for communicator in (by_session, by_ticket, in_other):
        await communicator.disconnect()


@pytest.mark.asyncio
async def test_a_token_that_expires_while_connected_closes_its_socket_then(tenant):
    job = await database_sync_to_async(make_job)(tenant)

    def expiring():
        header, token = token_header(tenant.viewer, tenant.organization, expires_in_days=1)
        ApiToken.objects.filter(pk=token.pk).update(expires_at=timezone.now() + timedelta(seconds=1.5))
        return header

    communicator = await connect(f"/ws/jobs/{job.pk}/", await database_sync_to_async(expiring)())
    assert (await communicator.receive_json_from(timeout=3))["type"] == "job"
    assert await communicator.receive_nothing(0.5)  # open until it expires
    assert await closes_with(communicator, timeout=5) == 4401
    await communicator.disconnect()


def test_credentials_are_checked_again_after_the_join(tenant):
    """What a consumer asks once it has joined its groups: a revocation that committed between
    authentication and the join still closes the socket."""
    header, token = token_header(tenant.member, tenant.organization)
    scope = websocket.authenticate_scope({"headers": [header], "query_string": b""})
    assert scope["token"] == token
    assert websocket.credential_groups(scope) == [websocket.token_group(token.pk),
                                                  websocket.member_group(tenant.member.pk, tenant.organization.pk)]
    assert websocket.credentials_valid(scope)
    accounts_services.token_revoke(token=token, actor=None)
    assert not websocket.credentials_valid(scope)
    header, _ = token_header(tenant.member, tenant.organization)
    scope = websocket.authenticate_scope({"headers": [header], "query_string": b""})
    accounts_services.member_remove(organization=tenant.organization, actor=None, user=tenant.member)
    assert not websocket.credentials_valid(scope)


# --- the job socket --------------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_a_client_receives_the_replay_and_then_live_points(tenant):
    job = await database_sync_to_async(make_job)(tenant)
    await database_sync_to_async(ingest)(job, [metrics(1, 1), state(2, "running")])
    communicator = await connect(f"/ws/jobs/{job.pk}/", await database_sync_to_async(bearer)(tenant.member,
                                                                                              tenant.organization))
    snapshot, first, second = await receive(communicator, 3)
    assert snapshot["type"] == "job"
    assert snapshot["seq"] == 2
    assert first == {"type": "metrics", "seq": 1, "step": 1, "data": {"step": 1, "reward_mean": 0.5}}
    assert second == {"type": "event", "seq": 2, "kind": "state", "data": {"state": "running"}, "ts": 1002.0}

    await database_sync_to_async(ingest)(job, [metrics(3, 2), usage(4, 1, 10.0, 12.0), metrics(5, 3),
                                               {"seq": 6, "kind": "log", "ts": 1006.0, "data": {"line": "hi"}}])
    live = await receive(communicator, 4)
    # step 3 ends the profiling: a fresh snapshot follows the points; the usage is not sent here
    assert [(m["type"], m["seq"]) for m in live] == [("metrics", 3), ("metrics", 5), ("event", 6), ("job", 6)]
    assert live[-1]["job"]["state"] == "running"
    assert await communicator.receive_nothing(QUIET)

    await database_sync_to_async(ingest)(job, [state(7, "succeeded")])
    event, snapshot = await receive(communicator, 2)
    assert (event["kind"], event["seq"]) == ("state", 7)
    assert (snapshot["type"], snapshot["seq"], snapshot["job"]["state"]) == ("job", 7, "succeeded")
    assert snapshot["job"]["finished_at"] is not None
    await communicator.disconnect()


@pytest.mark.asyncio
async def test_a_reconnecting_client_gets_every_point_exactly_once(tenant):
    job = await database_sync_to_async(make_job)(tenant)
    header = await database_sync_to_async(bearer)(tenant.member, tenant.organization)
    await database_sync_to_async(ingest)(job, [metrics(s, s) for s in range(1, 6)])
    communicator = await connect(f"/ws/jobs/{job.pk}/", header)
    received = await receive(communicator, 1 + 5)
    await database_sync_to_async(ingest)(job, [metrics(s, s) for s in range(6, 11)])
    received += await receive(communicator, 3)  # the client drops before reading all of these
    await communicator.disconnect()
    await database_sync_to_async(ingest)(job, [metrics(s, s) for s in range(11, 16)])

    last_seq = max(seqs(received))
    assert last_seq == 8
    communicator = await connect(f"/ws/jobs/{job.pk}/?last_seq={last_seq}", header)
    again = await receive(communicator, 1 + 7)
    assert again[0] == {**again[0], "type": "job", "seq": 15}
    await database_sync_to_async(ingest)(job, [metrics(16, 16)])
    again += await receive(communicator, 1)
    assert await communicator.receive_nothing(QUIET)
    await communicator.disconnect()

    every = seqs(received) + seqs(again)
    assert sorted(every) == list(range(1, 17))
    assert len(every) == len(set(every))


@pytest.mark.asyncio
async def test_a_live_point_racing_the_replay_is_not_sent_twice(tenant):
    job = await database_sync_to_async(make_job)(tenant)
    header = await database_sync_to_async(bearer)(tenant.member, tenant.organization)
    await database_sync_to_async(ingest)(job, [metrics(1, 1), metrics(2, 2)])
    communicator = await connect(f"/ws/jobs/{job.pk}/", header)
    messages = await receive(communicator, 3)
    # the live push of a point the replay already sent (as when it commits between the join and
    # the replay's read) is dropped; a new point is not
    from jobs import broadcast

    stored = await database_sync_to_async(lambda: list(Job.objects.get(pk=job.pk).metrics.order_by("seq")))()
    await database_sync_to_async(broadcast.send)(broadcast.job_group(job.pk),
                                                 [broadcast.metrics_message(stored[1])])
    await database_sync_to_async(ingest)(job, [metrics(3, 3)])
    messages += await receive(communicator, 1)
    assert await communicator.receive_nothing(QUIET)
    assert seqs(messages) == [1, 2, 3]
    await communicator.disconnect()


@pytest.mark.asyncio
async def test_a_rolled_back_ingest_sends_nothing(tenant):
    job = await database_sync_to_async(make_job)(tenant)
    communicator = await connect(f"/ws/jobs/{job.pk}/", await database_sync_to_async(bearer)(tenant.member,
                                                                                              tenant.organization))
    await receive(communicator, 1)

    def ingest_then_fail():
        with transaction.atomic():
            ingest(job, [metrics(1, 1), state(2, "failed", reason="boom")])
            raise RuntimeError("the outer transaction fails")

    with pytest.raises(RuntimeError):
        await database_sync_to_async(ingest_then_fail)()
    assert await communicator.receive_nothing(QUIET)
    assert (await database_sync_to_async(Job.objects.get)(pk=job.pk)).event_cursor == 0
    await communicator.disconnect()


@pytest.mark.asyncio
async def test_cancel_pushes_a_job_snapshot_after_commit(tenant, monkeypatch):
    from jobs import tasks

    monkeypatch.setattr(tasks.cancel_job, "delay", lambda *args: None)  # no engine here
    job = await database_sync_to_async(make_job)(tenant)
    communicator = await connect(f"/ws/jobs/{job.pk}/", await database_sync_to_async(bearer)(tenant.member,
                                                                                              tenant.organization))
    await receive(communicator, 1)
    await database_sync_to_async(services.job_cancel)(job=job, actor=tenant.member, reason="enough")
    snapshot = await communicator.receive_json_from(timeout=3)
    assert (snapshot["type"], snapshot["job"]["state"], snapshot["job"]["state_reason"]) == (
        "job", "cancelled", "enough")
    await communicator.disconnect()


def test_an_ingest_succeeds_when_the_channel_layer_is_down(tenant, settings, caplog):
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels_redis.core.RedisChannelLayer",
                                           "CONFIG": {"hosts": ["redis://127.0.0.1:1/0"]}}}
    job = make_job(tenant)
    assert ingest(job, [metrics(1, 1), usage(2, 1, 10.0, 12.0), state(3, "succeeded")]) == 3
    job.refresh_from_db()
    assert (job.event_cursor, job.state) == (3, "succeeded")
    assert job.usage.count() == 1
    assert "live push" in caplog.text


# --- the cluster socket ----------------------------------------------------------------------------


def _usage_now(seq: int, call: int, wpg: str = "rollout-0") -> dict[str, Any]:
    import time

    now = time.time()
    return usage(seq, call, now - 2.0, now - 1.0, wpg=wpg)


@pytest.mark.asyncio
async def test_the_cluster_socket_anonymises_other_organizations_usage(tenant, other_tenant):
    mine = await database_sync_to_async(make_job)(tenant, "mine")
    theirs = await database_sync_to_async(make_job)(other_tenant, "secret-project")
    await database_sync_to_async(ingest)(theirs, [_usage_now(1, 1)])  # before the connection: replayed
    member = await connect("/ws/cluster/", await database_sync_to_async(bearer)(tenant.viewer, tenant.organization))

    def make_staff():
        tenant.admin.is_staff = True
        tenant.admin.save()
        return bearer(tenant.admin, tenant.organization)

    staff = await connect("/ws/cluster/", await database_sync_to_async(make_staff)())
    await database_sync_to_async(ingest)(mine, [_usage_now(1, 2)])
    await database_sync_to_async(ingest)(theirs, [_usage_now(2, 3, wpg="train-0")])

    seen = await receive(member, 3)
    assert [m["type"] for m in seen] == ["usage"] * 3
    assert seen == sorted(seen, key=lambda m: m["seq"])
    replayed, own, other = (m["interval"] for m in seen)
    assert set(own) == {"wpg", "job", "name", "organization", "own", "fn", "role", "devices", "start", "end"}
    assert (own["job"], own["name"], own["organization"], own["own"]) == (mine.pk, "mine", "Acme", True)
    for interval in (replayed, other):
        assert (interval["job"], interval["name"], interval["organization"], interval["own"]) == (
            None, None, None, False)
    assert other["wpg"] == "train-0"

    full = await receive(staff, 3)
    assert [(m["interval"]["name"], m["interval"]["organization"]) for m in full] == [
        ("secret-project", "Globex"), ("mine", "Acme"), ("secret-project", "Globex")]
    assert [m["seq"] for m in full] == [m["seq"] for m in seen]
    for communicator in (member, staff):
        assert await communicator.receive_nothing(QUIET)
        await communicator.disconnect()

    # a reconnect with last_seq replays only what came after
    again = await connect(f"/ws/cluster/?last_seq={seen[1]['seq']}",
                          await database_sync_to_async(bearer)(tenant.viewer, tenant.organization))
    assert [m["seq"] for m in await receive(again, 1)] == [seen[2]["seq"]]
    assert await again.receive_nothing(QUIET)
    await again.disconnect()


@pytest.mark.asyncio
async def test_the_cluster_socket_is_for_members_and_staff(tenant):
    loner = await database_sync_to_async(UserFactory)(username="loner")
    cookie = await database_sync_to_async(session_cookie)(loner)
    assert await closed_with("/ws/cluster/", cookie, ORIGIN) == 4403
    assert await closed_with("/ws/cluster/?last_seq=x",
                             await database_sync_to_async(bearer)(tenant.viewer, tenant.organization)) == 4400


# --- hostile clients (found by test_ws_isolation_fuzz) ---------------------------------------------


async def _open_job_socket(tenant) -> tuple[Job, WebsocketCommunicator]:
    job = await database_sync_to_async(make_job)(tenant)
    communicator = await connect(f"/ws/jobs/{job.pk}/", await database_sync_to_async(bearer)(tenant.member,
                                                                                              tenant.organization))
    assert (await communicator.receive_json_from(timeout=3))["type"] == "job"
    return job, communicator


@pytest.mark.asyncio
async def test_a_path_of_no_route_is_closed_with_4404(tenant):
    """The router raised on these (an error in the server's log and a failed handshake)."""
    job = await database_sync_to_async(make_job)(tenant)
    header = await database_sync_to_async(bearer)(tenant.member, tenant.organization)
    for path in ("/ws/nothing/", "/ws/jobs/abc/", f"/ws/jobs/{job.pk}", f"/ws/jobs/{job.pk}/../../cluster/", "/"):
        assert await closed_with(path, header) == 4404, path
        assert await closed_with(path) == 4404, path


@pytest.mark.asyncio
@pytest.mark.parametrize("frame", [
    {"bytes": b"\x00\x01"}, {"bytes": b""}, {"text": ""}, {"text": "not json"}, {"text": '{"type": "subscribe"'},
    {"text": "[" * 2000 + "]" * 2000},  # JSON nested deeper than the parser goes
], ids=["binary", "empty binary", "empty text", "not JSON", "truncated JSON", "nested too deep"])
async def test_a_frame_that_is_not_json_text_closes_the_socket_with_4400(tenant, frame):
    """The JSON consumer raised on each of these: the consumer crashed instead of closing."""
    _, communicator = await _open_job_socket(tenant)
    await communicator.send_input({"type": "websocket.receive", **frame})
    assert await closes_with(communicator) == 4400
    await communicator.disconnect()


@pytest.mark.asyncio
async def test_a_frame_longer_than_the_bound_closes_the_socket_with_4413_unparsed(tenant, monkeypatch):
    _, communicator = await _open_job_socket(tenant)
    monkeypatch.setattr(consumers, "json", SimpleNamespace(loads=pytest.fail))  # not parsed
    await communicator.send_input({"type": "websocket.receive", "text": "[" + "1," * MAX_CLIENT_FRAME + "1]"})
    assert await closes_with(communicator) == 4413
    await communicator.disconnect()
    _, communicator = await _open_job_socket(tenant)
    await communicator.send_input({"type": "websocket.receive", "bytes": b"\x00" * (MAX_CLIENT_FRAME + 1)})
    assert await closes_with(communicator) == 4413
    await communicator.disconnect()


@pytest.mark.asyncio
async def test_a_json_frame_is_ignored_and_the_socket_keeps_serving(tenant, other_tenant):
    job, communicator = await _open_job_socket(tenant)
    theirs = await database_sync_to_async(make_job)(other_tenant, "secret")
    for content in ({"type": "subscribe", "job": theirs.pk}, {"type": "credentials.ended"}, [1, "x"], None):
        await communicator.send_json_to(content)
    assert await communicator.receive_nothing(QUIET)
    await database_sync_to_async(ingest)(job, [metrics(1, 1)])
    assert [(m["type"], m["seq"]) for m in await receive(communicator, 1)] == [("metrics", 1)]
    await communicator.disconnect()


@pytest.mark.asyncio
async def test_nothing_is_sent_after_a_close(tenant):
    """The consumer stays in its job's group until the client's disconnect arrives: live points in
    between were sent after the close frame, and a second bad frame sent a second close."""
    job, communicator = await _open_job_socket(tenant)
    await communicator.send_input({"type": "websocket.receive", "text": "not json"})
    assert await communicator.receive_output(timeout=3) == {"type": "websocket.close", "code": 4400}
    await database_sync_to_async(ingest)(job, [metrics(1, 1)])
    await communicator.send_input({"type": "websocket.receive", "bytes": b"x"})
    assert await communicator.receive_nothing(QUIET)
    await communicator.disconnect()


@pytest.mark.asyncio
async def test_an_origin_that_is_no_url_is_refused_at_the_handshake(tenant):
    """channels' origin check raised on these (``urlparse``: invalid IPv6 URL)."""
    job = await database_sync_to_async(make_job)(tenant)
    header = await database_sync_to_async(bearer)(tenant.member, tenant.organization)
    for origin in (b"http://[", b"//[::1", b"http://]"):
        assert await closed_with(f"/ws/jobs/{job.pk}/", header, (b"origin", origin)) is None, origin


@pytest.mark.asyncio
async def test_a_session_cookie_of_no_session_key_is_unauthenticated(tenant):
    """A NUL byte in the session id made PostgreSQL raise in the session lookup."""
    job = await database_sync_to_async(make_job)(tenant)
    for key in (b"abcdefgh\x00ijklmnop", b"\x00" * 32, b"ABCDEFGHIJKLMNOPQRSTUVWXYZ012345", b"\xff" * 32):
        cookie = (b"cookie", django_settings.SESSION_COOKIE_NAME.encode() + b"=" + key)
        assert await closed_with(f"/ws/jobs/{job.pk}/", cookie, ORIGIN) == 4401, key
