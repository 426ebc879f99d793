"""The accounts REST API under ``/api/v1/`` (routes in ``accounts.urls``).

Thin views: each validates input with a serializer, calls one service (writes) or selector (reads)
and serializes the result. The organization and the role check come from ``accounts.api``.
Also the sign-in page's throttled view (``ThrottledLoginView``).
"""

import math
from typing import Any

from django.contrib.auth import views as auth_views
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import exceptions, status
from rest_framework.generics import get_object_or_404
from rest_framework.permissions import AllowAny
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.throttling import ScopedRateThrottle
from rest_framework.views import APIView

from accounts import selectors, services
from accounts.api import EmptySerializer, OrgAPIView, OrgGenericAPIView, StaffAPIView, role_map, switch_organization
from accounts.models import ApiToken, Membership, Organization, Plan, Role
from accounts.serializers import (
    AuditLogSerializer,
    MemberAddSerializer,
    MemberRoleSerializer,
    MemberSerializer,
    ObtainTokenSerializer,
    OrganizationCreateSerializer,
    OrganizationPlanSerializer,
    OrganizationSerializer,
    PlanAssignSerializer,
    PlanInputSerializer,
    PlanSerializer,
    QuotaSerializer,
    TokenCreatedSerializer,
    TokenCreateSerializer,
    TokenSerializer,
    WebsocketTicketSerializer,
)
from accounts.websocket import TICKET_MAX_AGE_S, ticket_issue


def _created_token(token: ApiToken, plaintext: str) -> Response:
    data = TokenCreatedSerializer(token, context={"plaintext": plaintext}).data
    return Response(data, status=status.HTTP_201_CREATED)


# --- tokens -------------------------------------------------------------------------------------


class ObtainTokenView(APIView):
    """``POST auth/token/``: trade a username and password for a token (shown once).

    Open to anyone (the credentials are the authentication) and throttled per client address.
    """

    authentication_classes = ()
    permission_classes = (AllowAny,)
    throttle_classes = (ScopedRateThrottle,)
    throttle_scope = "auth-token"

    @extend_schema(
        summary="Log in for a token", request=ObtainTokenSerializer, responses={201: TokenCreatedSerializer}, auth=[]
    )
    def post(self, request: Request) -> Response:
        serializer = ObtainTokenSerializer(data=request.data, context={"request": request})
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        token, plaintext = services.token_create(
            user=data["user"],
            organization=data["organization"],
            name=data["name"],
            expires_in_days=data.get("expires_days"),
        )
        return _created_token(token, plaintext)


