"""Django settings for the two Django-based peers (a database task backend and a cluster with
an ORM broker). ``BENCH_DB`` names the database; both apps are installed so one settings
module serves both."""

from __future__ import annotations

import os

SECRET_KEY = "bench-only"
DEBUG = False
USE_TZ = True
TIME_ZONE = "UTC"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
INSTALLED_APPS = [
    "django.contrib.contenttypes",
    "django.contrib.auth",
    "django_tasks",
    "django_tasks_db",
    "django_q",
]
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": os.environ.get("BENCH_DB", "bench_djtasks"),
        "USER": "postgres",
        "HOST": os.environ.get("BENCH_PG_HOST", "127.0.0.1"),
        "PORT": os.environ.get("BENCH_PG_PORT", "5432"),
        "CONN_MAX_AGE": 0,
    }
}
TASKS = {"default": {"BACKEND": "django_tasks_db.DatabaseBackend", "QUEUES": ["default"]}}
Q_CLUSTER = {
    "name": "bench",
    "orm": "default",
    "workers": int(os.environ.get("BENCH_WORKERS", "1")),
    "timeout": 60,
    "retry": 120,
    "ack_failures": True,
    "max_attempts": 1,
    "catch_up": False,
}
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "root": {"level": "WARNING"},
}
