"""The transport harness: one object per transport that the contract suite drives.

Every transport is run for real: the broker-less executor (``manage.py run_executor``), Celery
(``celery -A config worker``, prefork pool) on the filesystem broker, on Redis and on RabbitMQ,
and RQ on Redis (``manage.py rqworker``). A broker that cannot be reached skips its cases with
the reason said; with ``CI=true`` it fails them instead, so CI cannot pass without every broker.

Isolation: each run uses its own broker queue names (``TENURE_BROKER_QUEUE_PREFIX``) and
Redis database numbers of its own, and purges its queues before every test.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pytest

from scheduler_core.api import hints
from tests.conftest import ROOT

# The contract's classes live outside test modules; keep pytest's assertion messages for them.
pytest.register_assert_rewrite("tests.transports.contract")

PYTHON = sys.executable
CELERY = str(Path(sys.executable).parent / "celery")

RUN = uuid.uuid4().hex[:8]
PREFIX = f"tenure-test-{RUN}-"
QUEUE = "default"
BROKER_QUEUE = PREFIX + QUEUE

# The filesystem broker (the embedded default) keeps its folders under this run's own var dir.
BROKER_DIR = Path(tempfile.gettempdir()) / f"tenure-transports-{RUN}"

REDIS = os.environ.get("TENURE_TEST_REDIS_URL", "redis://127.0.0.1:6379").rstrip("/")
AMQP = os.environ.get("TENURE_TEST_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672//")


@dataclass(frozen=True)
class Spec:
    """One transport under test: what ``TENURE_TRANSPORT`` says and which broker it uses."""

    id: str
    transport: str
    url: str = ""

    @property
    def carries_messages(self) -> bool:
        """Whether wake-ups travel as broker messages (everything but the polling executor)."""
        return self.transport != "polling"

    @property
    def broker_transport(self) -> str | None:
        """The kombu transport class the example settings pick for this broker, if any."""
        if self.url.startswith("filesystem"):
            return "scheduler_core.transports.filesystem_broker:Transport"
        return None

    @property
    def broker_options(self) -> dict[str, Any]:
        """kombu transport options (the filesystem broker's folders)."""
        if not self.url.startswith("filesystem"):
            return {}
        folder = BROKER_DIR / "broker" / "queue"  # where settings.py puts it under VAR_DIR
        folder.mkdir(parents=True, exist_ok=True)
        control = BROKER_DIR / "broker" / "control"
        control.mkdir(parents=True, exist_ok=True)
        return {
            "data_folder_in": str(folder),
            "data_folder_out": str(folder),
            "control_folder": str(control),
            "polling_interval": 0.05,
        }


SPECS = {
    s.id: s
    for s in (
        Spec("polling", "polling"),
        Spec("celery-filesystem", "celery", "filesystem://"),
        Spec("celery-redis", "celery", f"{REDIS}/11"),
        Spec("celery-rabbitmq", "celery", AMQP),
        Spec("rq-redis", "rq", f"{REDIS}/12"),
    )
}


def _reachable(url: str) -> bool:
    parsed = urlparse(url)
    if parsed.scheme == "filesystem":
        return True
    default = 5672 if parsed.scheme.startswith("amqp") else 6379
    try:
        with socket.create_connection((parsed.hostname or "127.0.0.1", parsed.port or default), 2):
            return True
    except OSError:
        return False


def descendants(pid: int) -> list[int]:
    """Every live process below ``pid`` (children, grandchildren, ...), read from /proc."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry))
    found: list[int] = []
    stack = [pid]
    while stack:
        for child in children.get(stack.pop(), []):
            found.append(child)
            stack.append(child)
    return found


def kill_tree(pid: int, sig: int = signal.SIGKILL) -> None:
    """Send ``sig`` to ``pid`` and everything below it (RQ horses leave the process group)."""
    for p in [pid, *descendants(pid)]:
        with contextlib.suppress(ProcessLookupError):
            os.kill(p, sig)


class Harness:
    """Drives one transport: workers, the scheduler, hints, and the broker queue itself."""

    def __init__(self, spec: Spec, child_env: dict[str, str], tmp_path: Path) -> None:
        self.spec = spec
        self.tmp_path = tmp_path
        self.procs: list[subprocess.Popen[bytes]] = []
        self.logs: list[Path] = []
        self.env = dict(child_env)
        self.env.update(
            TENURE_TRANSPORT=spec.transport,
            TENURE_JOB_MODULES="tests.transports.jobs",
            TENURE_BROKER_QUEUE_PREFIX=PREFIX,
            TENURE_REDISPATCH_AFTER_SECONDS="0.5",
            TENURE_REAP_GRACE_SECONDS="0",
            TENURE_SWEEP_INTERVAL="0.2",
            TENURE_POLL_INTERVAL="0.1",
        )
        if spec.transport == "celery":
            self.env["CELERY_BROKER_URL"] = spec.url
            if spec.broker_options:
                self.env["TENURE_VAR_DIR"] = str(BROKER_DIR)
        if spec.transport == "rq":
            self.env["RQ_REDIS_URL"] = spec.url

    # -- processes ------------------------------------------------------------------------
    def _start(self, argv: list[str], name: str) -> subprocess.Popen[bytes]:
        log = self.tmp_path / f"{name}-{len(self.procs)}.log"
        self.logs.append(log)
        p = subprocess.Popen(
            argv,
            env=self.env,
            cwd=ROOT,
            stdout=open(log, "wb"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.procs.append(p)
        return p

    def start_worker(self, concurrency: int = 2) -> subprocess.Popen[bytes]:
        """Start one worker of this transport on the test queue."""
        n = len(self.procs)
        if self.spec.transport == "polling":
            argv = [PYTHON, "manage.py", "run_executor", "--queues", QUEUE]
            argv += ["--concurrency", str(concurrency)]
        elif self.spec.transport == "celery":
            argv = [CELERY, "-A", "config", "worker", "-Q", BROKER_QUEUE, "--pool", "prefork"]
            argv += ["-c", str(concurrency), "--loglevel", "INFO", "-n", f"w{n}-{RUN}@%h"]
            argv += ["--without-gossip", "--without-mingle", "--without-heartbeat"]
        else:
            argv = [
                PYTHON,
                "manage.py",
                "rqworker",
                BROKER_QUEUE,
                "--name",
                f"w{n}-{RUN}-{uuid.uuid4().hex[:6]}",
            ]
        p = self._start(argv, "worker")
        if self.spec.carries_messages:
            self._wait_registered(p)
        return p

    def _wait_registered(self, p: subprocess.Popen[bytes]) -> None:
        """Wait until the worker is a live consumer of the test queue in the executor
        registry: hints go only to queues a live worker consumes, so an enqueue before that
        would leave its job to the dispatcher (as it does in production)."""
        from scheduler_core.models import Executor

        def registered() -> bool:
            if p.poll() is not None:
                raise AssertionError(f"the worker exited ({p.returncode}):\n{self.log_text()}")
            return Executor.objects.filter(
                transport=self.spec.transport,
                stopped_at__isnull=True,
                queues__contains=BROKER_QUEUE,
            ).exists()

        deadline = time.monotonic() + 60
        while not registered():
            if time.monotonic() > deadline:
                raise AssertionError(f"the worker never registered:\n{self.log_text()}")
            time.sleep(0.1)
        hints.CONSUMERS.forget()

    def start_scheduler(self) -> subprocess.Popen[bytes]:
        """Start ``run_scheduler`` (reaper and dispatcher) with a short sweep interval."""
        return self._start([PYTHON, "manage.py", "run_scheduler", "--interval", "0.2"], "scheduler")

    def scheduler_once(self, **env: str) -> str:
        """Run one ``run_scheduler --once`` round (``env`` added) and return its output."""
        out = subprocess.run(
            [PYTHON, "manage.py", "run_scheduler", "--once"],
            env={**self.env, **env},
            cwd=ROOT,
            capture_output=True,
            timeout=60,
            check=True,
        )
        return (out.stdout + out.stderr).decode(errors="replace")

    def log_text(self) -> str:
        """Everything every started process has written so far."""
        return "".join(p.read_text(errors="replace") for p in self.logs if p.exists())

    def stop_all(self) -> None:
        """SIGKILL every process started, with everything under it."""
        for p in self.procs:
            kill_tree(p.pid)
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=10)

    # -- the broker ------------------------------------------------------------------------
    def publish(self, job_id: int) -> None:
        """Deliver one more hint for ``job_id`` exactly as the dispatcher would."""

        if self.spec.carries_messages:
            assert hints.publish(job_id, QUEUE), "the broker refused the hint"

    def queue_length(self) -> int:
        """Messages waiting on the test queue (0 for the broker-less executor)."""
        if self.spec.transport == "celery":
            with kombu_queue(self.spec) as (conn, q):
                return int(q(conn.default_channel).queue_declare().message_count)
        if self.spec.transport == "rq":
            import redis
            import rq

            return int(rq.Queue(BROKER_QUEUE, connection=redis.Redis.from_url(self.spec.url)).count)
        return 0

    def purge(self) -> None:
        """Throw away every message on the test queue: lost hints."""
        if self.spec.transport == "celery":
            with kombu_queue(self.spec) as (conn, q):
                bound = q(conn.default_channel)
                bound.declare()
                bound.purge()
        elif self.spec.transport == "rq":
            import redis

            conn = redis.Redis.from_url(self.spec.url)
            for key in conn.scan_iter(f"rq:*{BROKER_QUEUE}*"):
                conn.delete(key)


@contextlib.contextmanager
def kombu_queue(spec: Spec) -> Iterator[tuple[Any, Any]]:
    """A kombu connection to ``spec``'s broker and the test queue, declared as Celery does."""
    from kombu import Connection, Exchange, Queue

    queue = Queue(BROKER_QUEUE, Exchange(BROKER_QUEUE, type="direct"), routing_key=BROKER_QUEUE)
    with Connection(
        spec.url,
        connect_timeout=5,
        transport=spec.broker_transport,
        transport_options=spec.broker_options,
    ) as conn:
        yield conn, queue


@contextlib.contextmanager
def _celery_app(spec: Spec) -> Iterator[Any]:
    """A Celery app on ``spec``'s broker, current for this thread, so hints go there."""
    from celery import Celery
    from celery._state import get_current_app

    previous = get_current_app()
    app = Celery("tenure-transport-tests", set_as_current=True)
    app.conf.update(
        broker_url=spec.url,
        broker_transport=spec.broker_transport,
        broker_transport_options=spec.broker_options,
        task_serializer="json",
        accept_content=["json"],
        task_ignore_result=True,
        broker_connection_retry_on_startup=True,
    )
    try:
        yield app
    finally:
        app.close()
        previous.set_current()


def pytest_generate_tests(metafunc: Any) -> None:
    """The SIGKILL case runs once per process a contract class says to kill."""
    if "target" in metafunc.fixturenames and metafunc.cls is not None:
        metafunc.parametrize("target", metafunc.cls.kill_targets)


@pytest.fixture
def transport(
    request: Any, child_env: dict[str, str], tmp_path: Path, settings: Any
) -> Iterator[Harness]:
    """The harness for the test class's transport; this process enqueues with it too."""
    spec = SPECS[request.cls.spec_id]
    if spec.url and not _reachable(spec.url):
        msg = f"{spec.id}: broker at {spec.url} is not reachable"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"{msg} (CI=true: every broker is required)")
        pytest.skip(f"{msg}; start it, or set CI=true to make this a failure")
    settings.TENURE_TRANSPORT = spec.transport
    settings.TENURE_BROKER_QUEUE_PREFIX = PREFIX
    harness = Harness(spec, child_env, tmp_path)
    with contextlib.ExitStack() as stack:
        if spec.transport == "celery":
            stack.enter_context(_celery_app(spec))
        if spec.transport == "rq":
            settings.RQ_QUEUES = {
                BROKER_QUEUE: {"URL": spec.url, "SERIALIZER": "rq.serializers.JSONSerializer"}
            }
        harness.purge()
        try:
            yield harness
        finally:
            harness.stop_all()
            report = getattr(request.node, "rep_call", None)
            if report is not None and report.failed:
                # Shown with the failure: what the workers and the scheduler said.
                print(f"--- logs of {spec.id} ---\n{harness.log_text()[-20000:]}")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: Any, call: Any) -> Iterator[None]:
    """Keep the call phase's report on the item, so fixtures can tell a failed test."""
    outcome = yield
    report = outcome.get_result()
    if report.when == "call":
        item.rep_call = report


