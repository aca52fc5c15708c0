"""A host's Celery app gets Tenure's task without autodiscovering Tenure's modules, the task
carries the options recovery relies on itself, and a worker whose configuration would weaken
them refuses to start."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from django.core.checks import run_checks

from tests.conftest import ROOT, manage_variant

CELERY = str(Path(sys.executable).parent / "celery")


def _env(**extra: str) -> dict[str, str]:
    env = dict(os.environ, DJANGO_SETTINGS_MODULE="tests.settings_variant", PYTHONPATH=str(ROOT))
    env.pop("TENURE_FAILPOINTS", None)
    env.update(extra)
    return env


def _shell(code: str, **env: str) -> str:
    done = manage_variant("shell", "-v", "0", "-c", code, **env)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


@pytest.mark.process
def test_the_task_is_registered_at_start_up_when_celery_is_the_transport() -> None:
    # A host's own Celery app, configured with nothing and autodiscovering nothing: Tenure's
    # task is on it all the same, with the options recovery relies on (the app's defaults
    # would acknowledge early).
    code = (
        "from celery import Celery\n"
        "app = Celery('host')\n"
        "t = app.tasks['tenure.run']\n"
        "print(app.conf.task_acks_late, t.acks_late, t.reject_on_worker_lost, t.serializer, "
        "t.ignore_result)"
    )
    assert _shell(code, TENURE_TRANSPORT="celery") == "False True False json True"


@pytest.mark.process
def test_the_celery_adapter_is_not_imported_without_the_celery_transport() -> None:
    code = "import sys; print('scheduler_core.transports.celery' in sys.modules)"
    assert _shell(code, TENURE_TRANSPORT="polling") == "False"


@pytest.mark.process
def test_a_broker_less_example_project_loads_no_broker_client() -> None:
    # The example project loads Celery's app (config/__init__.py) and django-rq only for the
    # transports that use them: a broker-less executor starts without either.
    code = (
        "import sys; print(sorted(m for m in ('celery', 'kombu', 'django_rq', 'redis', 'rq') "
        "if m in sys.modules))"
    )
    assert _shell(code, TENURE_TRANSPORT="polling") == "[]"
    assert _shell(code, TENURE_TRANSPORT="celery") != "[]"


def _ids(settings: Any, **overrides: Any) -> set[str]:
    for name, value in overrides.items():
        setattr(settings, name, value)
    return {m.id for m in run_checks() if m.id.startswith("tenure.E01")}


def test_cancelling_attempts_on_a_lost_broker_connection_is_an_error(settings: Any) -> None:
    found = _ids(
        settings,
        TENURE_TRANSPORT="celery",
        CELERY_WORKER_CANCEL_LONG_RUNNING_TASKS_ON_CONNECTION_LOSS=True,
    )
    assert found == {"tenure.E013"}


@pytest.mark.process
@pytest.mark.broker
@pytest.mark.parametrize(
    ("knob", "check_id"),
    [
        ("TEST_CELERY_CANCEL_ON_CONNECTION_LOSS", "tenure.E013"),
        ("TEST_CELERY_ACKS_EARLY", "tenure.E015"),
    ],
)
def test_a_worker_whose_app_would_weaken_recovery_refuses_to_start(
    tmp_path: Path, knob: str, check_id: str
) -> None:
    env = _env(
        TENURE_TRANSPORT="celery",
        CELERY_BROKER_URL="filesystem://",
        TENURE_VAR_DIR=str(tmp_path),
        **{knob: "1"},
    )
    done = subprocess.run(
        [CELERY, "-A", "config", "worker", "-Q", "i16-refused", "--pool", "solo"],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    out = done.stdout + done.stderr
    assert done.returncode != 0, out
    assert "Tenure refuses to start this Celery worker" in out
    assert check_id in out
