#!/usr/bin/env bash
# Tenure installed the way docs/install.md says, checked on either stack: build the wheel and
# check what it holds; then, in an empty directory with a new virtualenv and a fresh
# PostgreSQL database, tests/install_doc.py runs the page's marked code blocks as written
# (install from the wheel, startproject, startapp, settings, urls.py, the app's jobs.py,
# migrate, createsuperuser, an enqueue, the executor and the scheduler), and this script checks
# what the page promises: the base install brought nothing it should not, the job ran and sent
# its e-mail, an operator logs in at /ops/login/ and sees the dashboard, metrics stay closed.
# Then the page's django.tasks section the same way, and the task's return value read back.
# Fails on any step.
#
#   .ci/host_project.sh            (called by .ci/run before `make test`, once per stack)
#   HOST_DB_NAME=... PG_HOST=... PG_PORT=... PG_USER=... PY=python3.13 .ci/host_project.sh
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
PY=${PY:-python3.11}
PYV=$("$PY" -c 'import sys; print("%d%d" % sys.version_info[:2])')
WORK=${HOST_WORK:-$ROOT/var/host-project-py$PYV}
DB_NAME=${HOST_DB_NAME:-tenure_host_ci_py$PYV}
PG_HOST=${PG_HOST:-127.0.0.1}
PG_PORT=${PG_PORT:-5432}
PG_USER=${PG_USER:-postgres}
started=$(date +%s)

step() { printf '\n== host project (Python %s): %s\n' "$PYV" "$*"; }
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
    "admin_ui/templates/admin_ui/overview.html", "admin_ui/templates/admin_ui/login.html",
    "admin_ui/templatetags/tenure_partials.py", "admin_ui/static/admin_ui/dashboard.css",
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

step "a new virtualenv and a fresh PostgreSQL database $DB_NAME"
"$PY" -m venv "$WORK/venv"
VPY="$WORK/venv/bin/python"
retry "$VPY" -m pip install -q --upgrade pip
# Only to create and drop the database here; the page's own install brings it too.
retry "$VPY" -m pip install -q "psycopg[binary]>=3.2,<4"
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

# This run's own lines, appended after each of the page's settings blocks: its database, and
# e-mail written to files so that the job's effect can be seen.
cat > "$WORK/settings-extra.py" <<EOF

# --- this run's own (.ci/host_project.sh): its database, and e-mail into files
DATABASES["default"].update(NAME="$DB_NAME", USER="$PG_USER", HOST="$PG_HOST", PORT="$PG_PORT")
if "MAILERS" in globals():  # Django 6.1's startproject: mailers by name
    MAILERS["default"] = {"BACKEND": "django.core.mail.backends.filebased.EmailBackend",
                          "OPTIONS": {"file_path": BASE_DIR / "sent-mail"}}
else:
    EMAIL_BACKEND = "django.core.mail.backends.filebased.EmailBackend"
    EMAIL_FILE_PATH = BASE_DIR / "sent-mail"
EOF
PROJECT=$WORK/project
export DJANGO_SUPERUSER_USERNAME=ops DJANGO_SUPERUSER_EMAIL=ops@example.invalid
export DJANGO_SUPERUSER_PASSWORD=host-project-operator-passphrase
run_page() {
  "$PY" "$ROOT/tests/install_doc.py" --group "$1" --project "$PROJECT" --venv "$WORK/venv" \
    --checkout "$ROOT" --settings-extra "$WORK/settings-extra.py"
}

step "docs/install.md, sections 1 to 4, as written"
cd "$WORK"  # away from the checkout, so nothing is imported from it
run_page quickstart
cd "$PROJECT"

step "the base install: the wheel, not the checkout, and nothing it should not bring"
"$VPY" - <<'EOF'
import importlib.util, sys
import django, scheduler_core, admin_ui
for absent in ("celery", "kombu", "rq", "django_rq", "redis", "aiosmtpd", "django_tasks"):
    if importlib.util.find_spec(absent) is not None:
        sys.exit(f"{absent} is installed: the base install must not need it")
# Python 3.11 can only run Django 5.2, which takes its partials from the package.
partials = importlib.util.find_spec("template_partials") is not None
if partials != (django.VERSION < (6, 0)):
    sys.exit(f"django-template-partials installed: {partials}, on Django {django.__version__}")
if "site-packages" not in scheduler_core.__file__:
    sys.exit(f"scheduler_core comes from {scheduler_core.__file__}, not the installed wheel")
print(f"Django {django.__version__}; django-template-partials",
      "installed" if partials else "absent", "| installed:", scheduler_core.__file__)
EOF
"$VPY" manage.py check --fail-level WARNING

step "the job ran and sent its e-mail; an operator logs in; metrics stay closed"
"$VPY" manage.py shell -v 0 -c '
import os, sys
from pathlib import Path
from django.test import Client
from django.test.utils import setup_test_environment
from scheduler_core.models import Effect, Job

job = Job.objects.get(name="shop.send_receipt")
assert job.state == "succeeded", (job.state, job.last_error)
assert Effect.objects.get(job=job).state == "applied"
mail = "".join(p.read_text() for p in Path("sent-mail").iterdir())
assert "Receipt for order 42" in mail and "customer@example.com" in mail, mail
for absent in ("celery", "rq", "django_rq", "aiosmtpd", "django_tasks"):
    assert absent not in sys.modules, absent
setup_test_environment()
anonymous = Client()
to_login = anonymous.get("/ops/")
assert to_login.status_code == 302 and to_login["Location"] == "/ops/login/?next=/ops/", to_login
assert anonymous.get(to_login["Location"]).status_code == 200
assert anonymous.get("/ops/metrics").status_code == 401
assert anonymous.get("/metrics").status_code == 401
client = Client()
done = client.post("/ops/login/", {"username": os.environ["DJANGO_SUPERUSER_USERNAME"],
                                   "password": os.environ["DJANGO_SUPERUSER_PASSWORD"], "next": "/ops/"})
assert done.status_code == 302 and done["Location"] == "/ops/", (done.status_code, done.content[:300])
page = client.get("/ops/")
assert page.status_code == 200 and b"Tenure" in page.content, page.status_code
detail = client.get(f"/ops/jobs/{job.pk}/")
assert detail.status_code == 200 and b"shop.send_receipt" in detail.content
metrics = client.get("/ops/metrics")
assert metrics.status_code == 200 and b"tenure_jobs" in metrics.content
print("job", job.pk, job.state, "| e-mail sent | /ops/login/ then /ops/ 200 | metrics 401 anonymous, 200 logged in")
'

step "docs/install.md, django.tasks, as written"
cd "$WORK"
run_page tasks
cd "$PROJECT"
"$VPY" manage.py check --fail-level WARNING
"$VPY" manage.py jobs_status --json > status.json
"$VPY" manage.py shell -v 0 -c '
import json
from scheduler_core.models import Job
from shop.tasks import total

job = Job.objects.get(name="shop.tasks.total")
result = total.get_result(str(job.pk))
assert str(result.status).endswith("SUCCESSFUL"), (result.status, result.errors)
assert result.return_value == {"total": 50}, result.return_value
assert result.args == [2, 3] and result.kwargs == {"scale": 10}
assert result.started_at and result.finished_at and result.worker_ids
states = json.load(open("status.json"))["states"]
assert states.get("succeeded") == 2 and not states.get("waiting"), states
print("task", result.id, result.status, result.return_value, "| jobs_status:", states)
'

step "passed in $(( $(date +%s) - started )) s"
