"""An installation id a restored or cloned database does not silently share, and effect keys
that stay one effect's: the database's identity is recorded with the id (by the migration, or
when the id is made); a database whose identity differs is warned about at start-up
(``tenure.W024``) and in the log of the first key a process makes; ``manage.py installation``
shows both identities, regenerates the id (new effects get new keys, recorded ones keep
theirs) or adopts the identity under the same id; keys recorded in the legacy format keep
being read and matched; a job id that comes again after a sequence reset gets another key.

Each fails on the code before: no identity was recorded or compared, no command existed, and
keys were ``tenure-<installation>-<job id>-<name>`` for any job that had that id."""

from __future__ import annotations

import datetime as dt
import io
import json
import logging
import os
import shutil
import sqlite3
import subprocess
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection

from scheduler_core import job
from scheduler_core.checks import check_installation_identity
from scheduler_core.domain import keys
from scheduler_core.exceptions import ActionRefused
from scheduler_core.models import AuditEntry, Effect, Installation, Job
from scheduler_core.services import installation, reaper
from scheduler_core.storage import installation as storage_installation
from scheduler_core.storage.drivers import driver

from ..conftest import PYTHON, ROOT
from ..conftest import test_database_url as database_url
from .migrating import migrate, migrate_latest

pytestmark = pytest.mark.django_db(transaction=True)

Q = "installation"


@job(name="tests.installation.charge", queue=Q, effect="idempotent", lease_seconds=30)
def charge(ctx: Any) -> None:
    with ctx.effect("charge"):
        pass


def _key_of_new_effect(name: str = "charge") -> tuple[Job, str]:
    """A job whose attempt records effect ``name``; the job and the key."""
    j = charge.enqueue()
    [lease] = driver().claim(executor="t:1:inst", queues=[Q], job_id=j.pk)
    return j, driver().effect_intend(lease, name).key


def _elsewhere() -> dict[str, str]:
    """This database's identity with one part changed, as a copy's would be recorded."""
    current = driver().database_identity()
    part = "database_oid" if current["vendor"] == "postgresql" else "inode"
    return {**current, part: "1"}


def _record(identity: dict[str, str]) -> None:
    driver().installation_id()  # made if a flush emptied the table
    Installation.objects.filter(pk=1).update(identity=identity)


def _warnings() -> list[Any]:
    return check_installation_identity(None, databases=[connection.alias])


def _cli(*args: str) -> str:
    out = io.StringIO()
    call_command("installation", *args, stdout=out)
    return out.getvalue()


# -- the recorded identity and the check ---------------------------------------------------------


def test_the_id_is_made_with_the_databases_identity_and_the_check_is_quiet() -> None:
    Installation.objects.all().delete()
    made = driver().installation_id()
    row = Installation.objects.get(pk=1)
    assert row.key == made
    assert row.identity == driver().database_identity()
    assert row.identity["vendor"] == connection.vendor
    assert row.identity_at is not None
    assert _warnings() == []


def test_a_database_that_is_not_the_one_recorded_is_warned_about(settings: Any) -> None:
    _record(_elsewhere())
    [w] = _warnings()
    assert w.id == "tenure.W024"
    made = Installation.objects.get(pk=1).key
    assert f"not the one installation id {made!r} was made for" in w.msg
    assert "regenerate" in w.msg and "adopt" in w.msg
    # With the setting in force the warning says so: the copy's value must be its own.
    settings.TENURE_INSTALLATION_ID = "prod-eu"
    [w] = _warnings()
    assert "TENURE_INSTALLATION_ID='prod-eu' is in force" in w.msg


def test_the_check_runs_only_where_django_lets_checks_query() -> None:
    _record(_elsewhere())
    assert check_installation_identity(None, databases=None) == []
    assert check_installation_identity(None, databases=["elsewhere"]) == []


def test_the_first_key_a_process_makes_logs_the_same_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    _record(_elsewhere())
    storage_installation._compared.clear()  # as in a process that starts now
    with caplog.at_level(logging.WARNING, logger="tenure.storage"):
        _key_of_new_effect()
        _key_of_new_effect()
    said = [r.getMessage() for r in caplog.records if "tenure installation" in r.getMessage()]
    assert len(said) == 1 and "regenerate" in said[0]


# -- adopt and regenerate ------------------------------------------------------------------------


