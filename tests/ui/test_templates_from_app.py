"""The dashboard's templates come from the ``admin_ui`` app itself, so a host project with no
``TEMPLATES["DIRS"]`` (and no copy of Tenure's templates) renders every page."""

from __future__ import annotations

from typing import Any

import django
import pytest
from django.template import engines
from django.template.loader import get_template
from django.test import Client

from scheduler_core import job
from scheduler_core.models import Job


@job(name="tests.templates.noop", queue="templates-from-app")
def noop(ctx: Any) -> None:
    """A job to show on the detail page."""


# What a project made by `django-admin startproject` has, with no directory of its own; on
# Django 5.2 with the partials loader that the ``template_partials`` app puts in front of the
# app loader (Django 6 resolves "page.html#partial" itself).
APP_LOADER = "django.template.loaders.app_directories.Loader"
HOST_TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
            "loaders": [
                APP_LOADER
                if django.VERSION >= (6, 0)
                else ("template_partials.loader.Loader", [APP_LOADER])
            ],
        },
    }
]


@pytest.fixture
def host_templates(settings: Any) -> None:
    settings.TEMPLATES = HOST_TEMPLATES


def test_dashboard_templates_are_found_in_the_app_without_template_dirs(
    host_templates: None,
) -> None:
    origin = get_template("admin_ui/base.html").origin.name
    assert "/admin_ui/templates/admin_ui/base.html" in origin
    assert engines["django"].dirs == []  # type: ignore[attr-defined]


@pytest.mark.django_db
def test_every_dashboard_page_renders_without_template_dirs(
    host_templates: None, op_client: Client
) -> None:
    pk = noop.enqueue().pk
    for url in ("/ops/", "/ops/jobs/", f"/ops/jobs/{pk}/", f"/ops/jobs/{pk}/cancel/confirm/"):
        r = op_client.get(url)
        assert r.status_code == 200, (url, r.status_code)
        assert b"Tenure" in r.content, url
    # A partial (what an htmx request gets) comes from the same template in the app.
    r = op_client.get("/ops/", HTTP_HX_REQUEST="true")
    assert r.status_code == 200
    assert b"<html" not in r.content
    assert Job.objects.filter(pk=pk, state="waiting").exists()


@pytest.mark.django_db
def test_the_dashboard_renders_when_ops_is_the_projects_only_url(
    settings: Any, op_client: Client
) -> None:
    settings.ROOT_URLCONF = "tests.urls_ops_only"
    pk = noop.enqueue().pk
    for url in ("/ops/", f"/ops/jobs/{pk}/"):
        r = op_client.get(url)
        assert r.status_code == 200, url
        assert b'action="/ops/logout/"' in r.content  # the dashboard's own logout
    assert op_client.get("/ops/metrics").status_code == 200


@pytest.mark.django_db
def test_the_log_out_button_posts_to_the_projects_logout_view(op_client: Client) -> None:
    r = op_client.get("/ops/")
    assert b'action="/accounts/logout/"' in r.content
