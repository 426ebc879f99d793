"""Routes of the accounts API, included under ``/api/v1/`` by ``config.urls``."""

from django.urls import path

from accounts import views

app_name = "accounts"

urlpatterns = [
    path("auth/token/", views.ObtainTokenView.as_view(), name="obtain-token"),
    path("tokens/", views.TokenListCreateView.as_view(), name="tokens"),
    path("tokens/<int:token_id>/revoke/", views.TokenRevokeView.as_view(), name="token-revoke"),
    path("organizations/", views.OrganizationListCreateView.as_view(), name="organizations"),
    path(
        "organizations/<int:organization_id>/switch/",
        views.OrganizationSwitchView.as_view(),
        name="organization-switch",
    ),
    path("organizations/<int:organization_id>/members/", views.MemberListCreateView.as_view(), name="members"),
    path(
        "organizations/<int:organization_id>/members/<int:user_id>/",
        views.MemberDetailView.as_view(),
        name="member-detail",
    ),
    path(
        "organizations/<int:organization_id>/plan/",
        views.OrganizationPlanView.as_view(),
        name="organization-plan",
    ),
    path("plans/", views.PlanListCreateView.as_view(), name="plans"),
    path("plans/<int:plan_id>/", views.PlanDetailView.as_view(), name="plan-detail"),
    path("quota/", views.QuotaView.as_view(), name="quota"),
    path("audit/", views.AuditLogView.as_view(), name="audit"),
    path("ws-ticket/", views.WebsocketTicketView.as_view(), name="ws-ticket"),
]
