"""Routes of the notifications API, included under ``/api/v1/`` by ``config.urls``."""

from django.urls import path

from notifications import views

app_name = "notifications"

urlpatterns = [
    path("webhooks/", views.WebhookListView.as_view(), name="webhooks"),
    path("webhooks/<int:webhook_id>/", views.WebhookView.as_view(), name="webhook"),
    path("webhooks/<int:webhook_id>/deliveries/", views.DeliveryListView.as_view(), name="deliveries"),
    path("notifications/email/", views.EmailChoiceView.as_view(), name="email"),
]
