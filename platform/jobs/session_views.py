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

import json
from typing import Any

from django.http import Http404, HttpRequest, HttpResponse
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import exceptions, serializers, status
from rest_framework.renderers import JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response

from accounts.api import (
    OrgGenericAPIView,
    PayloadTooLarge,
    StrictFieldsMixin,
    exception_handler,
    role_map,
    token_membership,
)
from accounts.authentication import BearerTokenAuthentication
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


def _refusal(seq: int, exc: Exception) -> exceptions.APIException | None:
    """The API error that the engine's refusal ``exc`` of call ``seq`` answers: 400, 409, 413 or
    503 (None: ``exc`` is no refusal). The engine's errors come through Ray: their fields, not
    their text."""
    if isinstance(exc, SessionPending):  # nothing was sent: the same call again, later
        return ServiceUnavailable("the session is not placed yet: send the same call again")
    if isinstance(exc, TooLarge):
        return PayloadTooLarge({"detail": exc.message, "field": exc.field, "limit": exc.limit})
    if isinstance(exc, SpecError):
        return exceptions.ValidationError({exc.field: [exc.message]})
    if isinstance(exc, SessionClosed):
        return Conflict(f"the session is closed: {exc.why}")
    if isinstance(exc, LookupError):  # an answer the engine no longer keeps
        return Conflict(f"call {seq}'s answer is no longer kept")
    return None


def _json(data: Any, status_code: int = status.HTTP_200_OK) -> HttpResponse:
    return HttpResponse(JSONRenderer().render(data), content_type="application/json", status=status_code)


def _answer(seq: int, ask) -> HttpResponse:
    """The response ``ask()`` (the engine's answer of call ``seq``) makes: 200 with its result
    and ``engine_ms``, 202 while it runs, the engine's refusals (``_refusal``); any other error as
    the API's handler answers it (500, logged)."""
    try:
        answer = ask()
    except TimeoutError:
        return _json({"seq": seq, "state": "running"}, status.HTTP_202_ACCEPTED)
    except Exception as exc:
        answered = exception_handler(_refusal(seq, exc) or exc, {})
        return _json(answered.data, answered.status_code)
    return _json({"seq": seq, "state": "done", "result": answer["result"], "engine_ms": answer["engine_ms"]})


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


def closed_or_not_a_session(job: Job) -> exceptions.APIException | None:
    """Why calls to ``job`` are refused (404: it is no session; 409: it has ended), or None."""
    if job.spec.get("algorithm") != SESSION:
        return exceptions.NotFound(f"job {job.pk} is not a session")
    if job.state in TERMINAL_STATES:
        return Conflict(f"session {job.pk} is closed: {job.state_reason or job.state}")
    return None


class SessionView(JobView):
    """A session of the organization (404 for another's, and for a job that is not a session);
    calls are actions: members make them on their own sessions, admins and owners on anyone's."""

    def get_object(self) -> Job:
        return selectors.job_row(organization=self.request.organization, pk=self.kwargs["session_id"])

    def session(self) -> Job:
        job = self.get_acted_on()
        refusal = closed_or_not_a_session(job)
        if refusal is not None:
            raise refusal
        return job


class SessionCallsView(SessionView):
    """``POST sessions/{id}/calls/``: send a call and wait for its answer (module docstring)."""

    required_roles = role_map(POST=Role.MEMBER)
    serializer_class = SessionCallSerializer

    @extend_schema(summary="Call a session's function API", request=SessionCallSerializer,
                   responses={200: SessionAnswerSerializer, 202: SessionAnswerSerializer, 409: CONFLICT_CLOSED})
    def post(self, request: Request, session_id: int) -> HttpResponse:
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
    def get(self, request: Request, session_id: int, seq: int) -> HttpResponse:
        job = self.session()
        query = SessionWaitSerializer(data=request.query_params)
        query.is_valid(raise_exception=True)
        return _answer(seq, lambda: engine().session_result(job.engine_id, seq, query.validated_data["wait"]))



