"""Which differences between a database's recorded and current identity say it is a copy: a
dump restored into another cluster or database, a copied or moved SQLite file — and which do
not: a streaming standby promoted after a failover (same cluster, same database), or an
identity one side could not read."""

from __future__ import annotations

from scheduler_core.domain.installation import (
    identity_differences,
    mismatch_text,
    new_installation_id,
)

PRIMARY = {
    "vendor": "postgresql",
    "system_identifier": "7716282284392753393",
    "database_oid": "16388",
    "database": "tenure",
}


def test_a_promoted_standby_is_the_same_installation() -> None:
    # A physical standby shares the cluster's system identifier and every database's oid.
    assert identity_differences(PRIMARY, dict(PRIMARY)) == []


def test_a_dump_restored_into_another_cluster_differs_by_its_system_identifier() -> None:
    restored = {**PRIMARY, "system_identifier": "7716999999999999999", "database_oid": "16390"}
    found = identity_differences(PRIMARY, restored)
    assert len(found) == 2
    assert "another PostgreSQL cluster" in found[0]
    assert "another database of this cluster" in found[1]


def test_a_copy_in_the_same_cluster_differs_by_its_oid_and_name() -> None:
    copy = {**PRIMARY, "database_oid": "16400", "database": "tenure_staging"}
    found = identity_differences(PRIMARY, copy)
    assert [f.split(":")[0] for f in found] == [
        "another database of this cluster (restored from a dump, copied with CREATE DATABASE "
        "... TEMPLATE, or dropped and created again)",
        "a database of another name (a copy, or this one renamed)",
    ]


def test_a_sqlite_file_copied_or_replaced_differs() -> None:
    recorded = {"vendor": "sqlite", "file": "/srv/var/tenure.sqlite3", "inode": "11"}
    moved = {**recorded, "file": "/srv/staging/tenure.sqlite3", "inode": "12"}
    replaced = {**recorded, "inode": "13"}
    assert len(identity_differences(recorded, moved)) == 2
    assert [f.split(" (")[0] for f in identity_differences(recorded, replaced)] == [
        "another file at the same path"
    ]


def test_what_one_side_could_not_read_is_not_compared() -> None:
    assert identity_differences({}, PRIMARY) == []
    assert identity_differences(PRIMARY, {}) == []
    without = {k: v for k, v in PRIMARY.items() if k != "system_identifier"}
    assert identity_differences(PRIMARY, without) == []
    other = identity_differences(PRIMARY, {"vendor": "sqlite", "file": "/x"})
    assert other == ["another kind of database (postgresql recorded, sqlite now)"]


def test_the_warning_says_what_to_do_and_what_the_setting_changes() -> None:
    said = mismatch_text(in_force="a1b2", configured=False, differences=["x"])
    assert "regenerate" in said and "adopt" in said and "'a1b2'" in said
    said = mismatch_text(in_force="prod-eu", configured=True, differences=["x"])
    assert "TENURE_INSTALLATION_ID='prod-eu' is in force" in said and "adopt" in said


def test_a_new_id_is_never_the_old_one() -> None:
    made = {new_installation_id(avoid="abc") for _ in range(50)}
    assert "abc" not in made and all(len(m) == 12 for m in made)
