"""The live dashboard's websockets (routes in ``config.routing``, connections authenticated by
``accounts.websocket``): one job's curves and events, and the cluster's device timeline.

Both follow the same protocol (message shapes in ``jobs.broadcast``):

1. Check on connect: unauthenticated connections are accepted and closed with 4401 (the reason
   stays in the server's scope; a browser can read the code and fetch a ticket), another
   organization's or a missing job with 4404, a user of no organization on the cluster with 4403,
   a malformed ``?last_seq=`` with 4400.
2. Join the group first, then read the database: whatever commits after the join arrives through
   the group, whatever committed before is in the read, so nothing falls between the two.
3. Replay from the database everything after ``?last_seq=`` (default 0), in seq order.
4. Forward the group's live messages, dropping points whose seq the replay already sent; each point
   then arrives exactly once on a connection. Only the replay's duplicates are dropped, not every
   seq below the highest sent: two processes' commits may reach the group out of order, and a late
   point is still new to the client.
5. Clients only listen. A client's JSON text frame is ignored (a keepalive, or a newer client's
   message, does no harm); any other frame is a broken client and closes the socket: 4413 when it
   is longer than ``MAX_CLIENT_FRAME`` (checked before it is parsed), 4400 when it is binary, empty
   or not JSON.

A client that reconnects passes the highest seq it received as ``?last_seq=`` and gets the rest.

A socket is closed once, and nothing is sent or read after its close: live pushes and frames that
arrive before the client's disconnect are dropped. A path of no route is closed with 4404, like a
missing job (``NoRouteConsumer``).

A connection whose credentials end is closed with 4401 at once: its token revoked or expired, its
user removed from the organization (``accounts.websocket``: the consumer joins the connection's
credential groups before it accepts, checks the credentials once more after the join, and sets a
timer for the token's expiry).
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any
from urllib.parse import parse_qs

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from django.http import Http404

from accounts import websocket
from jobs import broadcast, cluster, selectors
from jobs.models import Job

CLOSE_BAD_REQUEST = 4400
CLOSE_UNAUTHENTICATED = 4401
CLOSE_FORBIDDEN = 4403
CLOSE_NOT_FOUND = 4404
CLOSE_TOO_LARGE = 4413

# The longest frame a client may send (characters of a text frame, bytes of a binary one). Clients
# have nothing to say (step 5), so this is only a bound on what a broken or hostile one makes the
# server parse; the ASGI server's own, larger limit (daphne: 1 MiB) applies first.
MAX_CLIENT_FRAME = 4096

REPLAY_PAGE = 1000  # job rows read per query during a replay
# The cluster replay on connect: the calls that ended in the last CLUSTER_REPLAY_WINDOW_S, at
# most the newest CLUSTER_REPLAY_MAX (the timeline's history beyond that: GET cluster/?window=).
CLUSTER_REPLAY_WINDOW_S = 600
CLUSTER_REPLAY_MAX = 5000


class _ListeningConsumer(AsyncJsonWebsocketConsumer):
    """A socket the server talks on and the client only listens to (step 5), closed once."""

    closed = False

    async def refuse(self, code: int) -> None:
        await self.accept()
        await self.close(code=code)

    async def close(self, code: int | None = None, reason: str | None = None) -> None:
        """Close once: a revocation racing the expiry timer, or a bad frame after a refusal, does not
        send a second close."""
        if not self.closed:
            self.closed = True
            await super().close(code=code, reason=reason)

    async def send_json(self, content: Any, close: bool = False) -> None:
        """Nothing after the close: the consumer stays in its groups until the client's disconnect
        arrives, and a live push in between would follow the close frame."""
        if not self.closed:
            await super().send_json(content, close=close)

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None, **kwargs) -> None:
        """A client's frame: ignored when it is JSON text, else the socket closes (step 5). Replaces
        the JSON consumer's decoding, which raises on anything but JSON text."""
        if self.closed:
            return
        frame = text_data if text_data is not None else bytes_data or b""
        if len(frame) > MAX_CLIENT_FRAME:
            return await self.close(code=CLOSE_TOO_LARGE)
        if not isinstance(frame, str):
            return await self.close(code=CLOSE_BAD_REQUEST)
        try:
            json.loads(frame)
        except (ValueError, RecursionError):  # RecursionError: nested deeper than the parser goes
            return await self.close(code=CLOSE_BAD_REQUEST)


