"""System checks: bad configuration stops start-up with a clear message.

Ids: ``tenure.E001``..``E006`` Tenure's own settings; ``E010``..``E017`` the transports
(:mod:`scheduler_core.transports.checks`); ``E020``..``E023`` Tenure's database and the
connection settings its guarantees need (:mod:`scheduler_core.connsettings`); ``E030``..``E033``
the ``django.tasks`` backend; ``E040``..``E041`` the dashboard (``admin_ui.checks``);
``W001``..``W002`` testing facilities left on. docs/install.md lists them all.
"""

from __future__ import annotations

import os
from typing import Any

from django.conf import settings
from django.core.checks import Error, Warning, register

from . import conf, connsettings, failpoints
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
    errors.extend(_check_database(s.DATABASE))
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
    vendor = str(entry.get("ENGINE", "")).rsplit(".", 1)[-1]
    if vendor not in ("sqlite3", "postgresql"):
        return [Error(f"Tenure supports PostgreSQL and SQLite, not {vendor}", id="tenure.E002")]
    return [
        Error(f"DATABASES[{alias!r}]: {message}", hint=hint, id=check_id)
        for check_id, message, hint in connsettings.problems(entry)
    ]
