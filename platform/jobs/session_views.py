"""Sessions over REST (``/api/v1/sessions/...``): a tenant's own training loop, on their machine,
calling the function API of a job of theirs (``JobSpec(algorithm="session")``).

- ``POST sessions/`` opens one: a job like any other (quota, slots, billing, dashboard, pause,
  cancel, audit), created by ``services.job_create``; its calls wait until the engine has placed it.
- ``POST sessions/{id}/calls/`` sends call number ``seq`` (from 1, each once: the engine runs a
  session's calls in their numbers' order, so a client may send several at once) with its
  ``fn`` and JSON ``args``, and waits up to ``wait`` seconds for the answer: 200 with ``result``,
  or 202 while it runs (then ``GET sessions/{id}/calls/{seq}/?wait=`` long-polls it).
- Bad arguments answer 400 naming the field, rows or tokens over the engine's limits 413 with the
  limit, a session that has ended (closed by ``fn: "close"``, idle too long, cancelled) 409, and
  another organization's session 404, a session the engine has not placed yet 503 (send the same
  call again). Nothing of a refused call runs.

These are the one place a web request waits on the engine (``jobs.engine``): a call's answer is
what the request is for. A waiting request holds a worker thread of the web server for at most
``MAX_WAIT_S``.
"""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import exceptions, serializers, status
from rest_framework.request import Request
from rest_framework.response import Response

from accounts.api import OrgGenericAPIView, PayloadTooLarge, StrictFieldsMixin, role_map
from accounts.models import Priority, Role
from engine.control import SESSION_CALLS
from engine.errors import SessionClosed, SessionPending, SpecError, TooLarge
from engine.spec import SESSION
from jobs import selectors, services
from jobs.engine import engine
from jobs.models import TERMINAL_STATES, Job
from jobs.serializers import ConflictSerializer, JobDetailSerializer
from jobs.views import Conflict, JobView, _detail

MAX_WAIT_S = 60.0  # the longest a request waits for a call's answer
QUEUED_WAIT_S = 5.0  # how long a call waits for a session the engine has not placed yet (then 503)
CONFLICT_CLOSED = OpenApiResponse(ConflictSerializer, description="The session has ended.")
OVER_QUOTA = OpenApiResponse(ConflictSerializer, description="Over quota.")


class SessionOpenSerializer(StrictFieldsMixin, serializers.Serializer):
    """``POST sessions/``: the model and backends of a new session."""

    name = serializers.CharField(max_length=200, required=False, allow_blank=True, default="")
    model = serializers.CharField(max_length=500, help_text="A preset's name or a registered model's.")
    rollout = serializers.CharField(max_length=40, required=False, help_text="The rollout backend (torch, vllm).")
    trainer = serializers.CharField(max_length=40, required=False, help_text="The training backend (torch, megatron).")
    tp = serializers.IntegerField(min_value=1, required=False, help_text="Tensor-parallel ranks of the trainer.")
    priority = serializers.ChoiceField(choices=Priority.choices, default=Priority.NORMAL)


class SessionCallSerializer(StrictFieldsMixin, serializers.Serializer):
    """``POST sessions/{id}/calls/``: one call of the function API."""

    seq = serializers.IntegerField(min_value=1, help_text="The call's number: from 1, each once, in the loop's order.")
    fn = serializers.ChoiceField(choices=SESSION_CALLS)
    args = serializers.DictField(required=False, default=dict, help_text="The call's arguments (see the SDK).")
    wait = serializers.FloatField(min_value=0, max_value=MAX_WAIT_S, default=20.0,
                                  help_text="Seconds to wait for the answer before answering 202.")


class SessionWaitSerializer(serializers.Serializer):
    wait = serializers.FloatField(min_value=0, max_value=MAX_WAIT_S, default=20.0, required=False)


class SessionAnswerSerializer(serializers.Serializer):
    seq = serializers.IntegerField()
    state = serializers.CharField(help_text='"done", or "running" (ask again: GET sessions/{id}/calls/{seq}/).')
    result = serializers.DictField(required=False, help_text="The call's result (when done).")
    engine_ms = serializers.FloatField(required=False, help_text="Milliseconds the call took in the engine, from "
                                       "its turn to its result (when done); the rest of its time was the way there "
                                       "and back.")


