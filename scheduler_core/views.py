"""HTTP views of the core app: the Prometheus exposition at ``/metrics``, behind a guard.

Mounted by ``admin_ui.urls`` (``/ops/metrics`` under the documented include) and by
``scheduler_core.urls`` (``path("", include("scheduler_core.urls"))`` gives ``/metrics``).
A scrape is answered only for a request that carries ``Authorization: Bearer
<TENURE_METRICS_TOKEN>`` (when that setting is set) or comes from a logged-in user with the
``scheduler_core.view_job`` permission: 401 without credentials, 403 for a user without the
permission. The figures name queues, job types and executors, so they are never open.
"""

from __future__ import annotations

import hmac

from django.http import HttpRequest, HttpResponse
from django.views.decorators.http import require_GET
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from .conf import tenure_settings
from .read import metrics

VIEW_PERMISSION = "scheduler_core.view_job"


def _bearer(request: HttpRequest) -> str | None:
    scheme, _, token = request.headers.get("Authorization", "").partition(" ")
    return token.strip() if scheme.lower() == "bearer" and token.strip() else None


def may_scrape(request: HttpRequest) -> int:
    """200 when ``request`` may read the metrics, else the status to refuse it with."""
    expected = tenure_settings().METRICS_TOKEN
    offered = _bearer(request)
    if offered is not None:
        if expected and hmac.compare_digest(offered.encode(), expected.encode()):
            return 200
        return 401
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated:
        return 401
    return 200 if user.has_perm(VIEW_PERMISSION) else 403


@require_GET
def metrics_view(request: HttpRequest) -> HttpResponse:
    """This process's figures and the system's, read from the database at scrape time."""
    status = may_scrape(request)
    if status != 200:
        response = HttpResponse(
            "metrics need a bearer token (TENURE_METRICS_TOKEN) or a user with "
            f"{VIEW_PERMISSION}\n",
            status=status,
            content_type="text/plain; charset=utf-8",
        )
        if status == 401:
            response["WWW-Authenticate"] = 'Bearer realm="tenure-metrics"'
        return response
    body = generate_latest(metrics.exposition_registry())
    return HttpResponse(body, content_type=CONTENT_TYPE_LATEST)
