"""Project configuration. When the project's transport is Celery (``TENURE_TRANSPORT``, read
from the environment as :mod:`config.settings` reads it, ``celery`` by default), importing this
package loads the Celery app, so Tenure's task binds to it in every process that enqueues.

A broker-less deployment (``TENURE_TRANSPORT=polling``) loads no broker client: Celery's app
and django-rq (left out of ``INSTALLED_APPS`` there too) were about 0.15 s of every
``run_executor``'s start-up, of 0.55 s (bench/README.md, "The workloads", Drain)."""

import os

if os.environ.get("TENURE_TRANSPORT", "celery") == "celery":
    from .celery import app as celery_app

    __all__ = ["celery_app"]
