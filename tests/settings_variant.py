"""The example project's settings changed the way a host project might differ, for tests that
run ``manage.py`` against them (``DJANGO_SETTINGS_MODULE=tests.settings_variant``):

* ``TEST_WITHOUT_APPS`` — comma-separated apps left out of ``INSTALLED_APPS``;
* ``TEST_WITHOUT_DB_OPTIONS=1`` — the default database's ``OPTIONS`` emptied, as a host that
  wrote only ``ENGINE`` and ``NAME`` has them;
* ``TEST_TENURE_SQLITE`` — a path: Tenure's tables go to a SQLite database of their own there,
  under the alias ``tenure`` (``TENURE_DATABASE``), with ``scheduler_core.db.TenureRouter``;
* ``TEST_DEFAULT_SQLITE`` — a path: the default database is a SQLite file there;
* ``TEST_CELERY_ACCEPT_CONTENT`` — comma-separated: Celery's ``accept_content``;
* ``TEST_CELERY_CANCEL_ON_CONNECTION_LOSS=1`` — Celery cancels running tasks when the broker
  connection drops;
* ``TEST_CELERY_ACKS_EARLY=1`` — Celery's ``task_annotations`` turn Tenure's late
  acknowledgement off.
"""

from __future__ import annotations

import os

from config.settings import *  # noqa: F403
from config.settings import DATABASES, INSTALLED_APPS

_without = {a.strip() for a in os.environ.get("TEST_WITHOUT_APPS", "").split(",") if a.strip()}
INSTALLED_APPS = [a for a in INSTALLED_APPS if a not in _without]

if os.environ.get("TEST_DEFAULT_SQLITE"):
    DATABASES["default"] = {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": os.environ["TEST_DEFAULT_SQLITE"],
        "OPTIONS": {"transaction_mode": "IMMEDIATE"},
    }

if os.environ.get("TEST_WITHOUT_DB_OPTIONS") == "1":
    DATABASES["default"]["OPTIONS"] = {}

if os.environ.get("TEST_TENURE_SQLITE"):
    DATABASES["tenure"] = {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": os.environ["TEST_TENURE_SQLITE"],
        "OPTIONS": {"transaction_mode": "IMMEDIATE"},
    }
    TENURE_DATABASE = "tenure"
    DATABASE_ROUTERS = ["scheduler_core.db.TenureRouter"]

if os.environ.get("TEST_CELERY_ACCEPT_CONTENT"):
    CELERY_ACCEPT_CONTENT = os.environ["TEST_CELERY_ACCEPT_CONTENT"].split(",")

if os.environ.get("TEST_CELERY_CANCEL_ON_CONNECTION_LOSS") == "1":
    CELERY_WORKER_CANCEL_LONG_RUNNING_TASKS_ON_CONNECTION_LOSS = True

if os.environ.get("TEST_CELERY_ACKS_EARLY") == "1":
    CELERY_TASK_ANNOTATIONS = {"tenure.run": {"acks_late": False}}
