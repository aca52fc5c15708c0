"""The Celery application: ``celery -A config worker -Q default``."""

from __future__ import annotations

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

app = Celery("tenure")
app.config_from_object("django.conf:settings", namespace="CELERY")
# The only task lives in the Celery transport adapter.
app.autodiscover_tasks(["scheduler_core.transports"], related_name="celery")
