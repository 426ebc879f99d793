"""The building blocks of every app's REST API (accounts, jobs, billing): the tenant, resolved once
per request, role checks, strict serializers and the exception handler (the pagination is in
``accounts.pagination``).

A view of any app derives from ``OrgAPIView`` (or ``OrgGenericAPIView`` / ``OrgGenericViewSet``)
and reads the tenant from the request::

    class JobList(OrgGenericAPIView):
        required_roles = role_map(GET=Role.VIEWER, POST=Role.MEMBER)

        def get(self, request):
            jobs = selectors.jobs_of(organization=request.organization)
            ...

        def post(self, request):
            serializer = JobCreateSerializer(data=request.data)  # a StrictFieldsMixin serializer
            serializer.is_valid(raise_exception=True)
            job = services.job_create(organization=request.organization, user=request.user, ...)
            ...

Objects are fetched through a selector that starts from ``request.organization`` and
``get_object_or_404``, so another organization's object answers 404, never 403. Object-dependent
rules (a member cancels their own jobs, an admin anyone's) call ``require_role`` in the handler.
``tests/platform/test_api_schema.py`` checks that every view under ``/api/v1/`` uses this mixin.
"""

import copy
import logging
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from django.conf import settings
from django.contrib.sessions.backends.base import SessionBase
from django.core.exceptions import RequestDataTooBig
from django.core.exceptions import ValidationError as DjangoValidationError
from django.http import HttpRequest
from rest_framework import exceptions, serializers
from rest_framework.generics import GenericAPIView
from rest_framework.permissions import BasePermission, IsAuthenticated
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView
from rest_framework.views import exception_handler as drf_exception_handler
from rest_framework.viewsets import GenericViewSet

from accounts import selectors
from accounts.models import ApiToken, Membership, Organization, Role, User

logger = logging.getLogger(__name__)

# Where a browser session keeps its current organization (switched by POST organizations/{id}/switch/).
ORGANIZATION_SESSION_KEY = "organization_id"


def role_map(**minimum_roles: Role) -> Mapping[str, Role]:
    """A view's ``required_roles``: HTTP method or viewset action -> minimum role, read-only.

    ``role_map(GET=Role.VIEWER, POST=Role.ADMIN)``; ``role_map(list=Role.VIEWER, cancel=Role.MEMBER)``.
    """
    return MappingProxyType({name: Role(role) for name, role in minimum_roles.items()})


# What each HTTP method needs when a view does not say (HEAD follows GET; OPTIONS needs a viewer).
DEFAULT_REQUIRED_ROLES = role_map(
    GET=Role.VIEWER, POST=Role.MEMBER, PUT=Role.MEMBER, PATCH=Role.MEMBER, DELETE=Role.MEMBER
)


# --- organization resolution ---------------------------------------------------------------------


def resolve_organization(request: Request | HttpRequest) -> tuple[Organization | None, Membership | None]:
    """The organization a request acts in and the user's membership there, or (None, None).

    - A bearer token: the token's organization; a token whose user is no longer a member there
      answers 401 (``member_remove`` also revokes such tokens).
    - A browser session: ``request.session["organization_id"]`` if the user is still a member
      there, else the user's first organization by id (remembered in the session).
    - Anonymous, or a session user of no organization: (None, None).

    Called once per request by ``OrganizationScopedMixin.perform_authentication``, and by the web
    pages (``config.pages``) with a plain Django request, which has a session and no ``auth``.
    """
    user = request.user
    if not user.is_authenticated:
        return None, None
    token = getattr(request, "auth", None)
    if isinstance(token, ApiToken):
        membership = token_membership(user=user, token=token)
    else:
        membership = session_membership(user=user, session=getattr(request, "session", None))
    return (membership.organization if membership else None), membership


def token_membership(*, user: User, token: ApiToken) -> Membership:
    """The membership a bearer token acts as: its user's, in the token's organization. Raises
    ``AuthenticationFailed`` when the user is no longer a member there. Shared by the REST API
    (``resolve_organization``) and the websockets (``accounts.websocket``)."""
    if hasattr(token, "membership"):  # read with the token (``selectors.token_by_digest``)
        membership = token.membership
    else:
        membership = selectors.membership_of(user=user, organization=token.organization_id)
    if membership is None:
        raise exceptions.AuthenticationFailed("This token's user is no longer a member of its organization.")
    return membership


