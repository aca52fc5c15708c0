"""The example project's ``DATABASE_URL`` is read with dj-database-url (``config/settings.py``),
and the entry it makes carries the options Tenure's checks require."""

from __future__ import annotations

import pytest

from config.settings import BASE_DIR, database_from_url


def test_a_postgres_url_keeps_its_own_parameters_beside_tenures_options() -> None:
    entry = database_from_url("postgresql://shop:p%40ss@db.internal:6543/orders?sslmode=require")
    assert entry["ENGINE"] == "django.db.backends.postgresql"
    assert (entry["NAME"], entry["USER"], entry["PASSWORD"]) == ("orders", "shop", "p@ss")
    assert (entry["HOST"], int(entry["PORT"])) == ("db.internal", 6543)
    assert entry["OPTIONS"]["sslmode"] == "require"
    assert entry["OPTIONS"]["tcp_user_timeout"] == 10000 and entry["OPTIONS"]["keepalives"] == 1
    # The URL's own value of an option wins over the project's default.
    assert (
        database_from_url("postgres://u@h/d?connect_timeout=2")["OPTIONS"]["connect_timeout"] == 2
    )


def test_a_relative_sqlite_path_is_under_the_checkout_and_takes_the_write_lock_at_begin() -> None:
    entry = database_from_url("sqlite:///var/example.sqlite3")
    assert entry["NAME"] == str(BASE_DIR / "var" / "example.sqlite3")
    assert entry["OPTIONS"]["transaction_mode"] == "IMMEDIATE"
    assert database_from_url("sqlite:////tmp/x.sqlite3")["NAME"] == "/tmp/x.sqlite3"


@pytest.mark.parametrize("url", ["mysql://u@h/d", "redis://127.0.0.1:6379/0"])
def test_a_database_tenure_does_not_run_on_is_refused_by_name(url: str) -> None:
    with pytest.raises(ValueError, match=url.partition(":")[0]):
        database_from_url(url)


def test_a_url_naming_a_primary_and_its_standby_keeps_every_host_for_libpq() -> None:
    entry = database_from_url(
        "postgres://app@db1.internal:5432,db2.internal:6432/orders?target_session_attrs=read-write"
    )
    assert (entry["HOST"], entry["PORT"], entry["NAME"]) == (
        "db1.internal,db2.internal",
        "5432,6432",
        "orders",
    )
    assert entry["USER"] == "app"
    assert entry["OPTIONS"]["target_session_attrs"] == "read-write"
    assert database_from_url("postgres://app@h1,h2/d")["PORT"] == "5432,5432"
