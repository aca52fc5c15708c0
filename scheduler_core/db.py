"""Which database Tenure uses: the one helper every module asks for the alias and its connection.

``TENURE_DATABASE`` (default ``"default"``) names the ``DATABASES`` entry that holds Tenure's
tables. Every read and write of Tenure's goes there: the write seam's statements
(``store.DB``), the models' managers, raw cursors (:data:`connection`), transactions and the
connection settings the guarantees need (:mod:`scheduler_core.storage.connection_settings`). The alias is read
once per process, when Tenure first asks for it, and kept.

A host that keeps Tenure's tables in their own database may add :class:`TenureRouter` to
``DATABASE_ROUTERS`` so that ``migrate`` creates them only there; Tenure needs no router to
read and write them.
"""

from __future__ import annotations

from typing import Any, cast

from django.db import connections
from django.db.backends.base.base import BaseDatabaseWrapper

from .conf import tenure_settings

_alias: str | None = None


def alias() -> str:
    """The ``DATABASES`` alias of Tenure's tables (``TENURE_DATABASE``), read once."""
    global _alias
    if _alias is None:
        _alias = str(tenure_settings().DATABASE)
    return _alias


class _TenureConnection:
    """The connection of :func:`alias` in this thread, as ``django.db.connection`` is the
    default alias's: attribute reads and writes go to ``connections[alias()]``."""

    def __getattr__(self, item: str) -> Any:
        return getattr(connections[alias()], item)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(connections[alias()], name, value)

    def __delattr__(self, name: str) -> None:
        delattr(connections[alias()], name)

    def __eq__(self, other: object) -> bool:
        return bool(connections[alias()] == other)

    def __hash__(self) -> int:
        return hash(connections[alias()])


connection = cast(BaseDatabaseWrapper, _TenureConnection())
"""Tenure's database connection in this thread (``connections[alias()]``)."""


class TenureRouter:
    """Optional ``DATABASE_ROUTERS`` entry: Tenure's migrations run only on Tenure's alias.

    Without it ``migrate`` creates Tenure's tables in every database it is run on; reads and
    writes go to :func:`alias` either way.
    """

    def allow_migrate(self, db: str, app_label: str, **hints: Any) -> bool | None:
        """Tenure's tables only on its alias; no opinion about any other app."""
        if app_label == "scheduler_core":
            return db == alias()
        return None
