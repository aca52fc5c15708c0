"""HTTP views of the core app: the Prometheus exposition at ``/metrics``."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse
from django.views.decorators.http import require_GET
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from .read import metrics


@require_GET
def metrics_view(request: HttpRequest) -> HttpResponse:
    """This process's figures and the system's, read from the database at scrape time."""
    body = generate_latest(metrics.exposition_registry())
    return HttpResponse(body, content_type=CONTENT_TYPE_LATEST)