class NoRouteConsumer(_ListeningConsumer):
    """Any path of no websocket route (``config.routing``'s last): accepted and closed with 4404,
    like a missing job, where the router would raise (an error in the server's log, and a failed
    handshake) for every mistyped or probing URL."""

    channel_layer_alias = None  # an unconfigured alias: no channel, as it joins no group

    async def connect(self) -> None:
        await self.refuse(CLOSE_NOT_FOUND)


class _ReplayingConsumer(_ListeningConsumer):
    """Connect-time checks and the replay/live handover shared by the two sockets."""

    group: str | None = None
    replayed_through = 0  # the highest point seq the replay sent (or the client already had)
    credential_groups: tuple[str, ...] = ()
    expiry: asyncio.Task | None = None  # closes the socket when its token expires

    def last_seq(self) -> int | None:
        """``?last_seq=N`` (N >= 0; default 0), or None when malformed."""
        values = parse_qs(self.scope.get("query_string", b"").decode("latin1")).get("last_seq")
        if not values:
            return 0
        try:
            value = int(values[-1])
        except ValueError:
            return None
        return value if 0 <= value < 2**63 else None

    async def join(self, group: str) -> bool:
        """Join ``group`` and the connection's credential groups, then accept; False (the socket
        closed with 4401) when the credentials ended before the join."""
        self.group = group
        self.credential_groups = tuple(websocket.credential_groups(self.scope))
        for name in (group, *self.credential_groups):
            await self.channel_layer.group_add(name, self.channel_name)
        await self.accept()
        if not await database_sync_to_async(websocket.credentials_valid)(self.scope):
            await self.close(code=CLOSE_UNAUTHENTICATED)
            return False
        left = websocket.seconds_left(self.scope)
        if left is not None:
            self.expiry = asyncio.create_task(self._close_after(left))
        return True

    async def _close_after(self, seconds: float) -> None:
        await asyncio.sleep(seconds)
        await self.close(code=CLOSE_UNAUTHENTICATED)

    async def credentials_ended(self, event: dict[str, Any]) -> None:
        """A group message of ``accounts.websocket.close_sockets_on_commit``."""
        await self.close(code=CLOSE_UNAUTHENTICATED)

    async def disconnect(self, code: int) -> None:
        if self.expiry is not None:
            self.expiry.cancel()
        for name in (self.group, *self.credential_groups):
            if name is not None:
                await self.channel_layer.group_discard(name, self.channel_name)


class JobConsumer(_ReplayingConsumer):
    """``/ws/jobs/<id>/?last_seq=N``: one job of the connection's organization (any role).

    Sends a ``job`` snapshot, then the job's ``metrics`` and ``event`` messages after ``last_seq``
    from the database, then the live ones. Live ``job`` snapshots are forwarded unless older than
    the last one sent (a snapshot replaces the previous one; a platform action such as cancel sends
    one without moving the cursor)."""

    job_seq = -1  # the cursor of the last job snapshot sent

    async def connect(self) -> None:
        if not self.scope["user"].is_authenticated:
            return await self.refuse(CLOSE_UNAUTHENTICATED)
        after = self.last_seq()
        if after is None:
            return await self.refuse(CLOSE_BAD_REQUEST)
        job_id = self.scope["url_route"]["kwargs"]["job_id"]
        job = await self._job(job_id)
        if job is None:
            return await self.refuse(CLOSE_NOT_FOUND)
        if not await self.join(broadcast.job_group(job.pk)):
            return
        job = await self._job(job_id)  # the snapshot: read after joining, before the rows
        if job is None:  # deleted in between
            return await self.close(code=CLOSE_NOT_FOUND)
        await self._send_snapshot(broadcast.job_message(job))
        self.replayed_through = max(after, job.event_cursor)
        while True:
            messages, more = await database_sync_to_async(replay_page)(job=job, after_seq=after, limit=REPLAY_PAGE)
            for message in messages:
                await self.send_json(message)
            if messages:
                after = messages[-1]["seq"]
                self.replayed_through = max(self.replayed_through, after)
            if not more:
                break

    @database_sync_to_async
    def _job(self, job_id: int) -> Job | None:
        organization = self.scope.get("organization")
        if organization is None:
            return None
        try:
            return selectors.job_get(organization=organization, pk=job_id)
        except Http404:
            return None

    async def _send_snapshot(self, message: dict[str, Any]) -> None:
        self.job_seq = message["seq"]
        await self.send_json(message)

    async def push(self, event: dict[str, Any]) -> None:
        """A group message of ``jobs.broadcast.send``: live messages of this job."""
        for message in event["messages"]:
            if message["type"] == "job":
                if message["seq"] >= self.job_seq:
                    await self._send_snapshot(message)
            elif message["seq"] > self.replayed_through:
                await self.send_json(message)


