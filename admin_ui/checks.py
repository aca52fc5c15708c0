"""System checks of the operator dashboard: the apps and middleware ``/ops/`` relies on.

* ``tenure.E040`` — an app the dashboard needs is not in ``INSTALLED_APPS``: Django's auth,
  contenttypes, sessions and messages, ``django_htmx`` (it serves htmx as a static file) and,
  on Django 5.2 only, ``template_partials`` (an htmx request renders a named partial of a
  page's template; Django 6 has partials itself).
* ``tenure.E041`` — a middleware the dashboard needs is not in ``MIDDLEWARE``: sessions and
  authentication (operators log in), messages (an action says what it did), CSRF (every
  action is a POST).
"""

from __future__ import annotations

from importlib.util import find_spec
from typing import Any

import django
from django.apps import apps
from django.conf import settings
from django.core.checks import Error, register
from django.utils.module_loading import import_string

REQUIRED_APPS = (
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django_htmx",
    *(("template_partials",) if django.VERSION < (6, 0) else ()),
)
REQUIRED_MIDDLEWARE = (
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
)


@register()
def check_dashboard_dependencies(app_configs: Any, **kwargs: Any) -> list[Error]:
    """Name each app and middleware the dashboard needs that the project lacks."""
    errors: list[Error] = []
    missing = [name for name in REQUIRED_APPS if not apps.is_installed(name)]
    if missing:
        errors.append(
            Error(
                f"the Tenure dashboard (admin_ui) needs {', '.join(repr(m) for m in missing)} "
                "in INSTALLED_APPS",
                hint=f"Add INSTALLED_APPS += {missing!r} (see docs/install.md).{_install_hint()}",
                id="tenure.E040",
            )
        )
    middleware = list(getattr(settings, "MIDDLEWARE", None) or [])
    absent = [name for name in REQUIRED_MIDDLEWARE if not _has(middleware, name)]
    if absent:
        errors.append(
            Error(
                f"the Tenure dashboard (admin_ui) needs {', '.join(absent)} in MIDDLEWARE",
                hint="A project made by `django-admin startproject` has them all.",
                id="tenure.E041",
            )
        )
    return errors


def _install_hint() -> str:
    # Python 3.11 brings the package with Tenure; Django 5.2 on a later Python needs an extra.
    if "template_partials" in REQUIRED_APPS and find_spec("template_partials") is None:
        return (
            " django-template-partials is not installed: on Django 5.2 with Python 3.12 or "
            "later, pip install 'tenure[django52]'."
        )
    return ""


def _has(middleware: list[str], required: str) -> bool:
    """Whether ``middleware`` holds ``required`` or a subclass of it (as Django's admin asks)."""
    wanted = import_string(required)
    for path in middleware:
        try:
            found = import_string(path)
        except ImportError:
            continue
        if isinstance(found, type) and issubclass(found, wanted):
            return True
    return False
