"""System checks: bad configuration stops start-up with a clear message."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.checks import Error, register
from django.db import connections

from .api.registry import check_timeout
from .conf import tenure_settings
from .storage.base import check_installation_id
from .storage.drivers import BY_VENDOR
from .transports import checks as _transport_checks  # noqa: F401  (registers them)


@register()
def check_tenure_settings(app_configs: Any, **kwargs: Any) -> list[Any]:
    """Validate Tenure's settings and that its database has a driver."""
    errors: list[Any] = []
    s = tenure_settings()
    if s.TRANSPORT not in ("polling", "celery", "rq"):
        errors.append(
            Error(
                f"TENURE_TRANSPORT={s.TRANSPORT!r} is not one of polling, celery, rq",
                id="tenure.E001",
            )
        )
    if s.DATABASE not in settings.DATABASES:
        errors.append(
            Error(f"TENURE_DATABASE={s.DATABASE!r} is not in DATABASES", id="tenure.E002")
        )
    elif not s.DRIVER and connections[s.DATABASE].vendor not in BY_VENDOR:
        errors.append(
            Error(
                f"Tenure has drivers for {', '.join(sorted(BY_VENDOR))}, not "
                f"{connections[s.DATABASE].vendor} (database {s.DATABASE!r})",
                id="tenure.E002",
            )
        )
    if s.REAP_GRACE_SECONDS < 0 or s.HEARTBEAT_FRACTION <= 0 or s.HEARTBEAT_FRACTION >= 0.8:
        errors.append(
            Error(
                "TENURE_REAP_GRACE_SECONDS must be >= 0 and TENURE_HEARTBEAT_FRACTION in (0, 0.8)",
                id="tenure.E003",
            )
        )
    try:
        check_timeout(s.DEFAULT_TIMEOUT_SECONDS, what="TENURE_DEFAULT_TIMEOUT_SECONDS")
    except ValueError as e:
        errors.append(Error(str(e), id="tenure.E005"))
    if s.INSTALLATION_ID:
        try:
            check_installation_id(s.INSTALLATION_ID)
        except ValueError as e:
            errors.append(Error(f"TENURE_INSTALLATION_ID: {e}", id="tenure.E006"))
    return errors
