"""What an htmx request says about itself, read from its headers.

The dashboard reads the two headers it needs here instead of relying on django-htmx's
middleware, so a host project does not have to add that middleware for ``/ops/`` to work.
"""

from __future__ import annotations

from django.http import HttpRequest


def is_htmx(request: HttpRequest) -> bool:
    """Whether htmx sent the request (``HX-Request: true``)."""
    return request.headers.get("HX-Request") == "true"


def is_history_restore(request: HttpRequest) -> bool:
    """Whether htmx asks for a whole page to restore its history (a cache miss)."""
    return request.headers.get("HX-History-Restore-Request") == "true"
