"""Tenure's pytest plugin: the ``tenure_jobs`` fixture, a
:class:`scheduler_core.testing.JobsUnderTest` for the test. A project's top ``conftest.py``
loads it with ``pytest_plugins = ["scheduler_core.pytest_plugin"]``; it is not loaded on its
own (no entry point), so nothing of Tenure is imported before pytest-django has set Django up.

It asks for pytest-django's ``db``, which gives the test the database in the mode its
``django_db`` mark asks for (a plain ``TestCase`` transaction, or ``transaction=True``);
both work (``docs/howto/testing.md``). Tenure is imported when the fixture is used, once
Django is set up."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from .testing import JobsUnderTest


@pytest.fixture
def tenure_jobs(db: Any) -> JobsUnderTest:
    """Run the jobs a test enqueued on the real path and assert on them:
    ``tenure_jobs.run_pending()``, ``tenure_jobs.assert_enqueued(charge, order=7)``."""
    from .testing import JobsUnderTest

    return JobsUnderTest()
