"""Moving the test database's schema to a named migration and back to the latest, for the tests
of a migration's forwards and backwards steps."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from django.db import connection
from django.db.migrations.executor import MigrationExecutor


def migrate(target: list[tuple[str, str]]) -> None:
    """The schema as ``target`` (app label, migration name) leaves it."""
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate(target)


def migrate_latest() -> None:
    """The latest schema."""
    migrate(MigrationExecutor(connection).loader.graph.leaf_nodes("scheduler_core"))


@contextmanager
def latest_after() -> Iterator[None]:
    """Whatever the body migrates to, the latest schema again after it."""
    try:
        yield
    finally:
        migrate_latest()
