"""The notifications API's shapes."""

from rest_framework import serializers

from accounts.api import ModelSerializer, StrictFieldsMixin
from notifications.models import ALL_EVENTS, Delivery, Webhook


class EventsField(serializers.ListField):
    def __init__(self, **kwargs):
        super().__init__(child=serializers.ChoiceField(choices=ALL_EVENTS), **kwargs)


class WebhookSerializer(ModelSerializer):
    """A webhook as listed: its secret never, only its last four characters."""

    secret_hint = serializers.SerializerMethodField()

    class Meta:
        model = Webhook
        fields = ("id", "url", "events", "active", "secret_hint", "created_at")

    def get_secret_hint(self, hook: Webhook) -> str:
        return f"…{hook.secret[-4:]}"


class WebhookCreatedSerializer(WebhookSerializer):
    """A webhook just made: with its secret, shown this once (sign checks need it)."""

    class Meta(WebhookSerializer.Meta):
        fields = (*WebhookSerializer.Meta.fields, "secret")


class WebhookCreateSerializer(StrictFieldsMixin, serializers.Serializer):
    url = serializers.URLField(max_length=500, help_text="Where the events are POSTed (http or https).")
    events = EventsField(required=False, default=list(ALL_EVENTS), allow_empty=False,
                         help_text="The events sent there (default: all).")


class DeliverySerializer(ModelSerializer):
    class Meta:
        model = Delivery
        fields = ("id", "event", "job", "state", "attempts", "response_status", "error", "next_attempt_at",
                  "created_at", "delivered_at", "payload")


class EmailChoiceSerializer(StrictFieldsMixin, serializers.Serializer):
    events = EventsField(allow_empty=True, help_text="The events of your own jobs you are e-mailed about.")
