"""The guard every dashboard view goes through: login, method, permission, response headers."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from functools import wraps
from typing import Any, TypeVar

from django.conf import settings
from django.contrib.auth.views import redirect_to_login
from django.http import HttpRequest, HttpResponse, HttpResponseNotAllowed
from django.http.response import HttpResponseBase
from django.shortcuts import render, resolve_url
from django.utils.cache import patch_vary_headers
from django_htmx.http import HttpResponseClientRedirect

from .htmx import is_htmx
from .permissions import OPERATE_PERM, VIEW_PERM

CONTENT_SECURITY_POLICY = "; ".join(
    [
        "default-src 'none'",
        "script-src 'self'",
        "style-src 'self'",
        "img-src 'self' data:",
        "connect-src 'self'",
        "form-action 'self'",
        "base-uri 'none'",
        "frame-ancestors 'none'",
    ]
)
"""Only the project's own files run or style a page: no inline script, no outside source."""

View = Callable[..., HttpResponse]
Response = TypeVar("Response", bound=HttpResponseBase)


def secure_headers(response: Response) -> Response:
    """Add the dashboard's policy and say the body depends on ``HX-Request``."""
    response["Content-Security-Policy"] = CONTENT_SECURITY_POLICY
    response.setdefault("Referrer-Policy", "same-origin")
    response.setdefault("X-Content-Type-Options", "nosniff")
    patch_vary_headers(response, ["HX-Request"])
    return response


def denied(request: HttpRequest, message: str) -> HttpResponse:
    """A 403 page that says which permission is missing."""
    return render(request, "admin_ui/denied.html", {"message": message}, status=403)


def dashboard_view(
    *, methods: Iterable[str] = ("GET", "HEAD"), operate: bool = False
) -> Callable[[View], View]:
    """Guard a dashboard view, in this order.

    Anonymous users go to the login page (htmx requests are told to navigate there); a method
    the view does not accept gets 405 (so GET on an action URL never reaches it); a user without
    ``view_job`` — or without ``operate`` on an acting view — gets 403. Every response carries
    the Content-Security-Policy and ``Vary: HX-Request``.
    """
    allowed = [m.upper() for m in methods]

    def decorate(view: View) -> View:
        @wraps(view)
        def guarded(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
            response: HttpResponse
            if not request.user.is_authenticated:
                if is_htmx(request):
                    response = HttpResponseClientRedirect(resolve_url(settings.LOGIN_URL))
                else:
                    response = redirect_to_login(request.get_full_path())
            elif request.method not in allowed:
                response = HttpResponseNotAllowed(allowed)
            elif not request.user.has_perm(VIEW_PERM):
                response = denied(request, "You need the permission to view jobs.")
            elif operate and not request.user.has_perm(OPERATE_PERM):
                response = denied(request, "You may view jobs but not act on them.")
            else:
                response = view(request, *args, **kwargs)
            return secure_headers(response)

        return guarded

    return decorate