def test_adopting_records_this_databases_identity_under_the_same_id() -> None:
    _record(_elsewhere())
    before = driver().installation_id()
    change = installation.adopt(actor="cli:ops", reason="moved to a new server")
    assert (change.id_before, change.id_after) == (before, before)
    assert Installation.objects.get(pk=1).identity == driver().database_identity()
    assert _warnings() == []
    audit = AuditEntry.objects.get(pk=change.audit.pk)
    assert (audit.action, audit.job_id, audit.actor) == ("installation_adopt", None, "cli:ops")
    with pytest.raises(ActionRefused, match="nothing to adopt"):
        installation.adopt(actor="cli:ops", reason="again")


def test_regenerating_gives_new_effects_new_keys_and_recorded_ones_keep_theirs() -> None:
    old_id = driver().installation_id()
    j, recorded = _key_of_new_effect()
    _record(_elsewhere())
    change = installation.regenerate(actor="cli:ops", reason="staging clone")
    assert change.id_before == old_id and change.id_after != old_id
    assert change.effects_keeping_keys == Effect.objects.count() == 1
    assert _warnings() == []
    # The recorded effect keeps its key; a new effect, of this job or another, has the new id.
    assert driver().effect_key(j.pk, "charge") == recorded
    assert Effect.objects.get(job=j).key == recorded
    assert driver().effect_key(j.pk, "receipt").startswith(f"tenure2:{change.id_after}:")
    _, fresh = _key_of_new_effect()
    assert fresh.startswith(f"tenure2:{change.id_after}:")
    audit = AuditEntry.objects.get(pk=change.audit.pk)
    assert audit.detail["installation_before"] == old_id
    assert audit.detail["installation_after"] == change.id_after


def test_regenerate_is_refused_while_the_setting_names_the_installation(settings: Any) -> None:
    before = driver().installation_id()
    settings.TENURE_INSTALLATION_ID = "prod-eu"
    with pytest.raises(ActionRefused, match="TENURE_INSTALLATION_ID='prod-eu' sets"):
        installation.regenerate(actor="cli:ops", reason="copy")
    assert Installation.objects.get(pk=1).key == before
    assert not AuditEntry.objects.exists()


@pytest.mark.parametrize(
    ("new_id", "message"), [("a:b", "installation id 'a:b' must be"), ("", "a reason")]
)
def test_a_bad_regenerate_changes_nothing(new_id: str, message: str) -> None:
    before = driver().installation_id()
    with pytest.raises(ActionRefused, match=message):
        installation.regenerate(actor="cli:ops", reason="copy" if new_id else " ", new_id=new_id)
    assert Installation.objects.get(pk=1).key == before
    assert not AuditEntry.objects.exists()


# -- the command ---------------------------------------------------------------------------------


def test_the_command_shows_regenerates_and_adopts() -> None:
    made = driver().installation_id()
    shown = _cli("show")
    assert f"installation id: {made} (from this database)" in shown
    assert "identity: the same" in shown
    _record(_elsewhere())
    shown = json.loads(_cli("show", "--json"))
    assert shown["installation_id"] == made and shown["source"] == "database"
    assert shown["differences"] and "regenerate" in shown["warning"]
    assert shown["current_identity"] == driver().database_identity()
    said = _cli("regenerate", "--reason", "staging clone", "--id", "staging-1")
    assert f"installation id: {made} -> staging-1; new effects get keys with the new id" in said
    assert "recorded effects keep their keys (audit #" in said
    assert "identity: the same" in _cli("show")
    with pytest.raises(CommandError, match="nothing to adopt") as e:
        _cli("adopt", "--reason", "same")
    assert e.value.returncode == 1
    _record(_elsewhere())
    said = _cli("adopt", "--reason", "renamed the database")
    assert "installation id: staging-1 (unchanged)" in said
    assert Installation.objects.get(pk=1).key == "staging-1"


# -- keys ----------------------------------------------------------------------------------------


def test_a_legacy_key_keeps_being_read_and_matched() -> None:
    """A ledger row recorded before the version marker keeps its key through every attempt."""
    j, _ = _key_of_new_effect()
    legacy = f"tenure-{driver().installation_id()}-{j.pk}-charge"
    Effect.objects.filter(job=j).update(key=legacy)
    assert driver().effect_key(j.pk, "charge") == legacy
    lease = driver().lease_of(Job.objects.get(pk=j.pk))
    assert driver().effect_settle(lease, legacy, Effect.UNKNOWN) == Effect.UNKNOWN
    Job.objects.filter(pk=j.pk).update(lease_expires_at=driver().now() - dt.timedelta(seconds=60))
    assert reaper.reap_once()["reap_retry"] == 1
    Job.objects.filter(pk=j.pk).update(run_at=dt.datetime(2000, 1, 1, tzinfo=dt.UTC))
    [again] = driver().claim(executor="t:2:inst", queues=[Q], job_id=j.pk)
    row = driver().effect_intend(again, "charge")
    assert (row.key, row.intents, row.in_doubt) == (legacy, 2, True)
    assert driver().effect_settle(again, legacy, Effect.APPLIED) == Effect.APPLIED