def _answer(seq: int, ask) -> Response:
    """Run ``ask()`` (the engine's answer of call ``seq``) into a response: 200 with its result,
    202 while it runs, the engine's refusals as 400, 409 and 413."""
    try:
        answer = ask()
    except SessionPending:  # nothing was sent: the same call again, later
        raise ServiceUnavailable("the session is not placed yet: send the same call again") from None
    except TimeoutError:
        return Response({"seq": seq, "state": "running"}, status=status.HTTP_202_ACCEPTED)
    except TooLarge as exc:
        raise PayloadTooLarge({"detail": exc.message, "field": exc.field, "limit": exc.limit}) from None
    except SpecError as exc:
        raise exceptions.ValidationError({exc.field: [exc.message]}) from None
    except SessionClosed as exc:  # (the engine's errors come through Ray: their fields, not their text)
        raise Conflict(f"the session is closed: {exc.why}") from None
    except LookupError:  # an answer the engine no longer keeps
        raise Conflict(f"call {seq}'s answer is no longer kept") from None
    return Response({"seq": seq, "state": "done", "result": answer["result"], "engine_ms": answer["engine_ms"]})


class ServiceUnavailable(exceptions.APIException):
    status_code = status.HTTP_503_SERVICE_UNAVAILABLE
    default_code = "session_pending"


class SessionOpenView(OrgGenericAPIView):
    """``POST sessions/``: open a session (members): a job of kind session, queued and launched
    as any job is; the answer is the job, its ``id`` the session's."""

    required_roles = role_map(POST=Role.MEMBER)
    serializer_class = SessionOpenSerializer

    @extend_schema(summary="Open a session", request=SessionOpenSerializer,
                   responses={201: JobDetailSerializer, 409: OVER_QUOTA})
    def post(self, request: Request) -> Response:
        body = SessionOpenSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        values = dict(body.validated_data)
        name, priority = values.pop("name"), values.pop("priority")
        try:
            job = services.job_create(organization=request.organization, user=request.user, name=name,
                                      priority=priority, spec={"algorithm": SESSION, **values})
        except services.QuotaExceeded as exc:
            raise Conflict(exc.message, limit=exc.limit) from None
        return _detail(request, job, status.HTTP_201_CREATED)


class SessionView(JobView):
    """A session of the organization (404 for another's, and for a job that is not a session);
    calls are actions: members make them on their own sessions, admins and owners on anyone's."""

    def get_object(self) -> Job:
        return selectors.job_row(organization=self.request.organization, pk=self.kwargs["session_id"])

    def session(self) -> Job:
        job = self.get_acted_on()
        if job.spec.get("algorithm") != SESSION:
            raise exceptions.NotFound(f"job {job.pk} is not a session")
        if job.state in TERMINAL_STATES:
            raise Conflict(f"session {job.pk} is closed: {job.state_reason or job.state}")
        return job


class SessionCallsView(SessionView):
    """``POST sessions/{id}/calls/``: send a call and wait for its answer (module docstring)."""

    required_roles = role_map(POST=Role.MEMBER)
    serializer_class = SessionCallSerializer

    @extend_schema(summary="Call a session's function API", request=SessionCallSerializer,
                   responses={200: SessionAnswerSerializer, 202: SessionAnswerSerializer, 409: CONFLICT_CLOSED})
    def post(self, request: Request, session_id: int) -> Response:
        job = self.session()
        body = SessionCallSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        call: dict[str, Any] = body.validated_data
        wait = call["wait"]
        return _answer(call["seq"], lambda: engine().session_submit(
            job.engine_id, call["seq"], call["fn"], call["args"], wait_s=QUEUED_WAIT_S).answer(wait))


class SessionCallAnswerView(SessionView):
    """``GET sessions/{id}/calls/{seq}/?wait=``: the answer of a call sent before, once it is there."""

    required_roles = role_map(GET=Role.MEMBER)
    serializer_class = SessionAnswerSerializer

    @extend_schema(summary="Wait for a session call's answer", parameters=[SessionWaitSerializer],
                   responses={200: SessionAnswerSerializer, 202: SessionAnswerSerializer, 409: CONFLICT_CLOSED})
    def get(self, request: Request, session_id: int, seq: int) -> Response:
        job = self.session()
        query = SessionWaitSerializer(data=request.query_params)
        query.is_valid(raise_exception=True)
        return _answer(seq, lambda: engine().session_result(job.engine_id, seq, query.validated_data["wait"]))