@pytest.fixture(scope="session", autouse=True)
def _delete_run_queues() -> Iterator[None]:
    """Remove what this run left on the brokers: queues (RabbitMQ keeps durable ones), kombu
    bindings, RQ worker records and the RQ hashes of hints whose horse was killed."""
    yield
    for spec in SPECS.values():
        if not spec.url or not _reachable(spec.url):
            continue
        if spec.url.startswith("filesystem"):
            shutil.rmtree(BROKER_DIR, ignore_errors=True)
            continue
        if spec.url.startswith("amqp"):
            with contextlib.suppress(Exception), kombu_queue(spec) as (conn, q):
                q(conn.default_channel).delete()
            continue
        import redis

        _forget_run(redis.Redis.from_url(spec.url))


def _forget_run(conn: Any) -> None:
    """Delete this run's keys from a Redis broker database, and its entries in shared ones."""
    mark = RUN.encode()
    for key in conn.scan_iter(f"*{RUN}*"):
        conn.delete(key)
    # Celery's unacknowledged copies of hints whose worker was SIGKILLed.
    for tag, body in conn.hscan_iter("unacked"):
        if mark in body:
            conn.hdel("unacked", tag)
            conn.zrem("unacked_index", tag)
    for index in ("rq:queues", "rq:workers"):
        mine = [m for m in conn.smembers(index) if mark in m]
        if mine:
            conn.srem(index, *mine)
    mine = [m for m in conn.zrange("_kombu.binding_deadlines", 0, -1) if mark in m]
    if mine:
        conn.zrem("_kombu.binding_deadlines", *mine)
    # RQ hashes of hints whose horse was killed (their ids do not name the run).
    ours = [
        key.decode().rsplit(":", 1)[1]
        for key in conn.scan_iter("rq:job:*")
        if conn.type(key) == b"hash" and conn.hget(key, "origin") == BROKER_QUEUE.encode()
    ]
    for rq_id in ours:
        for key in conn.scan_iter(f"rq:*{rq_id}*"):
            conn.delete(key)


__all__ = ["BROKER_QUEUE", "QUEUE", "SPECS", "Harness", "Spec", "descendants", "kombu_queue"]
