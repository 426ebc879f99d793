"""Routes of the billing API, included under ``/api/v1/`` by ``config.urls``."""

from django.urls import path

from billing import views

app_name = "billing"

urlpatterns = [
    path("billing/usage/", views.UsageListView.as_view(), name="usage"),
    path("billing/savings/", views.SavingsView.as_view(), name="savings"),
    path("billing/summary/", views.MonthlySummaryView.as_view(), name="summary"),
    path("billing/cluster/", views.ClusterSummaryView.as_view(), name="cluster"),
]
