"""Fixtures of the database tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from .migrating import latest_after


@pytest.fixture
def latest() -> Iterator[None]:
    """The latest schema after the test, whatever it migrated to (the migration tests)."""
    with latest_after():
        yield
