"""Which driver speaks to Tenure's database: chosen once per database alias from the
connection's vendor (``TENURE_DRIVER`` may name another class, for a deployment's own
subclass), and the accessor every layer above storage uses, :func:`driver`."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from django.db import connections
from django.utils.module_loading import import_string

from ..conf import tenure_settings
from ..db import alias as tenure_alias
from .base import Driver
from .contract import StorageDriver

if TYPE_CHECKING:
    # The type checker holds both drivers to the contract (tests/storage/test_contract.py
    # checks the same at run time).
    from .postgres import PostgresDriver
    from .sqlite import SqliteDriver

    _postgres: type[StorageDriver] = PostgresDriver
    _sqlite: type[StorageDriver] = SqliteDriver

BY_VENDOR: dict[str, str] = {
    "postgresql": "scheduler_core.storage.postgres.PostgresDriver",
    "sqlite": "scheduler_core.storage.sqlite.SqliteDriver",
}
"""The driver of each database Tenure supports, by Django's vendor name. Loaded by name when
first needed: the PostgreSQL driver imports psycopg, which a project on SQLite need not
install."""

_drivers: dict[tuple[str, str], Driver] = {}
_lock = threading.Lock()


def driver(alias: str | None = None) -> StorageDriver:
    """The driver of ``alias`` (default: Tenure's, ``TENURE_DATABASE``), made once per
    process; the layers above see only its contract (:class:`.contract.StorageDriver`)."""
    s = tenure_settings()
    alias = alias or tenure_alias()
    key = (alias, s.DRIVER)
    found = _drivers.get(key)
    if found is not None:
        return found
    with _lock:
        found = _drivers.get(key)
        if found is None:
            found = _drivers[key] = _make(alias, s.DRIVER)
    return found


def _make(alias: str, dotted: str) -> Driver:
    if dotted:
        cls = import_string(dotted)
        if not (isinstance(cls, type) and issubclass(cls, Driver)):
            raise TypeError(f"TENURE_DRIVER={dotted!r} is not a storage driver class")
        return cls(alias)
    vendor = connections[alias].vendor
    try:
        dotted = BY_VENDOR[vendor]
    except KeyError:
        raise NotImplementedError(
            f"Tenure supports PostgreSQL and SQLite, not {vendor} (database {alias!r})"
        ) from None
    cls = import_string(dotted)
    return cls(alias)  # type: ignore[no-any-return]
