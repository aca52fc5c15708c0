"""The dashboard's own login and logout pages, ``/ops/login/`` and ``/ops/logout/``: a project
with no login of its own sets ``LOGIN_URL = "admin_ui:login"`` and its operators have one.

A project that has a login keeps it: ``settings.LOGIN_URL`` alone decides where an anonymous
operator is sent. These are Django's own views (CSRF, the session rotated on login, logout by
POST only) with the dashboard's template and response headers.
"""

from __future__ import annotations

from typing import Any

from django.contrib.auth import views as auth_views
from django.http import HttpRequest
from django.http.response import HttpResponseBase

from .security import secure_headers

_login = auth_views.LoginView.as_view(
    template_name="admin_ui/login.html", next_page="admin_ui:overview"
)
_logout = auth_views.LogoutView.as_view(next_page="admin_ui:login")


def login(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponseBase:
    """Log an operator in; then to ``next``, else the overview."""
    return secure_headers(_login(request, *args, **kwargs))


def logout(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponseBase:
    """Log out (POST only, as Django's view), then to the dashboard's login page."""
    return secure_headers(_logout(request, *args, **kwargs))
