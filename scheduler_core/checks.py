"""System checks: bad configuration stops start-up with a clear message.

Ids: ``tenure.E001``..``E006`` Tenure's own settings; ``E010``..``E017`` the transports
(:mod:`scheduler_core.transports.checks`); ``E020``..``E023`` Tenure's database and the
connection settings its guarantees need (:mod:`scheduler_core.storage.connection_settings`);
``W024`` a database that is not the one its installation id was made for (a database check:
it runs where Django lets checks query, ``migrate`` and ``check --database``, and where
``run_executor`` and ``run_scheduler`` start); ``E030``..``E033``
the ``django.tasks`` backend; ``E040``..``E041`` the dashboard (``admin_ui.checks``).
docs/install.md lists them all (``E004``/``W001``, failpoints, are the verifier app's).
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.checks import Error, Tags, register
from django.core.checks import Warning as CheckWarning
from django.db import DatabaseError, connections

from .api.registry import check_timeout
from .conf import tenure_settings
from .db import alias as tenure_alias
from .domain.installation import check_installation_id
from .services import installation
from .storage import connection_settings
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


@register(Tags.database)
def check_installation_identity(
    app_configs: Any, databases: Any = None, **kwargs: Any
) -> list[Any]:
    """Warn (``tenure.W024``) when Tenure's database is not the one its installation id was
    recorded for: a restored or cloned copy that would send the original's effect keys."""
    if not databases or tenure_alias() not in databases:
        return []
    if check_tenure_settings(app_configs):
        return []  # a setting is wrong already; its error says what
    try:
        found = installation.status(count_effects=False)
    except DatabaseError:
        return []  # not migrated yet, or not reachable: nothing recorded to compare
    if not found.warning:
        return []
    return [
        CheckWarning(
            found.warning,
            hint='docs/operations.md, "Restoring or cloning a database"',
            id="tenure.W024",
        )
    ]
