"""The notifications API under ``/api/v1/`` (routes in ``notifications.urls``): the organization's
webhooks and their delivery log (admins and owners), and each member's own e-mail choice."""

from django.shortcuts import get_object_or_404
from drf_spectacular.utils import extend_schema
from rest_framework import status
from rest_framework.request import Request
from rest_framework.response import Response

from accounts.api import OrgAPIView, OrgGenericAPIView, role_map
from accounts.models import Role
from accounts.services import audit_record
from notifications import services
from notifications.models import Delivery, Webhook
from notifications.serializers import (
    DeliverySerializer,
    EmailChoiceSerializer,
    WebhookCreatedSerializer,
    WebhookCreateSerializer,
    WebhookSerializer,
)


class WebhookListView(OrgGenericAPIView):
    """``GET webhooks/``: the organization's webhooks; ``POST``: add one (its secret is in the
    answer, and only there)."""

    required_roles = role_map(GET=Role.ADMIN, POST=Role.ADMIN)
    serializer_class = WebhookSerializer

    @extend_schema(summary="List webhooks", responses=WebhookSerializer(many=True))
    def get(self, request: Request) -> Response:
        hooks = Webhook.objects.filter(organization=request.organization)
        return self.get_paginated_response(WebhookSerializer(self.paginate_queryset(hooks), many=True).data)

    @extend_schema(summary="Add a webhook", request=WebhookCreateSerializer, responses={201: WebhookCreatedSerializer})
    def post(self, request: Request) -> Response:
        body = WebhookCreateSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        hook = services.webhook_create(organization=request.organization, user=request.user, **body.validated_data)
        audit_record(organization=request.organization, actor=request.user, action="webhook.created",
                     target=hook.url, data={"events": hook.events})
        return Response(WebhookCreatedSerializer(hook).data, status=status.HTTP_201_CREATED)


class WebhookView(OrgAPIView):
    """``DELETE webhooks/{id}/``: remove a webhook (its delivery log goes with it)."""

    required_roles = role_map(DELETE=Role.ADMIN)

    @extend_schema(summary="Remove a webhook", responses={204: None})
    def delete(self, request: Request, webhook_id: int) -> Response:
        hook = get_object_or_404(Webhook.objects.filter(organization=request.organization), pk=webhook_id)
        audit_record(organization=request.organization, actor=request.user, action="webhook.deleted", target=hook.url)
        hook.delete()
        return Response(status=status.HTTP_204_NO_CONTENT)


class DeliveryListView(OrgGenericAPIView):
    """``GET webhooks/{id}/deliveries/``: the webhook's delivery log, newest first: each event
    sent, its attempts and the last answer."""

    required_roles = role_map(GET=Role.ADMIN)
    serializer_class = DeliverySerializer

    @extend_schema(summary="List a webhook's deliveries", responses=DeliverySerializer(many=True))
    def get(self, request: Request, webhook_id: int) -> Response:
        hook = get_object_or_404(Webhook.objects.filter(organization=request.organization), pk=webhook_id)
        deliveries = Delivery.objects.filter(webhook=hook)
        return self.get_paginated_response(DeliverySerializer(self.paginate_queryset(deliveries), many=True).data)


class EmailChoiceView(OrgAPIView):
    """``GET notifications/email/``: the events of your own jobs you are e-mailed about (all until
    you choose); ``PUT``: choose them (an empty list: none)."""

    required_roles = role_map(GET=Role.VIEWER, PUT=Role.VIEWER)

    @extend_schema(summary="Show your e-mail choice", responses=EmailChoiceSerializer)
    def get(self, request: Request) -> Response:
        return Response({"events": services.email_events(request.user)})

    @extend_schema(summary="Choose your e-mails", request=EmailChoiceSerializer, responses=EmailChoiceSerializer)
    def put(self, request: Request) -> Response:
        body = EmailChoiceSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        return Response({"events": services.email_choose(user=request.user, events=body.validated_data["events"])})
