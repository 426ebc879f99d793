"""The API's OpenAPI schema validates, its docs work offline, and every API view is tenant-scoped."""

import yaml
from django.core.management import call_command
from django.urls import URLPattern, URLResolver, get_resolver

from accounts.api import OrganizationScopedMixin
from accounts.views import ObtainTokenView

# Views under /api/v1/ that act before any organization is known (with the reason).
UNSCOPED_API_VIEWS = {ObtainTokenView}  # the login itself: no user yet


def test_schema_validates_without_warnings(tmp_path):
    path = tmp_path / "schema.yaml"
    call_command("spectacular", "--validate", "--fail-on-warn", "--file", str(path))
    schema = yaml.safe_load(path.read_text())
    assert {
        "/api/v1/auth/token/",
        "/api/v1/tokens/",
        "/api/v1/tokens/{token_id}/revoke/",
        "/api/v1/organizations/",
        "/api/v1/organizations/{organization_id}/switch/",
        "/api/v1/organizations/{organization_id}/members/",
        "/api/v1/organizations/{organization_id}/members/{user_id}/",
        "/api/v1/quota/",
        "/api/v1/audit/",
        "/api/v1/ws-ticket/",
    } <= set(schema["paths"])
    assert schema["components"]["securitySchemes"]["bearerToken"] == {
        "type": "http",
        "scheme": "bearer",
        "description": schema["components"]["securitySchemes"]["bearerToken"]["description"],
    }
    assert "security" not in schema["paths"]["/api/v1/auth/token/"]["post"]


def test_schema_and_docs_are_served_without_a_cdn(client):
    assert client.get("/api/schema/").status_code == 200
    response = client.get("/api/docs/")
    assert response.status_code == 200
    page = response.content.decode()
    assert "/static/drf_spectacular_sidecar/swagger-ui-dist/" in page
    for cdn in ("cdn.jsdelivr.net", "unpkg.com"):
        assert cdn not in page


def _api_views(resolver: URLResolver, prefix: str = "") -> list[tuple[str, type]]:
    found = []
    for pattern in resolver.url_patterns:
        route = prefix + str(pattern.pattern)
        if isinstance(pattern, URLResolver):
            found += _api_views(pattern, route)
        elif isinstance(pattern, URLPattern) and route.startswith("api/v1/"):
            found.append((route, pattern.callback.view_class))
    return found


def test_every_api_view_resolves_the_organization():
    views = _api_views(get_resolver())
    assert len(views) >= 8
    unscoped = [route for route, view in views if not issubclass(view, OrganizationScopedMixin)]
    assert unscoped == [route for route, view in views if view in UNSCOPED_API_VIEWS]


def _subclasses(cls):
    for sub in cls.__subclasses__():
        yield sub
        yield from _subclasses(sub)


def test_every_model_serializer_of_the_apps_works_out_its_fields_once():
    """Each app's model serializer derives from ``accounts.api.ModelSerializer``: the model is
    inspected for the first instance of a class only, and every instance still gets fields of its own."""
    from unittest import mock

    from rest_framework import serializers

    import accounts.serializers
    import billing.serializers
    import jobs.resource_serializers
    import jobs.serializers
    from accounts.api import ModelSerializer
    from jobs.models import Job

    apps = (accounts.serializers, billing.serializers, jobs.serializers, jobs.resource_serializers)
    ours = [c for c in _subclasses(serializers.ModelSerializer) if c.__module__ in {m.__name__ for m in apps}]
    assert ours
    assert [c.__name__ for c in ours if not issubclass(c, ModelSerializer)] == []

    class Probe(ModelSerializer):
        class Meta:
            model = Job
            fields = ("id", "name", "state")

    with mock.patch.object(serializers.ModelSerializer, "get_fields", autospec=True,
                           side_effect=serializers.ModelSerializer.get_fields) as inspect:
        first, second = Probe(Job(name="a")), Probe(Job(name="b"))
        assert (first.data["name"], second.data["name"]) == ("a", "b")
    assert inspect.call_count == 1
    assert first.fields["name"] is not second.fields["name"]
    assert first.fields["name"].parent is first
