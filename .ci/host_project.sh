#!/usr/bin/env bash
# Tenure installed the way a host project installs it (docs/install.md): build the wheel, install
# it (not editable; the base install, without Celery, RQ, django-tasks or the demo's extras)
# into a new virtualenv under var/, make a project with `django-admin startproject`, add the
# apps and the URL as the guide says, point DATABASES at a fresh PostgreSQL database, and in an
# app of its own: check, migrate, run an @job to completion on run_executor, GET /ops/ logged
# in (and the metrics guard); then add the tasks extra and TASKS, run a django.tasks @task the
# same way and read its return value back through get_result. Fails on any step.
#
#   .ci/host_project.sh            (called by .ci/run before `make test`)
#   HOST_DB_NAME=... PG_HOST=... PG_PORT=... PG_USER=... PY=python3.11 .ci/host_project.sh
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
PY=${PY:-python3.11}
WORK=${HOST_WORK:-$ROOT/var/host-project}
DB_NAME=${HOST_DB_NAME:-tenure_host_ci}
PG_HOST=${PG_HOST:-127.0.0.1}
PG_PORT=${PG_PORT:-5432}
PG_USER=${PG_USER:-postgres}
started=$(date +%s)

step() { printf '\n== host project: %s\n' "$*"; }
fail() { printf '\nhost project FAILED: %s\n' "$*" >&2; exit 1; }
# An install tried up to three times, 10 s apart (pip does not retry a download cut off midway).
retry() { for i in 1 2 3; do "$@" && return 0; echo "failed (try $i of 3): $*" >&2; [ "$i" = 3 ] || sleep 10; done; return 1; }

rm -rf "$WORK"
mkdir -p "$WORK/dist"

