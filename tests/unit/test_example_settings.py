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