def session_membership(*, user: User, session: SessionBase | None) -> Membership | None:
    """The membership a browser session acts as: ``session["organization_id"]`` if the user is
    still a member there, else the user's first organization by id (remembered in the session);
    None for a user of no organization. Shared like ``token_membership``."""
    stored = session.get(ORGANIZATION_SESSION_KEY) if session is not None else None
    membership = selectors.membership_of(user=user, organization=stored) if isinstance(stored, int) else None
    if membership is None:
        membership = selectors.first_membership_of(user=user)
        if session is not None:
            if membership is None:
                session.pop(ORGANIZATION_SESSION_KEY, None)
            else:
                session[ORGANIZATION_SESSION_KEY] = membership.organization_id
    return membership


def switch_organization(request: Request, membership: Membership) -> None:
    """Make ``membership``'s organization the session's current one (browser sessions only)."""
    request.session[ORGANIZATION_SESSION_KEY] = membership.organization_id


# --- role checks ---------------------------------------------------------------------------------


def _role_denial(request: Request, minimum: Role | str) -> str | None:
    """Why the request's member lacks ``minimum``, or None when they have it."""
    membership: Membership | None = getattr(request, "membership", None)
    if membership is None:
        return "You are not a member of any organization."
    if not membership.has_role(minimum):
        return (
            f"This needs the {Role(minimum).label.lower()} role or higher in {membership.organization.name}; "
            f"yours is {membership.role}."
        )
    return None


def require_role(request: Request, minimum: Role | str) -> None:
    """Raise 403 unless the request's member has ``minimum`` (or a higher role).

    For checks inside a handler that depend on the object, e.g. "members act on their own jobs,
    admins on everyone's". Needs ``request.membership`` (set by ``OrganizationScopedMixin``).
    """
    reason = _role_denial(request, minimum)
    if reason:
        raise exceptions.PermissionDenied(reason)


class HasOrgRole(BasePermission):
    """The request's member has the role the view asks for this request (its ``required_roles``
    map, by viewset action or HTTP method). Part of every ``OrganizationScopedMixin`` view."""

    def has_permission(self, request: Request, view: APIView) -> bool:
        minimum = view.get_required_role(request)  # type: ignore[attr-defined]
        if minimum is None:
            return True
        reason = _role_denial(request, minimum)
        if reason:
            self.message = reason
        return reason is None


class _HasFixedRole(BasePermission):
    role: Role

    def has_permission(self, request: Request, view: APIView) -> bool:
        reason = _role_denial(request, self.role)
        if reason:
            self.message = reason
        return reason is None


class IsOrgViewer(_HasFixedRole):
    """Any member. For views (or viewset actions via ``get_permissions``) with one role for all
    methods; most views use ``required_roles`` instead."""

    role = Role.VIEWER


class IsOrgMember(_HasFixedRole):
    """Members, admins and owners: those who create and act on jobs."""

    role = Role.MEMBER


class IsOrgAdmin(_HasFixedRole):
    """Admins and owners: those who manage members and the quota."""

    role = Role.ADMIN


class IsOrgOwner(_HasFixedRole):
    """Owners only."""

    role = Role.OWNER


# --- views ---------------------------------------------------------------------------------------


class OrganizationScopedMixin:
    """Resolve the request's organization once, right after authentication, and check the role.

    Sets ``request.organization`` and ``request.membership`` (None for anonymous requests and for
    session users of no organization). Mix into a DRF view before the view class; ``OrgAPIView``,
    ``OrgGenericAPIView`` and ``OrgGenericViewSet`` do.

    - ``required_roles``: action or HTTP method -> minimum role (a ``role_map``), checked by
      ``HasOrgRole``; a method
      missing from the map needs an owner (closed by default). Default: reads need a viewer,
      writes a member.
    - ``organization_url_kwarg``: a URL argument naming an organization id; any other organization
      than the request's answers 404 (switch first).
    - ``organization_required = False``: for user-level views (your organizations, switching), which
      work without a current organization and skip the role map.
    """

    organization_required = True
    organization_url_kwarg = "organization_id"
    required_roles: Mapping[str, Role] = DEFAULT_REQUIRED_ROLES
    permission_classes = (IsAuthenticated, HasOrgRole)

    def perform_authentication(self, request: Request) -> None:
        super().perform_authentication(request)  # type: ignore[misc]
        request.organization, request.membership = resolve_organization(request)
        url_organization = self.kwargs.get(self.organization_url_kwarg) if self.organization_url_kwarg else None
        if (
            request.user.is_authenticated
            and url_organization is not None
            and (request.organization is None or request.organization.pk != int(url_organization))
        ):
            raise exceptions.NotFound("No such organization among yours; switch to it first.")

    def get_required_role(self, request: Request) -> Role | None:
        """The minimum role for this request, or None when the view needs no organization."""
        if not self.organization_required:
            return None
        if request.method == "OPTIONS":
            return Role.VIEWER
        action = getattr(self, "action", None)
        if action and action in self.required_roles:
            return self.required_roles[action]
        method = "GET" if request.method == "HEAD" else request.method
        return self.required_roles.get(method, Role.OWNER)


