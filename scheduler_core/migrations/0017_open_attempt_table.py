"""One active attempt is held by a table of open attempts kept by triggers, not by a partial
index of ``tenure_attempt``.

Since 0015 a unique index of ``job_id`` over the attempts whose ``finished_at`` is empty held
"at most one open attempt per job". Its condition reads ``finished_at``, so on PostgreSQL every
attempt's end changed a column an index of the table reads: the ended version could never be
written beside the open one without index entries (a heap-only update), and the attempt's
primary key and job-and-fence index took a second entry for every attempt. Vacuum removed the
open version's entry later, but those indexes' keys only rise, so their pages stayed half
empty: in the soak's first ten minutes 3.6 and 5.6 MB where their entries needed 2.1 and 2.9.

``tenure_open_attempt`` (job_id primary key, attempt_id) holds the same rule by its key. The
database keeps it: an attempt inserted with ``finished_at`` empty, or set back to empty, adds
its row (a second open attempt of the job breaks the key and its statement fails), and an
attempt whose ``finished_at`` is set, or that is deleted while open, removes it. No write of
Tenure's names the table; every path that opens or ends an attempt goes through the triggers,
on SQLite as on PostgreSQL.

Forwards, in one transaction: the table, the triggers (their lock holds off writes to
``tenure_attempt`` until the commit), the open attempts copied into the table through the
partial index, then that index dropped. Reversed, the index is built again, the triggers go,
then the table. On SQLite a later migration that
rebuilds ``tenure_attempt`` (SQLite alters most columns by copying the table) drops its
triggers and must create them again: ``test_the_database_refuses_a_second_open_attempt_of_a_job``
fails on a database without them.
"""

from typing import Any

from django.db import migrations, models

POSTGRES = [
    """CREATE FUNCTION tenure_attempt_opened() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        INSERT INTO tenure_open_attempt (job_id, attempt_id) VALUES (NEW.job_id, NEW.id);
        RETURN NEW;
    END $$""",
    """CREATE FUNCTION tenure_attempt_closed() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        DELETE FROM tenure_open_attempt WHERE job_id = OLD.job_id AND attempt_id = OLD.id;
        RETURN CASE WHEN TG_OP = 'DELETE' THEN OLD ELSE NEW END;
    END $$""",
    """CREATE TRIGGER tenure_attempt_opened BEFORE INSERT ON tenure_attempt FOR EACH ROW
    WHEN (NEW.finished_at IS NULL) EXECUTE FUNCTION tenure_attempt_opened()""",
    """CREATE TRIGGER tenure_attempt_reopened BEFORE UPDATE OF finished_at ON tenure_attempt
    FOR EACH ROW WHEN (OLD.finished_at IS NOT NULL AND NEW.finished_at IS NULL)
    EXECUTE FUNCTION tenure_attempt_opened()""",
    """CREATE TRIGGER tenure_attempt_closed BEFORE UPDATE OF finished_at ON tenure_attempt
    FOR EACH ROW WHEN (OLD.finished_at IS NULL AND NEW.finished_at IS NOT NULL)
    EXECUTE FUNCTION tenure_attempt_closed()""",
    """CREATE TRIGGER tenure_attempt_deleted BEFORE DELETE ON tenure_attempt FOR EACH ROW
    WHEN (OLD.finished_at IS NULL) EXECUTE FUNCTION tenure_attempt_closed()""",
]

POSTGRES_DROP = [
    "DROP TRIGGER IF EXISTS tenure_attempt_opened ON tenure_attempt",
    "DROP TRIGGER IF EXISTS tenure_attempt_reopened ON tenure_attempt",
    "DROP TRIGGER IF EXISTS tenure_attempt_closed ON tenure_attempt",
    "DROP TRIGGER IF EXISTS tenure_attempt_deleted ON tenure_attempt",
    "DROP FUNCTION IF EXISTS tenure_attempt_opened()",
    "DROP FUNCTION IF EXISTS tenure_attempt_closed()",
]

_SQLITE_OPEN = "INSERT INTO tenure_open_attempt (job_id, attempt_id) VALUES (NEW.job_id, NEW.id)"
_SQLITE_CLOSE = "DELETE FROM tenure_open_attempt WHERE job_id = OLD.job_id AND attempt_id = OLD.id"

SQLITE = [
    f"""CREATE TRIGGER tenure_attempt_opened AFTER INSERT ON tenure_attempt FOR EACH ROW
    WHEN NEW.finished_at IS NULL BEGIN {_SQLITE_OPEN}; END""",
    f"""CREATE TRIGGER tenure_attempt_reopened AFTER UPDATE OF finished_at ON tenure_attempt
    FOR EACH ROW WHEN OLD.finished_at IS NOT NULL AND NEW.finished_at IS NULL
    BEGIN {_SQLITE_OPEN}; END""",
    f"""CREATE TRIGGER tenure_attempt_closed AFTER UPDATE OF finished_at ON tenure_attempt
    FOR EACH ROW WHEN OLD.finished_at IS NULL AND NEW.finished_at IS NOT NULL
    BEGIN {_SQLITE_CLOSE}; END""",
    f"""CREATE TRIGGER tenure_attempt_deleted AFTER DELETE ON tenure_attempt FOR EACH ROW
    WHEN OLD.finished_at IS NULL BEGIN {_SQLITE_CLOSE}; END""",
]

SQLITE_DROP = [
    "DROP TRIGGER IF EXISTS tenure_attempt_opened",
    "DROP TRIGGER IF EXISTS tenure_attempt_reopened",
    "DROP TRIGGER IF EXISTS tenure_attempt_closed",
    "DROP TRIGGER IF EXISTS tenure_attempt_deleted",
]


def forwards(apps: Any, schema_editor: Any) -> None:
    postgres = schema_editor.connection.vendor == "postgresql"
    # The triggers first: creating one waits for the writes to the table in flight and holds
    # off new ones until the migration commits, so the copy below misses no attempt.
    for statement in POSTGRES if postgres else SQLITE:
        schema_editor.execute(statement)
    # Read through the partial index, which goes last.
    schema_editor.execute(
        "INSERT INTO tenure_open_attempt (job_id, attempt_id) "
        "SELECT job_id, id FROM tenure_attempt WHERE finished_at IS NULL"
    )


def backwards(apps: Any, schema_editor: Any) -> None:
    postgres = schema_editor.connection.vendor == "postgresql"
    for statement in POSTGRES_DROP if postgres else SQLITE_DROP:
        schema_editor.execute(statement)


class Migration(migrations.Migration):
    dependencies = [
        ("scheduler_core", "0016_queue_leased_index"),
    ]

    operations = [
        migrations.CreateModel(
            name="OpenAttempt",
            fields=[
                ("job_id", models.BigIntegerField(primary_key=True, serialize=False)),
                ("attempt_id", models.BigIntegerField()),
            ],
            options={"db_table": "tenure_open_attempt"},
        ),
        migrations.RunPython(forwards, backwards),
        # A partial index is dropped as an index on SQLite too (no copy of the table, which
        # would drop its triggers).
        migrations.RemoveConstraint(model_name="attempt", name="tenure_attempt_open"),
    ]