def test_a_job_id_that_comes_again_after_a_sequence_reset_gets_another_key() -> None:
    j, first = _key_of_new_effect()
    Job.objects.filter(pk=j.pk).delete()
    with connection.cursor() as cur:
        if connection.vendor == "postgresql":
            cur.execute(
                "SELECT setval(pg_get_serial_sequence('tenure_job', 'id'), %s, false)", [j.pk]
            )
        else:
            cur.execute("UPDATE sqlite_sequence SET seq = %s WHERE name = 'tenure_job'", [j.pk - 1])
    time.sleep(0.002)  # the database's clock has moved on, as it has after any reset
    again, second = _key_of_new_effect()
    assert again.pk == j.pk
    assert second != first
    assert keys.parse_effect_key(first).job_id == keys.parse_effect_key(second).job_id  # type: ignore[union-attr]


# -- the migration -------------------------------------------------------------------------------


def test_0020_records_the_identity_of_the_database_it_runs_on(latest: None) -> None:
    migrate([("scheduler_core", "0017_open_attempt_table")])
    with connection.cursor() as cur:
        cur.execute("DELETE FROM tenure_installation")
        cur.execute(
            "INSERT INTO tenure_installation (id, key, created_at) VALUES (1, 'before0020', %s)",
            ["2026-01-01 00:00:00"],
        )
    migrate_latest()
    row = Installation.objects.get(pk=1)
    assert row.key == "before0020"
    assert row.identity == driver().database_identity() != {}


# -- a real copy ---------------------------------------------------------------------------------


def _manage(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, DATABASE_URL=url, DJANGO_SETTINGS_MODULE="config.settings")
    env["PYTHONPATH"] = str(ROOT)
    return subprocess.run(
        [PYTHON, str(ROOT / "manage.py"), *args],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )


def _copy_database(tmp_path: Path) -> tuple[str, Any]:
    """A copy of the test database (PostgreSQL: ``CREATE DATABASE ... TEMPLATE``; SQLite: the
    backup API into another file); its URL and how to remove it."""
    url = database_url()
    if connection.vendor == "sqlite":
        target = tmp_path / "copy.sqlite3"
        src = sqlite3.connect(connection.settings_dict["NAME"])
        dst = sqlite3.connect(target)
        src.backup(dst)
        src.close()
        dst.close()
        return f"sqlite:///{target}", lambda: shutil.rmtree(tmp_path, ignore_errors=True)
    source = connection.settings_dict["NAME"]
    copy = f"{source}_clone"
    s = connection.settings_dict
    admin = f"host={s['HOST']} port={s['PORT']} user={s['USER']} dbname=postgres"
    connection.close()
    with psycopg.connect(admin, autocommit=True) as c:
        c.execute(f'DROP DATABASE IF EXISTS "{copy}"')
        for _ in range(50):
            try:
                c.execute(f'CREATE DATABASE "{copy}" TEMPLATE "{source}"')
                break
            except psycopg.errors.ObjectInUse:
                time.sleep(0.2)  # a session of another test still closing
        else:
            raise AssertionError(f"{source} stayed in use")

    def drop() -> None:
        with psycopg.connect(admin, autocommit=True) as c:
            c.execute(f'DROP DATABASE IF EXISTS "{copy}" WITH (FORCE)')

    return url.rsplit("/", 1)[0] + f"/{copy}", drop


@pytest.mark.process
def test_a_copied_database_is_warned_about_at_start_up_until_it_is_given_an_id(
    tmp_path: Path,
) -> None:
    made = driver().installation_id()
    url, remove = _copy_database(tmp_path)
    try:
        shown = json.loads(_manage(url, "installation", "show", "--json").stdout)
        assert shown["installation_id"] == made  # the copy carries the original's id...
        assert shown["differences"]  # ...but knows it is not the database it was made for
        started = _manage(url, "run_scheduler", "--once")
        assert started.returncode == 0, started.stderr
        assert "tenure.W024" in started.stderr
        said = _manage(url, "installation", "regenerate", "--reason", "staging clone")
        assert said.returncode == 0, said.stderr
        assert f"installation id: {made} -> " in said.stdout
        shown = json.loads(_manage(url, "installation", "show", "--json").stdout)
        assert shown["installation_id"] != made and not shown["differences"]
        again = _manage(url, "check", "--database", "default")
        assert "tenure.W024" not in again.stderr, again.stderr
    finally:
        remove()
    assert driver().installation_id() == made  # the original is untouched
