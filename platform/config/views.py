"""Project-level views that belong to no app."""

from django.http import HttpRequest, JsonResponse
from django.views.decorators.http import require_GET


@require_GET
def healthz(request: HttpRequest) -> JsonResponse:
    """Liveness for load balancers and the CI smoke test: the process serves requests."""
    return JsonResponse({"status": "ok"})
