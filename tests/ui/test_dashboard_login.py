"""The dashboard's own login and logout (``admin_ui/accounts.py``): a project whose only URL
is ``include("admin_ui.urls")`` and whose ``LOGIN_URL`` is ``"admin_ui:login"`` lets its
operators in (docs/install.md, "URLs"), and a login URL given by name is where an htmx request
is sent."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client

from tests.ui import factories


@pytest.fixture
def ops_only(settings: Any) -> None:
    settings.ROOT_URLCONF = "tests.urls_ops_only"
    settings.LOGIN_URL = "admin_ui:login"


@pytest.mark.django_db
def test_an_operator_logs_in_and_out_through_the_dashboards_own_pages(ops_only: None) -> None:
    factories.user("olga", operate=True)
    c = Client(enforce_csrf_checks=True)
    r = c.get("/ops/jobs/")
    assert r.status_code == 302 and r["Location"] == "/ops/login/?next=/ops/jobs/"
    page = c.get(r["Location"])
    assert page.status_code == 200
    assert b'action="/ops/login/"' in page.content and b'value="/ops/jobs/"' in page.content
    assert page["Content-Security-Policy"]
    token = page.cookies["csrftoken"].value
    wrong = c.post(
        "/ops/login/", {"username": "olga", "password": "wrong", "csrfmiddlewaretoken": token}
    )
    assert wrong.status_code == 200 and c.get("/ops/").status_code == 302
    done = c.post(
        "/ops/login/",
        {
            "username": "olga",
            "password": factories.PASSWORD,
            "next": "/ops/jobs/",
            "csrfmiddlewaretoken": token,
        },
    )
    assert done.status_code == 302 and done["Location"] == "/ops/jobs/"
    home = c.get("/ops/")
    assert home.status_code == 200 and b'action="/ops/logout/"' in home.content
    token = c.cookies["csrftoken"].value
    assert c.get("/ops/logout/").status_code == 405  # logging out is a POST
    out = c.post("/ops/logout/", {"csrfmiddlewaretoken": token})
    assert out.status_code == 302 and out["Location"] == "/ops/login/"
    assert c.get("/ops/").status_code == 302


@pytest.mark.django_db
def test_a_login_without_next_lands_on_the_overview(ops_only: None) -> None:
    factories.user("oscar", operate=False)
    c = Client()
    r = c.post("/ops/login/", {"username": "oscar", "password": factories.PASSWORD})
    assert r.status_code == 302 and r["Location"] == "/ops/"


@pytest.mark.django_db
def test_an_htmx_request_is_sent_to_a_login_url_given_by_name(ops_only: None) -> None:
    r = Client().get("/ops/", HTTP_HX_REQUEST="true")
    assert r["HX-Redirect"] == "/ops/login/"
