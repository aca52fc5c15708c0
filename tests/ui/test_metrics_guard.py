"""``/metrics`` (and ``/ops/metrics``) is never open: a request needs the bearer token
``TENURE_METRICS_TOKEN`` or a logged-in user with the view permission."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

pytestmark = pytest.mark.django_db

URLS = ("/metrics", "/ops/metrics")


@pytest.mark.parametrize("url", URLS)
def test_an_anonymous_scrape_is_refused(client: Client, url: str) -> None:
    r = client.get(url)
    assert r.status_code == 401
    assert r["WWW-Authenticate"].startswith("Bearer")
    assert b"tenure_jobs" not in r.content


@pytest.mark.parametrize("url", URLS)
def test_a_scrape_with_the_token_is_answered(client: Client, settings: Any, url: str) -> None:
    settings.TENURE_METRICS_TOKEN = "s3cret-scraper-token"
    r = client.get(url, HTTP_AUTHORIZATION="Bearer s3cret-scraper-token")
    assert r.status_code == 200
    assert r["Content-Type"].startswith("text/plain")
    assert b"tenure_jobs" in r.content


def test_a_wrong_token_is_refused(client: Client, settings: Any) -> None:
    settings.TENURE_METRICS_TOKEN = "s3cret-scraper-token"
    r = client.get("/metrics", HTTP_AUTHORIZATION="Bearer s3cret-scraper-tokeN")
    assert r.status_code == 401
    assert b"tenure_jobs" not in r.content


def test_no_token_is_accepted_while_none_is_configured(client: Client, settings: Any) -> None:
    settings.TENURE_METRICS_TOKEN = ""
    assert client.get("/metrics", HTTP_AUTHORIZATION="Bearer ").status_code == 401
    assert client.get("/metrics", HTTP_AUTHORIZATION="Bearer x").status_code == 401


def test_a_user_with_the_view_permission_may_scrape(view_client: Client) -> None:
    r = view_client.get("/ops/metrics")
    assert r.status_code == 200
    assert b"tenure_jobs" in r.content


def test_a_user_without_the_view_permission_is_forbidden(client: Client) -> None:
    user = get_user_model().objects.create_user("mallory", password="x")
    client.force_login(user)
    r = client.get("/metrics")
    assert r.status_code == 403
    assert b"tenure_jobs" not in r.content
