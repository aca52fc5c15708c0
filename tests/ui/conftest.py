"""Fixtures for dashboard tests: users with and without the operate permission."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client

from . import factories


@pytest.fixture
def operator(db: Any) -> Any:
    return factories.user("olivia", operate=True)


@pytest.fixture
def viewer(db: Any) -> Any:
    return factories.user("victor", operate=False)


@pytest.fixture
def op_client(operator: Any) -> Client:
    c = Client()
    c.force_login(operator)
    return c


@pytest.fixture
def view_client(viewer: Any) -> Client:
    c = Client()
    c.force_login(viewer)
    return c