# --- the same two calls, without the framework around them ---------------------------------------
#
# A loop's calls are many and small: most of what one cost the web server beyond the engine's
# part was DRF around it (its request, authentication, permission and rendering layers) and the
# ORM compiling the session's read. So the URLs of the two views above lead to plain Django views
# (``session_calls``, ``session_call_answer``) that answer the common request themselves: a bearer
# token of a member who may call this open session, with well-formed input. They make the DRF
# views' own checks (the token's authentication, membership and role, ``selectors.job_row``,
# ``may_act_on``, ``closed_or_not_a_session``) and input serializers and answer with the same
# ``_answer``. Any other request (a browser's session, a refused one, bad input) goes to the DRF
# view, which answers it as it always has, with its reason. The schema and the role table read
# the DRF views (``callback.cls``).


def _admitted(request: HttpRequest, view: type[SessionView], session_id: int) -> str | None:
    """The session's engine id where the DRF ``view`` would take this request to the engine,
    else None."""
    parts = request.headers.get("Authorization", "").split()
    if len(parts) != 2 or parts[0].lower() != BearerTokenAuthentication.keyword.lower() or not parts[1].isascii():
        return None
    try:
        user, token = BearerTokenAuthentication().authenticate_token(parts[1])
        membership = token_membership(user=user, token=token)
        job = selectors.job_row(organization=membership.organization, pk=session_id)
    except (exceptions.AuthenticationFailed, Http404):
        return None
    if (not membership.has_role(view.required_roles[request.method])
            or not selectors.may_act_on(membership=membership, job=job)
            or closed_or_not_a_session(job) is not None):
        return None
    return job.engine_id


def _valid(serializer: type[serializers.Serializer], data: Any) -> dict[str, Any] | None:
    body = serializer(data=data)
    return body.validated_data if body.is_valid() else None


def _call_of(request: HttpRequest) -> dict[str, Any] | None:
    """A POST's call, where its body is JSON that ``SessionCallSerializer`` accepts."""
    if request.method != "POST" or request.content_type != "application/json":
        return None
    try:
        data = json.loads(request.body)
    except ValueError:
        return None
    return _valid(SessionCallSerializer, data)


def _documented_as(view: type[SessionView]):
    """Mark a plain view as serving ``view``'s URL, with the attributes DRF's ``as_view`` gives
    its views (``cls``, ``view_class``): the schema, the role table and the tenancy check read
    ``view``; CSRF is ``view``'s affair. ``reference`` is ``view`` itself, for the requests it answers."""

    def mark(serve):
        serve.cls = serve.view_class = view
        serve.initkwargs, serve.view_initkwargs = {}, {}
        serve.csrf_exempt, serve.reference = True, view.as_view()
        return serve

    return mark


@_documented_as(SessionCallsView)
def session_calls(request: HttpRequest, session_id: int) -> HttpResponse:
    """``POST sessions/{id}/calls/`` (``SessionCallsView``)."""
    call = _call_of(request)
    session = call and _admitted(request, SessionCallsView, session_id)
    if not session:
        return session_calls.reference(request, session_id=session_id)
    return _answer(call["seq"], lambda: engine().session_submit(
        session, call["seq"], call["fn"], call["args"], wait_s=QUEUED_WAIT_S).answer(call["wait"]))


@_documented_as(SessionCallAnswerView)
def session_call_answer(request: HttpRequest, session_id: int, seq: int) -> HttpResponse:
    """``GET sessions/{id}/calls/{seq}/`` (``SessionCallAnswerView``)."""
    query = _valid(SessionWaitSerializer, request.GET) if request.method == "GET" else None
    session = query is not None and _admitted(request, SessionCallAnswerView, session_id)
    if not session:
        return session_call_answer.reference(request, session_id=session_id, seq=seq)
    return _answer(seq, lambda: engine().session_result(session, seq, query["wait"]))