step "build the wheel"
"$PY" -m venv "$WORK/build-venv"
retry "$WORK/build-venv/bin/python" -m pip install -q --upgrade pip
retry "$WORK/build-venv/bin/python" -m pip wheel -q --no-deps -w "$WORK/dist" "$ROOT"
rm -rf "$ROOT/build" "$ROOT"/*.egg-info
WHEEL=$(ls "$WORK"/dist/tenure-*.whl)
echo "$WHEEL"

step "the wheel holds the two apps and nothing of the repository's example"
"$PY" - "$WHEEL" <<'EOF'
import sys, zipfile
names = set(zipfile.ZipFile(sys.argv[1]).namelist())
need = [
    "scheduler_core/__init__.py", "scheduler_core/py.typed", "scheduler_core/backends.py",
    "scheduler_core/migrations/0001_initial.py", "scheduler_core/migrations/0006_attempt_return_value.py",
    "admin_ui/py.typed", "admin_ui/templates/admin_ui/base.html",
    "admin_ui/templates/admin_ui/overview.html", "admin_ui/static/admin_ui/dashboard.css",
    "admin_ui/migrations/0001_operate_permission.py",
]
missing = [n for n in need if n not in names]
stray = sorted(n for n in names if n.split("/")[0] in ("config", "demo", "bench", "tests", "templates", "verifier")
               or n.startswith("scheduler_core/chaos/"))
licence = [n for n in names if n.endswith(".dist-info/licenses/LICENSE")]
if missing or stray or not licence:
    sys.exit(f"wheel: missing {missing}, must not hold {stray[:10]}, licence {licence}")
print(f"{len(names)} files; no config/, demo/, bench/, tests/ or fault verifier; licence {licence[0]}")
EOF

step "install it, not editable, with only what the guide's base install needs"
cd "$WORK"  # away from the checkout, so nothing is imported from it
"$PY" -m venv "$WORK/venv"
VPY="$WORK/venv/bin/python"
retry "$VPY" -m pip install -q --upgrade pip
retry "$VPY" -m pip install -q "$WHEEL" "psycopg[binary]>=3.2,<4"
"$VPY" - <<'EOF'
import importlib.util, sys
import scheduler_core, admin_ui  # importable without a project
for absent in ("celery", "kombu", "rq", "django_rq", "redis", "aiosmtpd", "django_tasks"):
    if importlib.util.find_spec(absent) is not None:
        sys.exit(f"{absent} is installed: the base install must not need it")
if "site-packages" not in scheduler_core.__file__:
    sys.exit(f"scheduler_core comes from {scheduler_core.__file__}, not the installed wheel")
print("installed:", scheduler_core.__file__)
EOF

step "a fresh PostgreSQL database $DB_NAME"
export HOST_DB_NAME=$DB_NAME PG_HOST PG_PORT PG_USER
drop_db() {
  "$VPY" - <<'EOF' || true
import os, psycopg
with psycopg.connect(host=os.environ["PG_HOST"], port=os.environ["PG_PORT"],
                     user=os.environ["PG_USER"], dbname="postgres", autocommit=True) as c:
    c.execute(f'DROP DATABASE IF EXISTS "{os.environ["HOST_DB_NAME"]}" WITH (FORCE)')
EOF
}
drop_db
trap drop_db EXIT
"$VPY" - <<'EOF'
import os, psycopg
with psycopg.connect(host=os.environ["PG_HOST"], port=os.environ["PG_PORT"],
                     user=os.environ["PG_USER"], dbname="postgres", autocommit=True) as c:
    c.execute(f'CREATE DATABASE "{os.environ["HOST_DB_NAME"]}"')
EOF

step "django-admin startproject, and the lines docs/install.md adds"
"$WORK/venv/bin/django-admin" startproject hostsite
cd hostsite
"$VPY" manage.py startapp shop
cat >> hostsite/settings.py <<EOF

# --- Tenure, as docs/install.md says ------------------------------------------------------
INSTALLED_APPS += [
    "django_htmx",
    "template_partials",
    "scheduler_core",
    "admin_ui",
    "shop",
]
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": "$DB_NAME",
        "USER": "$PG_USER",
        "HOST": "$PG_HOST",
        "PORT": "$PG_PORT",
        "OPTIONS": {
            "connect_timeout": 5,
            "keepalives": 1,
            "keepalives_idle": 5,
            "keepalives_interval": 2,
            "keepalives_count": 3,
            "tcp_user_timeout": 10000,
        },
    }
}
EOF
"$VPY" - <<'EOF'
from pathlib import Path
p = Path("hostsite/urls.py")
s = p.read_text()
s = s.replace("from django.urls import path\n", "from django.urls import include, path\n")
s = s.replace("    path('admin/', admin.site.urls),\n",
              "    path('admin/', admin.site.urls),\n    path('ops/', include('admin_ui.urls')),\n")
assert "include('admin_ui.urls')" in s, s
p.write_text(s)
EOF
cat > shop/jobs.py <<'EOF'
from scheduler_core import job


@job(name="shop.note", max_attempts=3)
def note(ctx, *, text: str) -> None:
    assert ctx.attempt >= 1 and ctx.fence >= 1
EOF

step "check (warnings fail too) and migrate, on the base install"
"$VPY" manage.py check --fail-level WARNING
"$VPY" manage.py migrate --noinput -v 0

step "an @job, run to completion by run_executor --burst"
"$VPY" manage.py shell -v 0 -c '
from shop.jobs import note
j = note.enqueue(text="hello")
open("job.txt", "w").write(f"{j.pk}\n")
print("enqueued job", j.pk)
'
read -r JOB_ID < job.txt
timeout 120 "$VPY" manage.py run_executor --burst --concurrency 2 --poll-interval 0.1
"$VPY" manage.py run_scheduler --once

step "the dashboard and the metrics guard, on the base install"
JOB_ID=$JOB_ID "$VPY" manage.py shell -v 0 -c '
import os, sys
from django.contrib.auth import get_user_model
from django.test import Client
from django.test.utils import setup_test_environment
from scheduler_core.models import Job

job = Job.objects.get(pk=int(os.environ["JOB_ID"]))
assert job.state == "succeeded", (job.state, job.last_error)
for absent in ("celery", "rq", "django_rq", "aiosmtpd"):
    assert absent not in sys.modules, absent
setup_test_environment()
anonymous = Client()
assert anonymous.get("/ops/").status_code == 302
assert anonymous.get("/ops/metrics").status_code == 401
user = get_user_model().objects.create_superuser("ci-operator", "ci@example.invalid", "x")
client = Client()
client.force_login(user)
page = client.get("/ops/")
assert page.status_code == 200, page.status_code
assert b"Tenure" in page.content
detail = client.get(f"/ops/jobs/{job.pk}/")
assert detail.status_code == 200 and b"shop.note" in detail.content
metrics = client.get("/ops/metrics")
assert metrics.status_code == 200 and b"tenure_jobs" in metrics.content
print("job", job.pk, job.state, "| GET /ops/ 200 logged in; /ops/metrics 401 anonymous, 200 logged in")
'

step "django.tasks: the tasks extra, TASKS and a @task"
retry "$VPY" -m pip install -q "${WHEEL}[tasks]"
cat >> hostsite/settings.py <<EOF
INSTALLED_APPS += ["django_tasks"]  # the django.tasks backport (Django 5.2)
TASKS = {"default": {"BACKEND": "scheduler_core.backends.TenureBackend"}}
EOF
cat > shop/tasks.py <<'EOF'
from django_tasks import task


@task()
def total(a: int, b: int, *, scale: int = 1) -> dict:
    return {"total": (a + b) * scale}
EOF
"$VPY" manage.py check --fail-level WARNING
"$VPY" manage.py shell -v 0 -c '
from django.db import transaction
from shop.tasks import total
with transaction.atomic():
    r = total.enqueue(2, 3, scale=10)
open("task.txt", "w").write(f"{r.id}\n")
print("enqueued task result", r.id, r.status)
'
read -r TASK_ID < task.txt
timeout 120 "$VPY" manage.py run_executor --burst --concurrency 2 --poll-interval 0.1
"$VPY" manage.py jobs_status --json > status.json
TASK_ID=$TASK_ID "$VPY" manage.py shell -v 0 -c '
import json, os
from shop.tasks import total

result = total.get_result(os.environ["TASK_ID"])
assert str(result.status) == "SUCCESSFUL", (result.status, result.errors)
assert result.return_value == {"total": 50}, result.return_value
assert result.args == [2, 3] and result.kwargs == {"scale": 10}
assert result.started_at and result.finished_at and result.worker_ids
states = json.load(open("status.json"))["states"]
assert states.get("succeeded") == 2 and not states.get("waiting"), states
print("task", result.id, result.status, result.return_value, "| jobs_status:", states)
'

step "passed in $(( $(date +%s) - started )) s"
