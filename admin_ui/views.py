"""Dashboard views (read-only overview until the dashboard issue lands)."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from scheduler_core import health


@login_required
def overview(request: HttpRequest) -> HttpResponse:
    """Counts by state and health, live executors."""
    return render(request, "admin_ui/overview.html", {"status": health.status()})
