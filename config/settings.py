"""Tenure's Django settings.

Two environment variables choose the deployment; everything else has a default:

* ``DATABASE_URL`` — ``sqlite:///path`` (the embedded default, a file under ``var/``) or
  ``postgres://user@host:port/name`` (the shared store for executors on many hosts), read
  with dj-database-url.
* ``CELERY_BROKER_URL`` — ``filesystem://`` (the embedded default, folders under ``var/``),
  ``redis://…`` or ``amqp://…``.

``TENURE_TRANSPORT`` (``celery`` by default here) also chooses what is loaded: with
``polling`` (broker-less) neither Celery's app (``config/__init__.py``) nor django-rq is,
as a host project whose executors are all broker-less installs neither.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import dj_database_url
import django

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(os.environ.get("TENURE_VAR_DIR", BASE_DIR / "var"))
VAR_DIR.mkdir(parents=True, exist_ok=True)

SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY", "tenure-insecure-development-key-change-me")
DEBUG = os.environ.get("DJANGO_DEBUG", "0") == "1"
ALLOWED_HOSTS = os.environ.get("DJANGO_ALLOWED_HOSTS", "127.0.0.1,localhost,testserver").split(",")


def _several_hosts(url: str) -> tuple[str, str, str]:
    """A PostgreSQL URL naming several hosts (``postgres://u@h1:5432,h2:5432/db``, libpq's
    multi-host form, for a primary and its standbys with ``target_session_attrs=read-write``)
    as the URL with its first host, and every host and port as libpq's comma lists, which
    dj-database-url cannot parse. Any other URL comes back as it is, with empty lists."""
    scheme, sep, rest = url.partition("://")
    netloc = rest.split("/", 1)[0].split("?", 1)[0]
    user, at, hostlist = netloc.rpartition("@")
    if not sep or "," not in hostlist or not scheme.startswith("postgres"):
        return url, "", ""
    hosts, ports = [], []
    for part in hostlist.split(","):
        host, colon, port = part.rpartition(":")
        if not colon:
            host, port = part, ""
        hosts.append(host)
        ports.append(port or "5432")
    first = f"{user}{at}{hosts[0]}:{ports[0]}"
    return url.replace(netloc, first, 1), ",".join(hosts), ",".join(ports)


def database_from_url(url: str) -> dict[str, Any]:
    """``DATABASE_URL`` as a Django ``DATABASES`` entry: parsed by dj-database-url (a query
    string's parameters become ``OPTIONS``), with the options Tenure's checks require."""
    url, hosts, ports = _several_hosts(url)
    entry: dict[str, Any] = dict(dj_database_url.parse(url))
    if hosts:
        entry["HOST"], entry["PORT"] = hosts, ports
    options: dict[str, Any] = entry.setdefault("OPTIONS", {})
    if entry["ENGINE"] == "django.db.backends.sqlite3":
        # sqlite:///relative/path (under this checkout) or sqlite:////absolute/path
        path = (
            Path(entry["NAME"]) if Path(entry["NAME"]).is_absolute() else BASE_DIR / entry["NAME"]
        )
        entry["NAME"] = str(path)
        # Required by Tenure (check tenure.E021): every write transaction takes the write lock
        # at BEGIN, so a claim is never a read overtaken before its write. Tenure itself sets
        # the write-ahead log and the busy timeout on connect.
        options.setdefault("transaction_mode", "IMMEDIATE")
        # This project's own choice for speed: with the write-ahead log, a commit is durable at
        # the next checkpoint, not at once (a power cut may lose the last).
        options.setdefault("init_command", "PRAGMA synchronous=NORMAL;")
        entry["TEST"] = {"NAME": str(VAR_DIR / f"test-{path.stem}.sqlite3")}
        return entry
    if entry["ENGINE"] == "django.db.backends.postgresql":
        # Required by Tenure (check tenure.E022): a silent network (blackholed link) fails a
        # call instead of hanging it, so the heartbeat thread can self-fence by its own clock.
        # Tenure itself sets lock_timeout and idle_in_transaction_session_timeout on connect
        # (scheduler_core/storage/connection_settings.py). The URL's own parameters win.
        entry["OPTIONS"] = {
            "connect_timeout": 5,
            "keepalives": 1,
            "keepalives_idle": 5,
            "keepalives_interval": 2,
            "keepalives_count": 3,
            "tcp_user_timeout": 10000,
            **options,
        }
        entry["TEST"] = {"NAME": os.environ.get("TENURE_TEST_DB_NAME", "test_tenure")}
        return entry
    raise ValueError(
        f"DATABASE_URL {url.partition(':')[0]!r}: Tenure runs on PostgreSQL or SQLite "
        "(postgres://user@host:port/name or sqlite:///path)"
    )


DATABASE_URL = os.environ.get("DATABASE_URL", f"sqlite:///{VAR_DIR / 'tenure.sqlite3'}")
DATABASES = {"default": database_from_url(DATABASE_URL)}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# Read before INSTALLED_APPS (TENURE_TRANSPORT, at the end, is this value): a broker-less
# deployment loads no broker client (config/__init__.py, and django-rq below).
_TRANSPORT = os.environ.get("TENURE_TRANSPORT", "celery")

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django_htmx",
    # Django 5.2 only: template partials and django.tasks are Django's own from 6.0.
    *(["template_partials", "django_tasks"] if django.VERSION < (6, 0) else []),
    # for `manage.py rqworker`; its dashboard is not mounted (RQ_SHOW_ADMIN_LINK)
    *([] if _TRANSPORT == "polling" else ["django_rq"]),
    "scheduler_core",
    "admin_ui",
    "demo",
    "verifier",  # the fault verifier (manage.py chaos) and its hooks; this project only
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "config.urls"
WSGI_APPLICATION = "config.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    }
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True
STATIC_URL = "static/"
STATIC_ROOT = VAR_DIR / "static"
LOGIN_URL = "/accounts/login/"
LOGIN_REDIRECT_URL = "/ops/"

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "loggers": {
        "tenure": {"handlers": ["console"], "level": os.environ.get("TENURE_LOG_LEVEL", "INFO")},
    },
}

# --- Celery (primary transport). Messages carry only a job id; JSON only, pickle refused.
BROKER_DIR = VAR_DIR / "broker"
CELERY_BROKER_URL = os.environ.get("CELERY_BROKER_URL", "filesystem://")
CELERY_BROKER_TRANSPORT_OPTIONS: dict[str, Any] = {}
if CELERY_BROKER_URL.startswith("filesystem://"):
    for sub in ("queue", "processed", "control"):
        (BROKER_DIR / sub).mkdir(parents=True, exist_ok=True)
    # kombu's filesystem transport with messages written whole: with its own, a worker can take
    # a message file before it is written and stop (scheduler_core/transports/filesystem_broker.py).
    CELERY_BROKER_TRANSPORT = "scheduler_core.transports.filesystem_broker:Transport"
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        "data_folder_in": str(BROKER_DIR / "queue"),
        "data_folder_out": str(BROKER_DIR / "queue"),
        "processed_folder": str(BROKER_DIR / "processed"),
        "control_folder": str(BROKER_DIR / "control"),
        "store_processed": False,
        "polling_interval": 0.05,
    }
CELERY_TASK_SERIALIZER = "json"
CELERY_RESULT_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_RESULT_BACKEND = None
CELERY_TASK_IGNORE_RESULT = True
CELERY_TASK_ACKS_LATE = True
# A killed pool child must not make the broker redeliver forever: the database reaper owns
# recovery, and a redelivered hint is absorbed by the claim anyway.
CELERY_TASK_REJECT_ON_WORKER_LOST = False
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
# A lost broker connection must not cancel running attempts: each holds a lease in the
# database and ends through the write seam; its hint is only a wake-up, re-sent if lost.
CELERY_WORKER_CANCEL_LONG_RUNNING_TASKS_ON_CONNECTION_LOSS = False
# Celery's Django integration would close the database connection before and after every
# task (a new connection per job); the adapter drops a broken one itself before each message.
CELERY_DB_REUSE_MAX = 1000

# --- RQ (second transport): `manage.py rqworker default`. Only JSON crosses the broker: the
# worker and job classes read JSON whatever serializer rqworker is given, so nothing is unpickled.
_QUEUE_PREFIX = os.environ.get("TENURE_BROKER_QUEUE_PREFIX", "")
# One entry per queue the example's job types use (demo/jobs.py: default, billing, reports);
# a system check (tenure.E011) refuses to start when a job type's queue has none.
RQ_QUEUES = {
    f"{_QUEUE_PREFIX}{name}": {
        "URL": os.environ.get("RQ_REDIS_URL", "redis://127.0.0.1:6379/0"),
        "SERIALIZER": "rq.serializers.JSONSerializer",
    }
    for name in ("default", "billing", "reports")
}
RQ = {
    "WORKER_CLASS": "scheduler_core.transports.rq.Worker",
    "JOB_CLASS": "scheduler_core.transports.rq.Job",
    "COMMIT_MODE": "auto",  # Tenure publishes hints itself, after the enqueue commits
}
# The RQ dashboard could requeue and delete hints outside the operator's audit trail.
RQ_SHOW_ADMIN_LINK = False

# --- django.tasks: @task functions run as Tenure jobs (docs/install.md).
TASKS = {"default": {"BACKEND": "scheduler_core.backends.TenureBackend"}}

# --- Tenure. Every name has a default in scheduler_core.conf; override here or by env.
TENURE_TRANSPORT = _TRANSPORT
# Any other TENURE_<NAME> (see scheduler_core/conf.py) may be set here or in the environment.
