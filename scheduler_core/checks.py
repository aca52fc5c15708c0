"""System checks: bad configuration stops start-up with a clear message."""

from __future__ import annotations

import os
from typing import Any

from django.conf import settings
from django.core.checks import Error, Warning, register

from . import conf, failpoints
from .transports import checks as _transport_checks  # noqa: F401  (registers them)


@register()
def check_tenure_settings(app_configs: Any, **kwargs: Any) -> list[Any]:
    """Validate Tenure's settings, the database vendor and failpoints."""
    errors: list[Any] = []
    s = conf.get()
    if s.TRANSPORT not in ("polling", "celery", "rq"):
        errors.append(
            Error(
                f"TENURE_TRANSPORT={s.TRANSPORT!r} is not one of polling, celery, rq",
                id="tenure.E001",
            )
        )
    vendor = settings.DATABASES["default"]["ENGINE"].rsplit(".", 1)[-1]
    if vendor not in ("sqlite3", "postgresql"):
        errors.append(
            Error(f"Tenure supports PostgreSQL and SQLite, not {vendor}", id="tenure.E002")
        )
    if s.REAP_GRACE_SECONDS < 0 or s.HEARTBEAT_FRACTION <= 0 or s.HEARTBEAT_FRACTION >= 0.8:
        errors.append(
            Error(
                "TENURE_REAP_GRACE_SECONDS must be >= 0 and TENURE_HEARTBEAT_FRACTION in (0, 0.8)",
                id="tenure.E003",
            )
        )
    from .registry import check_timeout
    from .store import check_installation_id

    try:
        check_timeout(s.DEFAULT_TIMEOUT_SECONDS, what="TENURE_DEFAULT_TIMEOUT_SECONDS")
    except ValueError as e:
        errors.append(Error(str(e), id="tenure.E005"))
    if s.INSTALLATION_ID:
        try:
            check_installation_id(s.INSTALLATION_ID)
        except ValueError as e:
            errors.append(Error(f"TENURE_INSTALLATION_ID: {e}", id="tenure.E006"))
    spec = os.environ.get("TENURE_FAILPOINTS")
    if spec:
        try:
            failpoints.parse(spec)
            errors.append(
                Warning(f"TENURE_FAILPOINTS is set ({spec}): a testing facility", id="tenure.W001")
            )
        except ValueError as e:
            errors.append(Error(f"TENURE_FAILPOINTS: {e}", id="tenure.E004"))
    if s.TEST_DISABLE_FENCE:
        errors.append(
            Warning(
                "TENURE_TEST_DISABLE_FENCE is on: stale writes are NOT refused", id="tenure.W002"
            )
        )
    return errors
