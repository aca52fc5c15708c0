"""Migration 0013 gives the tables every job writes several versions of a vacuum after a fixed
count of dead versions on PostgreSQL, and gives them back to the server's settings when reversed."""

from __future__ import annotations

import pytest
from django.db import connection

from .migrating import migrate

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(connection.vendor != "postgresql", reason="PostgreSQL's table settings"),
]

TABLES = ("tenure_job", "tenure_attempt", "tenure_effect")
EXPECTED = {"autovacuum_vacuum_scale_factor=0", "autovacuum_vacuum_threshold=5000"}


def _options() -> dict[str, set[str]]:
    with connection.cursor() as cur:
        cur.execute(
            "SELECT relname, coalesce(reloptions, '{}') FROM pg_class "
            "WHERE relname = ANY(%s) AND relkind = 'r'",
            [list(TABLES)],
        )
        return {name: set(opts) for name, opts in cur.fetchall()}


def test_the_hot_tables_vacuum_after_a_fixed_count_and_reversing_resets_them(
    latest: None,
) -> None:
    assert _options() == {t: EXPECTED for t in TABLES}
    migrate([("scheduler_core", "0012_job_spec")])
    assert _options() == {t: set() for t in TABLES}
    migrate([("scheduler_core", "0013_autovacuum_settings")])
    assert _options() == {t: EXPECTED for t in TABLES}


def test_the_other_tables_keep_the_servers_settings() -> None:
    with connection.cursor() as cur:
        cur.execute(
            "SELECT relname FROM pg_class WHERE relname LIKE 'tenure%%' AND relkind = 'r' "
            "AND reloptions IS NOT NULL"
        )
        assert sorted(r[0] for r in cur.fetchall()) == sorted(TABLES)
