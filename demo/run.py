"""``make demo``: the whole system on the embedded default, one command, one Ctrl-C.

Migrates the SQLite database under ``var/``, creates the demo accounts, seeds a few jobs of
every kind and a database schedule, turns on the demo's steady traffic (``demo.traffic``, every
minute: jobs that succeed, fail, back off, go indeterminate, run for minutes), then starts and
supervises: the demo destinations (payment provider and SMTP
sink), two Celery workers on the filesystem broker, ``run_scheduler`` and the web server on
127.0.0.1:8000. Ctrl-C (or SIGTERM) stops every child cleanly: SIGTERM first, so executors
finish or release their jobs, then SIGKILL after a grace period.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEMO_QUEUES = ("default", "billing", "reports")
"""The queues the workers consume (demo/jobs.py; ``reports`` is the one to pause)."""
PY = sys.executable
BIN = Path(PY).parent
WEB = os.environ.get("TENURE_DEMO_WEB", "127.0.0.1:8000")
HTTP_PORT = os.environ.get("TENURE_DEMO_PROVIDER_PORT", "8765")
SMTP_PORT = os.environ.get("TENURE_DEMO_SMTP_PORT", "8025")


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    env.setdefault("TENURE_TRANSPORT", "celery")
    env.setdefault("CELERY_BROKER_URL", "filesystem://")
    # Where the demo jobs find the demo destinations (demo/clients.py).
    env.setdefault("DEMO_PAY_URL", f"http://127.0.0.1:{HTTP_PORT}")
    env.setdefault("DEMO_SMTP", f"127.0.0.1:{SMTP_PORT}")
    # demo.traffic's schedule: a minute of every kind of work, every minute (demo/jobs.py).
    env.setdefault("TENURE_DEMO_TRAFFIC", "1")
    env["PYTHONUNBUFFERED"] = "1"
    return env


def manage(*args: str, check: bool = True) -> subprocess.CompletedProcess[bytes]:
    """Run one management command to completion."""
    return subprocess.run([PY, str(ROOT / "manage.py"), *args], env=_env(), cwd=ROOT, check=check)


def _available_commands() -> set[str]:
    out = subprocess.run(
        [PY, str(ROOT / "manage.py"), "help", "--commands"],
        env=_env(),
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    return set(out.stdout.split())


def main() -> int:
    """Set up, start every part, supervise until Ctrl-C."""
    print("Tenure demo: preparing the embedded database under var/ ...", flush=True)
    manage("migrate", "--noinput", "-v", "0")
    commands = _available_commands()
    if "create_demo_users" in commands:
        manage("create_demo_users")
    manage("shell", "-c", "from demo.seed import seed; seed()")

    children: list[tuple[str, subprocess.Popen[bytes]]] = []

    def start(name: str, argv: list[str]) -> None:
        print(f"  starting {name}: {' '.join(argv[1:])}", flush=True)
        children.append((name, subprocess.Popen(argv, env=_env(), cwd=ROOT)))

    if "run_destinations" in commands:
        start(
            "destinations",
            [
                PY,
                "manage.py",
                "run_destinations",
                "--http-port",
                HTTP_PORT,
                "--smtp-port",
                SMTP_PORT,
            ],
        )
    prefix = _env().get("TENURE_BROKER_QUEUE_PREFIX", "")
    for i in (1, 2):
        start(
            f"celery worker {i}",
            [
                str(BIN / "celery"),
                "-A",
                "config",
                "worker",
                "-Q",
                ",".join(prefix + q for q in DEMO_QUEUES),
                "-c",
                "2",
                "-n",
                f"demo{i}@%h",
                "--loglevel",
                "INFO",
            ],
        )
    start("scheduler", [PY, "manage.py", "run_scheduler"])
    start("web", [PY, "manage.py", "runserver", WEB, "--noreload", "--insecure"])

    print(
        f"""
Tenure is running on the embedded default (SQLite under var/, Celery on the filesystem broker).
  Dashboard:   http://{WEB}/ops/      (log in with the operator or viewer account printed above)
  Admin:       http://{WEB}/admin/    (read-only model browser)
  Status:      {PY} manage.py jobs_status --json
  Guarantees:  {PY} manage.py jobs_guarantees
Press Ctrl-C to stop every part cleanly.
""",
        flush=True,
    )

    stopping = False

    def stop(*_: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    try:
        while not stopping:
            for name, p in children:
                if p.poll() is not None:
                    print(f"{name} exited with {p.returncode}; stopping the demo", flush=True)
                    stopping = True
            time.sleep(0.5)
    finally:
        print("Stopping: SIGTERM to every part (executors finish or release their jobs) ...")
        for _, p in children:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 15
        for name, p in children:
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                print(f"  {name} did not stop in time; killing it")
                p.kill()
                p.wait()
        print("Stopped.")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