class ThrottledLoginView(auth_views.LoginView):
    """The sign-in page (``/accounts/login/``), django.contrib.auth's, with its POSTs throttled per
    client address like ``POST auth/token/`` (scope "login" in ``DEFAULT_THROTTLE_RATES``). Past the
    rate the page answers 429 with a ``Retry-After`` and an empty form, and checks no password."""

    throttle_scope = "login"

    def post(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        throttle = ScopedRateThrottle()
        if throttle.allow_request(request, self):
            return super().post(request, *args, **kwargs)
        wait = math.ceil(throttle.wait() or 1)
        context = self.get_context_data(form=self.get_form_class()(request),
                                        throttled=f"Too many sign-in attempts from your address: try again in "
                                                  f"{wait} seconds.")
        response = self.render_to_response(context, status=429)
        response["Retry-After"] = str(wait)
        return response


class TokenListCreateView(OrgGenericAPIView):
    """``GET tokens/``: your tokens in the current organization. ``POST``: a new one (shown once).

    Tokens are personal credentials carrying at most their user's role, so viewers manage theirs too.
    """

    required_roles = role_map(GET=Role.VIEWER, POST=Role.VIEWER)
    serializer_class = TokenSerializer

    def get_queryset(self) -> QuerySet[ApiToken]:
        return selectors.tokens_for(user=self.request.user, organization=self.request.organization)

    @extend_schema(summary="List your tokens", responses=TokenSerializer(many=True))
    def get(self, request: Request) -> Response:
        page = self.paginate_queryset(self.get_queryset())
        return self.get_paginated_response(TokenSerializer(page, many=True).data)

    @extend_schema(summary="Create a token", request=TokenCreateSerializer, responses={201: TokenCreatedSerializer})
    def post(self, request: Request) -> Response:
        serializer = TokenCreateSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        token, plaintext = services.token_create(
            user=request.user,
            organization=request.organization,
            name=serializer.validated_data["name"],
            expires_in_days=serializer.validated_data.get("expires_days"),
        )
        return _created_token(token, plaintext)


class TokenRevokeView(OrgAPIView):
    """``POST tokens/{id}/revoke/``: revoke one of your tokens; admins and owners may revoke any
    token of the organization. A token you may not revoke answers 404, like one that is not there."""

    required_roles = role_map(POST=Role.VIEWER)

    @extend_schema(summary="Revoke a token", request=None, responses={200: TokenSerializer})
    def post(self, request: Request, token_id: int) -> Response:
        EmptySerializer(data=request.data).is_valid(raise_exception=True)
        if request.membership.has_role(Role.ADMIN):
            tokens = selectors.tokens_of(organization=request.organization)
        else:
            tokens = selectors.tokens_for(user=request.user, organization=request.organization)
        token = services.token_revoke(token=get_object_or_404(tokens, pk=token_id), actor=request.user)
        return Response(TokenSerializer(token).data)


class WebsocketTicketView(OrgAPIView):
    """``POST ws-ticket/``: a ticket to open a websocket with (``/ws/...?ticket=``), valid for
    ``TICKET_MAX_AGE_S`` seconds and bound to you and the organization this request acts in.

    For clients that cannot send an ``Authorization`` header on a websocket (a browser's
    ``WebSocket``), so that a long-lived token never goes in a URL. Any member may ask; platform
    staff without an organization get one for the cluster socket.
    """

    organization_required = False  # staff without an organization watch the cluster too

    @extend_schema(summary="Get a websocket ticket", request=None, responses={200: WebsocketTicketSerializer})
    def post(self, request: Request) -> Response:
        EmptySerializer(data=request.data).is_valid(raise_exception=True)
        if request.membership is None and not request.user.is_staff:
            raise exceptions.PermissionDenied("You are not a member of any organization.")
        ticket = ticket_issue(user=request.user, organization=request.organization)
        return Response(WebsocketTicketSerializer({"ticket": ticket, "expires_in": TICKET_MAX_AGE_S}).data)


# --- organizations ------------------------------------------------------------------------------


class OrganizationListCreateView(OrgGenericAPIView):
    """``GET organizations/``: your organizations with your role (with a token: only the token's,
    which is all a token may act in). ``POST``: platform staff create one with its first owner."""

    organization_required = False
    serializer_class = OrganizationSerializer

    def get_queryset(self) -> QuerySet[Organization]:
        organizations = selectors.organizations_of(user=self.request.user)
        if isinstance(self.request.auth, ApiToken):
            organizations = organizations.filter(pk=self.request.auth.organization_id)
        return organizations

    @extend_schema(summary="List your organizations", responses=OrganizationSerializer(many=True))
    def get(self, request: Request) -> Response:
        page = self.paginate_queryset(self.get_queryset())
        context = {"current": request.organization}
        return self.get_paginated_response(OrganizationSerializer(page, many=True, context=context).data)

    @extend_schema(
        summary="Create an organization (staff)",
        request=OrganizationCreateSerializer,
        responses={201: OrganizationSerializer},
    )
    def post(self, request: Request) -> Response:
        if not request.user.is_staff:
            raise exceptions.PermissionDenied("Only platform staff may create organizations.")
        serializer = OrganizationCreateSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        organization = services.organization_create(
            name=data["name"], slug=data.get("slug", ""), owner=data["owner"], actor=request.user
        )
        membership = selectors.membership_of(user=request.user, organization=organization)
        organization.role = membership.role if membership else None  # staff need not be a member
        return Response(
            OrganizationSerializer(organization, context={"current": request.organization}).data,
            status=status.HTTP_201_CREATED,
        )


class OrganizationSwitchView(OrgAPIView):
    """``POST organizations/{id}/switch/``: make one of your organizations the browser session's
    current one. Tokens are bound to their organization and cannot switch."""

    organization_required = False
    organization_url_kwarg = None  # any of the user's organizations, not only the current one

    @extend_schema(summary="Switch the session's organization", request=None, responses={200: OrganizationSerializer})
    def post(self, request: Request, organization_id: int) -> Response:
        if request.auth is not None:
            raise exceptions.PermissionDenied(
                "A token acts in its own organization; switching is for browser sessions."
            )
        EmptySerializer(data=request.data).is_valid(raise_exception=True)
        membership = selectors.membership_of(user=request.user, organization=organization_id)
        if membership is None:
            raise exceptions.NotFound("No such organization among yours.")
        switch_organization(request, membership)
        organization = membership.organization
        organization.role = membership.role
        return Response(OrganizationSerializer(organization, context={"current": organization}).data)


# --- members ------------------------------------------------------------------------------------


class MemberListCreateView(OrgGenericAPIView):
    """``GET organizations/{id}/members/``: the current organization's members. ``POST``: add one
    (admins; only owners add owners)."""

    required_roles = role_map(GET=Role.VIEWER, POST=Role.ADMIN)
    serializer_class = MemberSerializer

    def get_queryset(self) -> QuerySet[Membership]:
        return selectors.members_of(organization=self.request.organization)

    @extend_schema(summary="List members", responses=MemberSerializer(many=True))
    def get(self, request: Request, organization_id: int) -> Response:
        page = self.paginate_queryset(self.get_queryset())
        return self.get_paginated_response(MemberSerializer(page, many=True).data)

    @extend_schema(summary="Add a member", request=MemberAddSerializer, responses={201: MemberSerializer})
    def post(self, request: Request, organization_id: int) -> Response:
        serializer = MemberAddSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        membership = services.member_add(
            organization=request.organization,
            actor=request.user,
            user=serializer.validated_data["username"],
            role=serializer.validated_data["role"],
        )
        return Response(MemberSerializer(membership).data, status=status.HTTP_201_CREATED)


class MemberDetailView(OrgGenericAPIView):
    """``organizations/{id}/members/{user_id}/``: ``GET`` one member, ``PATCH`` their role,
    ``DELETE`` them (admins; owners for anything about owners; the last owner stays)."""

    required_roles = role_map(GET=Role.VIEWER, PATCH=Role.ADMIN, DELETE=Role.ADMIN)
    serializer_class = MemberSerializer

    def get_object(self) -> Membership:
        members = selectors.members_of(organization=self.request.organization)
        return get_object_or_404(members, user_id=self.kwargs["user_id"])

    @extend_schema(summary="Show a member")
    def get(self, request: Request, organization_id: int, user_id: int) -> Response:
        return Response(MemberSerializer(self.get_object()).data)

    @extend_schema(summary="Change a member's role", request=MemberRoleSerializer, responses={200: MemberSerializer})
    def patch(self, request: Request, organization_id: int, user_id: int) -> Response:
        membership = self.get_object()
        serializer = MemberRoleSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        membership = services.member_set_role(
            organization=request.organization,
            actor=request.user,
            user=membership.user,
            role=serializer.validated_data["role"],
        )
        return Response(MemberSerializer(membership).data)

    @extend_schema(
        summary="Remove a member",
        responses={204: OpenApiResponse(description="Removed; their tokens here are revoked.")},
    )
    def delete(self, request: Request, organization_id: int, user_id: int) -> Response:
        membership = self.get_object()
        services.member_remove(organization=request.organization, actor=request.user, user=membership.user)
        return Response(status=status.HTTP_204_NO_CONTENT)


# --- plans (platform staff), quota and audit ---------------------------------------------------

QUOTA_BY_PLATFORM = (
    "Quotas, plans and scheduler weights are set by platform staff; ask them to change your "
    "organization's plan ({plan})."
)


class QuotaView(OrgAPIView):
    """``GET quota/``: the current organization's plan (limits, weight, highest priority) and use.
    ``PATCH`` answers 403 to every tenant role: the platform sets quotas (``PUT
    organizations/{id}/plan/``, staff)."""

    required_roles = role_map(GET=Role.VIEWER, PATCH=Role.VIEWER)

    @extend_schema(summary="Show the quota", responses=QuotaSerializer)
    def get(self, request: Request) -> Response:
        organization = request.organization
        quota = selectors.quota_of(organization=organization)
        usage = selectors.quota_usage(organization=organization)
        return Response(QuotaSerializer(quota, context={"usage": usage, "organization": organization}).data)

    @extend_schema(
        summary="Change the quota (refused: staff assign plans)",
        request=None,
        responses={403: OpenApiResponse(description="Quotas are set by platform staff.")},
    )
    def patch(self, request: Request) -> Response:
        plan = selectors.quota_of(organization=request.organization)
        raise exceptions.PermissionDenied(QUOTA_BY_PLATFORM.format(plan=plan.name))


class PlanListCreateView(StaffAPIView):
    """``GET plans/``: every plan with its organization count. ``POST``: a new plan. Staff only."""

    serializer_class = PlanSerializer

    def get_queryset(self) -> QuerySet[Plan]:
        return selectors.plans()

    @extend_schema(summary="List plans (staff)", responses=PlanSerializer(many=True))
    def get(self, request: Request) -> Response:
        page = self.paginate_queryset(self.get_queryset())
        return self.get_paginated_response(PlanSerializer(page, many=True).data)

    @extend_schema(summary="Create a plan (staff)", request=PlanInputSerializer, responses={201: PlanSerializer})
    def post(self, request: Request) -> Response:
        serializer = PlanInputSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        plan = services.plan_create(actor=request.user, **serializer.validated_data)
        return Response(PlanSerializer(get_object_or_404(selectors.plans(), pk=plan.pk)).data,
                        status=status.HTTP_201_CREATED)


class PlanDetailView(StaffAPIView):
    """``GET plans/{id}/``: one plan. ``PATCH``: change its limits, weight or highest priority;
    every organization on it sees the change at once (audited in each). Staff only."""

    serializer_class = PlanSerializer

    @extend_schema(summary="Show a plan (staff)")
    def get(self, request: Request, plan_id: int) -> Response:
        return Response(PlanSerializer(get_object_or_404(selectors.plans(), pk=plan_id)).data)

    @extend_schema(summary="Change a plan (staff)", request=PlanInputSerializer, responses={200: PlanSerializer})
    def patch(self, request: Request, plan_id: int) -> Response:
        plan = get_object_or_404(selectors.plans(), pk=plan_id)
        serializer = PlanInputSerializer(data=request.data, partial_update=True)
        serializer.is_valid(raise_exception=True)
        services.plan_update(plan=plan, actor=request.user, **serializer.validated_data)
        return Response(PlanSerializer(get_object_or_404(selectors.plans(), pk=plan_id)).data)


class OrganizationPlanView(StaffAPIView):
    """``GET organizations/{id}/plan/``: the organization's plan. ``PUT``: put it on another plan
    (``{"plan": "<name>"}``; audited with the staff member). Staff only: a tenant's owner reads
    the plan through ``GET quota/`` and cannot change it."""

    serializer_class = OrganizationPlanSerializer

    def _organization(self, organization_id: int) -> Organization:
        return get_object_or_404(Organization.objects.select_related("plan"), pk=organization_id)

    @extend_schema(summary="Show an organization's plan (staff)")
    def get(self, request: Request, organization_id: int) -> Response:
        return Response(OrganizationPlanSerializer(self._organization(organization_id)).data)

    @extend_schema(summary="Assign a plan (staff)", request=PlanAssignSerializer,
                   responses={200: OrganizationPlanSerializer})
    def put(self, request: Request, organization_id: int) -> Response:
        organization = self._organization(organization_id)
        serializer = PlanAssignSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        services.plan_assign(organization=organization, plan=serializer.validated_data["plan"], actor=request.user)
        return Response(OrganizationPlanSerializer(self._organization(organization_id)).data)


class AuditLogView(OrgGenericAPIView):
    """``GET audit/``: the current organization's audit log, newest first (admins and owners)."""

    required_roles = role_map(GET=Role.ADMIN)
    serializer_class = AuditLogSerializer

    def get_queryset(self) -> QuerySet:
        return selectors.audit_of(organization=self.request.organization)

    @extend_schema(summary="List the audit log", responses=AuditLogSerializer(many=True))
    def get(self, request: Request) -> Response:
        page = self.paginate_queryset(self.get_queryset())
        return self.get_paginated_response(AuditLogSerializer(page, many=True).data)
