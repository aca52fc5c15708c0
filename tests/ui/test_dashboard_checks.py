"""The dashboard needs no middleware of django-htmx's, and a project that lacks an app or a
middleware ``/ops/`` relies on is told which at start-up (``tenure.E040``, ``tenure.E041``)."""

from __future__ import annotations

import importlib.util
import sys
from typing import Any

import django
import pytest
from django.test import Client

from admin_ui.checks import REQUIRED_APPS
from tests.conftest import manage_variant


@pytest.mark.process
def test_check_names_the_apps_the_dashboard_needs() -> None:
    done = manage_variant("check", TEST_WITHOUT_APPS="template_partials,django_htmx")
    assert done.returncode != 0
    assert "tenure.E040" in done.stderr, done.stderr
    if django.VERSION >= (6, 0):  # Django's own partials: the package is not asked for
        assert "needs 'django_htmx' in INSTALLED_APPS" in done.stderr, done.stderr
    else:
        assert "'django_htmx', 'template_partials'" in done.stderr


@pytest.mark.skipif(django.VERSION < (6, 0), reason="Django 5.2 takes partials from the package")
def test_on_django_6_the_dashboard_uses_djangos_own_partials() -> None:
    """Nothing of django-template-partials is installed, asked for or imported on Django 6."""
    assert importlib.util.find_spec("template_partials") is None
    assert "template_partials" not in REQUIRED_APPS
    assert not [m for m in sys.modules if m.startswith("template_partials")]


@pytest.mark.django_db
def test_an_htmx_request_gets_the_partial_without_htmx_middleware(
    settings: Any, op_client: Client
) -> None:
    settings.MIDDLEWARE = [m for m in settings.MIDDLEWARE if "django_htmx" not in m]
    whole = op_client.get("/ops/")
    part = op_client.get("/ops/", HTTP_HX_REQUEST="true")
    restore = op_client.get("/ops/", HTTP_HX_REQUEST="true", HTTP_HX_HISTORY_RESTORE_REQUEST="true")
    assert b"<html" in whole.content
    assert part.status_code == 200 and b"<html" not in part.content
    assert b"<html" in restore.content
    assert part["Vary"] == "HX-Request" or "HX-Request" in part["Vary"]


@pytest.mark.django_db
def test_an_anonymous_htmx_request_is_told_to_go_to_the_login_page(client: Client) -> None:
    r = client.get("/ops/", HTTP_HX_REQUEST="true")
    assert r.status_code == 200
    assert r["HX-Redirect"].startswith("/accounts/login/")
