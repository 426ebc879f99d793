"""Root URL configuration: the dashboard's pages (``config.pages``) at the root, the REST API under
/api/v1/, its OpenAPI schema and docs, the admin and django.contrib.auth's login and password pages
under /accounts/."""

from django.contrib import admin
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerSplitView

from accounts.views import ThrottledLoginView
from config import views

urlpatterns = [
    path("healthz", views.healthz, name="healthz"),
    path("api/v1/", include("accounts.urls")),
    path("api/v1/", include("jobs.urls")),
    path("api/v1/", include("billing.urls")),
    path("api/v1/", include("notifications.urls")),
    path("api/schema/", SpectacularAPIView.as_view(), name="schema"),
    path("api/docs/", SpectacularSwaggerSplitView.as_view(url_name="schema"), name="api-docs"),
    path("accounts/login/", ThrottledLoginView.as_view(), name="login"),  # before the include's own
    path("accounts/", include("django.contrib.auth.urls")),
    path("admin/", admin.site.urls),
    path("", include("config.pages")),
]
