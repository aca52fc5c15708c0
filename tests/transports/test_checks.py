"""Start-up checks refuse a broker configuration that would unpickle or lose hints."""

from __future__ import annotations

from typing import Any

import pytest
from django.core.checks import run_checks


def ids(settings: Any, **overrides: Any) -> set[str]:
    for name, value in overrides.items():
        setattr(settings, name, value)
    return {m.id for m in run_checks() if m.id.startswith("tenure.E01")}


@pytest.mark.parametrize("transport", ["polling", "celery"])
def test_shipped_settings_pass(settings: Any, transport: str) -> None:
    assert ids(settings, TENURE_TRANSPORT=transport) == set()


def test_rq_with_every_queue_configured_passes(settings: Any) -> None:
    assert ids(settings, TENURE_TRANSPORT="rq", RQ_QUEUES=_every_queue(settings)) == set()


def test_celery_accepting_pickle_is_an_error(settings: Any) -> None:
    found = ids(settings, TENURE_TRANSPORT="celery", CELERY_ACCEPT_CONTENT=["json", "pickle"])
    assert found == {"tenure.E010"}


def test_rq_queue_missing_from_rq_queues_is_an_error(settings: Any) -> None:
    assert ids(settings, TENURE_TRANSPORT="rq", RQ_QUEUES={}) == {"tenure.E011"}


def test_rq_with_a_prefix_needs_prefixed_queues(settings: Any) -> None:
    assert ids(settings, TENURE_TRANSPORT="rq", TENURE_BROKER_QUEUE_PREFIX="x-") == {"tenure.E011"}


def _every_queue(settings: Any) -> dict[str, Any]:
    """RQ_QUEUES with an entry for every registered job type's queue (whatever tests ran)."""
    from scheduler_core.api import registry

    entry = dict(settings.RQ_QUEUES["default"])
    return {jt.queue: entry for jt in registry.all_types().values()}


def test_rq_without_tenures_worker_class_is_an_error(settings: Any) -> None:
    found = ids(
        settings,
        TENURE_TRANSPORT="rq",
        RQ_QUEUES=_every_queue(settings),
        RQ={"WORKER_CLASS": "rq.Worker"},
    )
    assert found == {"tenure.E012"}


def test_rq_dashboard_is_not_mounted() -> None:
    from django.contrib import admin
    from django_rq.models import Dashboard

    assert Dashboard not in admin.site._registry