def replay_page(*, job: Job, after_seq: int, limit: int) -> tuple[list[dict[str, Any]], bool]:
    """The job's metrics and other events after ``after_seq`` as socket messages, in seq order, at
    most about ``limit`` of them, and whether more may follow."""
    metrics = list(selectors.metrics_of(job=job, after_seq=after_seq).order_by("seq")[:limit])
    events = list(selectors.events_of(job=job, after_seq=after_seq)[:limit])
    # a full page of one kind ends where the other's rows may not have been read yet
    bound = min((rows[-1].seq for rows in (metrics, events) if len(rows) == limit), default=None)
    messages = sorted([*map(broadcast.metrics_message, metrics), *map(broadcast.event_message, events)],
                      key=lambda message: message["seq"])
    if bound is not None:
        messages = [message for message in messages if message["seq"] <= bound]
    return messages, bound is not None


class ClusterConsumer(_ReplayingConsumer):
    """``/ws/cluster/?last_seq=N``: every organization's calls on the cluster's WPGs as ``usage``
    messages (``seq``: the usage entry's id), for any member of an organization and platform staff.

    On connect, replays the entries above ``last_seq`` that ended in the last
    ``CLUSTER_REPLAY_WINDOW_S`` seconds (at most the newest ``CLUSTER_REPLAY_MAX``), by id; then live.
    Group messages carry whose each call is; this consumer anonymises them for its viewer
    (``jobs.cluster.interval_for``), like ``GET cluster/``.

    Entry ids are allotted at insert, so two ingests committing out of order can make a reconnect
    with ``last_seq`` skip an entry; the timeline is a view, the ledger (billing) is exact.
    """

    async def connect(self) -> None:
        user = self.scope["user"]
        if not user.is_authenticated:
            return await self.refuse(CLOSE_UNAUTHENTICATED)
        if self.scope.get("organization") is None and not user.is_staff:
            return await self.refuse(CLOSE_FORBIDDEN)
        after = self.last_seq()
        if after is None:
            return await self.refuse(CLOSE_BAD_REQUEST)
        if not await self.join(broadcast.CLUSTER_GROUP):
            return
        entries = await database_sync_to_async(cluster.recent_usage)(
            since=time.time() - CLUSTER_REPLAY_WINDOW_S, after_seq=after, limit=CLUSTER_REPLAY_MAX)
        self.replayed_through = max([after, *(entry.pk for entry in entries)])
        for entry in entries:
            await self._send_usage(broadcast.usage_message(entry))

    async def _send_usage(self, message: dict[str, Any]) -> None:
        interval = cluster.interval_for(message["interval"], user=self.scope["user"],
                                        organization=self.scope.get("organization"))
        await self.send_json({**message, "interval": interval})

    async def push(self, event: dict[str, Any]) -> None:
        """A group message of ``jobs.broadcast.send``: live usage entries."""
        for message in event["messages"]:
            if message["seq"] > self.replayed_through:
                await self._send_usage(message)
