"""The Celery application: ``celery -A config worker -Q default``."""

from __future__ import annotations

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

app = Celery("tenure")
app.config_from_object("django.conf:settings", namespace="CELERY")
# Tenure's task needs no autodiscovery: scheduler_core registers it at start-up when
# TENURE_TRANSPORT is "celery". This project has no Celery tasks of its own.
