"""System checks: bad configuration stops start-up with a clear message.

Ids: ``tenure.E001``..``E006`` Tenure's own settings; ``E010``..``E017`` the transports
(:mod:`scheduler_core.transports.checks`); ``E020``..``E023`` Tenure's database and the
connection settings its guarantees need (:mod:`scheduler_core.storage.connection_settings`); ``E030``..``E033``
the ``django.tasks`` backend; ``E040``..``E041`` the dashboard (``admin_ui.checks``).
docs/install.md lists them all (``E004``/``W001``, failpoints, are the verifier app's).
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.checks import Error, register
from django.db import connections

from .api.registry import check_timeout
from .conf import tenure_settings
from .storage import connection_settings
from .storage.drivers import BY_VENDOR
from .storage.records import check_installation_id
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
    errors.extend(_check_database(s.DATABASE))
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


def _check_database(alias: str) -> list[Any]:
    """The database ``TENURE_DATABASE`` names: present, supported, with the connection
    settings the guarantees need that only its ``OPTIONS`` can give."""
    databases = getattr(settings, "DATABASES", {})
    if alias not in databases:
        return [
            Error(
                f"TENURE_DATABASE={alias!r} is not an alias in DATABASES "
                f"({', '.join(sorted(databases)) or 'none'})",
                id="tenure.E020",
            )
        ]
    entry = databases[alias]
    vendor = connections[alias].vendor
    if not tenure_settings().DRIVER and vendor not in BY_VENDOR:
        return [
            Error(
                f"Tenure has drivers for {', '.join(sorted(BY_VENDOR))}, not {vendor} "
                f"(database {alias!r})",
                id="tenure.E002",
            )
        ]
    return [
        Error(f"DATABASES[{alias!r}]: {message}", hint=hint, id=check_id)
        for check_id, message, hint in connection_settings.problems(entry)
    ]