class OrgAPIView(OrganizationScopedMixin, APIView):
    """An ``APIView`` acting within the request's organization."""


class IsPlatformStaff(BasePermission):
    """Platform staff (``User.is_staff``): those who run the platform, not a tenant's role."""

    message = "Only platform staff may do this; plans and quotas are set by the platform."

    def has_permission(self, request: Request, view: APIView) -> bool:
        return bool(request.user and request.user.is_staff)


class StaffAPIView(OrganizationScopedMixin, GenericAPIView):
    """A platform staff view (plans, assigning them): no organization is needed and no tenant role,
    however high, is enough. ``request.organization`` is still resolved, for views that show it."""

    organization_required = False
    organization_url_kwarg = None  # staff address any organization
    permission_classes = (IsAuthenticated, IsPlatformStaff)


class OrgGenericAPIView(OrganizationScopedMixin, GenericAPIView):
    """A ``GenericAPIView`` (pagination, ``get_serializer``) acting within the request's organization."""


class OrgGenericViewSet(OrganizationScopedMixin, GenericViewSet):
    """A ``GenericViewSet`` acting within the request's organization; ``required_roles`` may name
    actions (``role_map(list=Role.VIEWER, cancel=Role.MEMBER)``)."""


# --- serializers and errors --------------------------------------------------------------


class StrictFieldsMixin:
    """Reject input keys the serializer does not accept: 400 ``{"<key>": ["Unknown field."]}``.

    Mix into every input serializer (``class JobCreateSerializer(StrictFieldsMixin,
    serializers.Serializer)``), so a misspelt optional field fails loudly instead of being ignored.
    Read-only fields count as unknown in input.
    """

    # The browsable API's forms post their CSRF token with the data.
    ignored_input_keys = frozenset({"csrfmiddlewaretoken"})

    def to_internal_value(self, data: Any) -> Any:
        if isinstance(data, Mapping):
            writable = {name for name, field in self.fields.items() if not field.read_only}  # type: ignore[attr-defined]
            unknown = sorted(set(data) - writable - self.ignored_input_keys)
            if unknown:
                expected = ", ".join(sorted(writable)) or "none"
                raise serializers.ValidationError(
                    {name: [f"Unknown field (expected: {expected})."] for name in unknown}
                )
        return super().to_internal_value(data)  # type: ignore[misc]


class ModelSerializer(serializers.ModelSerializer):
    """The base of every model serializer of the API: its fields are worked out from the model once
    per class, then copied for each instance. DRF's ``ModelSerializer`` inspects the model anew for
    every serializer it makes, about half a millisecond of a job page's few (profiled under uvicorn);
    the result depends on the class alone, and ``get_fields`` returns fresh copies either way."""

    def get_fields(self) -> dict[str, serializers.Field]:
        cls = type(self)
        fields = cls.__dict__.get("_model_fields")
        if fields is None:  # first use of this class (two threads may both build it: same result)
            fields = super().get_fields()
            cls._model_fields = fields
        return copy.deepcopy(fields)


class EmptySerializer(StrictFieldsMixin, serializers.Serializer):
    """The body of an action that takes no input (revoke, switch): any field is an error."""


class PayloadTooLarge(exceptions.APIException):
    status_code = 413
    default_detail = "The request body is too large."
    default_code = "payload_too_large"


def exception_handler(exc: Exception, context: dict) -> Any:
    """DRF's handler, plus:

    - Django's ``ValidationError`` (raised by services) as a 400 with the same shape as a
      serializer's errors;
    - a body over ``DATA_UPLOAD_MAX_MEMORY_SIZE`` as a 413 saying the limit;
    - any other error as a 500 with a fixed message, the error and its traceback in the server's
      log only (never in the response, whatever DEBUG says: a message may hold a secret).

    Set as ``REST_FRAMEWORK["EXCEPTION_HANDLER"]``."""
    if isinstance(exc, DjangoValidationError):
        exc = exceptions.ValidationError(detail=serializers.as_serializer_error(exc))
    elif isinstance(exc, RequestDataTooBig):
        limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
        exc = PayloadTooLarge(f"The request body is too large: at most {limit} bytes.")
    response = drf_exception_handler(exc, context)
    if response is None:
        view = context.get("view")
        logger.error("unhandled error in %s", type(view).__name__ if view else "an API view", exc_info=exc)
        response = Response({"detail": "Internal server error; it has been logged."}, status=500)
    return response
