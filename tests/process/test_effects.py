"""The effect protocol with real executor processes, real crashes and pauses, and the demo
destinations' own logs as the ground truth: effects per key as each mode promises.

Every scenario runs one job of each mode side by side. Executors armed with a failpoint
(``TENURE_FAILPOINTS``, in their environment only) take one job each and crash or pause at
that point; then the reaper (``run_scheduler``) and a replacement executor without failpoints
finish the work. What is counted is what the destinations recorded: charges applied by the
payment provider, messages stored by the SMTP sink, entries in the job database's ledger.

Seeded (``TENURE_SEED``); ``TENURE_LONG=1`` repeats each scenario more times.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
from django.db import connection

from demo import jobs as demo_jobs
from demo.models import Charge, LedgerEntry, MailMessage, ProviderRequest
from scheduler_core.models import Attempt, Effect, Job, StaleWrite
from scheduler_core.services import operator
from scheduler_core.storage.drivers import driver
from tests import conftest
from tests.conftest import wait_until

pytestmark = [pytest.mark.process, pytest.mark.django_db(transaction=True)]

LONG = os.environ.get("TENURE_LONG") == "1"
ROUNDS = int(os.environ.get("TENURE_EFFECT_ROUNDS", "4" if LONG else "1"))
SEED = int(os.environ.get("TENURE_SEED", "1729"))

# Children: a short reaper grace and quick polling; the demo jobs lease for 3 seconds.
CHILD_ENV = {
    "TENURE_REAP_GRACE_SECONDS": "1",
    "TENURE_POLL_INTERVAL": "0.05",
    "TENURE_SWEEP_INTERVAL": "0.2",
}
SETTLED = ("succeeded", "failed", "indeterminate", "cancelled")


@dataclass(frozen=True)
class Mode:
    """One effect mode: its demo job, its effect's name and how to count it at the destination."""

    name: str
    enqueue: Callable[..., Job]
    effect: str
    delivered: Callable[[str], int]

    def key(self, job: Job) -> str:
        return driver().effect_key(job.pk, self.effect)


def _charges(key: str) -> int:
    return Charge.objects.filter(key=key).count()


def _mails(key: str) -> int:
    return MailMessage.objects.filter(effect_key=key).count()


def _ledger(key: str) -> int:
    return LedgerEntry.objects.filter(effect_key=key).count()


MODES = {
    "transactional": Mode(
        "transactional",
        lambda i, **kw: demo_jobs.ledger_credit.enqueue(account=f"acct-{i}", cents=100 + i),
        "credit",
        _ledger,
    ),
    "idempotent": Mode(
        "idempotent",
        lambda i, **kw: demo_jobs.charge.enqueue(invoice_id=i, cents=100 + i, **kw),
        "charge",
        _charges,
    ),
    "reconcilable": Mode(
        "reconcilable",
        lambda i, **kw: demo_jobs.charge_reconcilable.enqueue(invoice_id=i, cents=100 + i, **kw),
        "transfer",
        _charges,
    ),
    "at_least_once": Mode(
        "at_least_once",
        lambda i, **kw: demo_jobs.email.enqueue(to=f"user{i}@example.test", **kw),
        "email",
        _mails,
    ),
    "at_most_once": Mode(
        "at_most_once",
        lambda i, **kw: demo_jobs.email_at_most_once.enqueue(to=f"user{i}@example.test", **kw),
        "email",
        _mails,
    ),
}
EXTERNAL = [m for m in MODES.values() if m.name != "transactional"]


# ---------------------------------------------------------------------------------------------
# Processes
# ---------------------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _listening(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.2):
            return True
    except OSError:
        return False


@pytest.fixture
def env(spawn: Any) -> dict[str, str]:
    """Start the demo destinations; the environment executors need to reach them."""
    http, smtp = _free_port(), _free_port()
    spawn("run_destinations", "--http-port", str(http), "--smtp-port", str(smtp), log="dest.log")
    wait_until(lambda: _listening(http) and _listening(smtp), timeout=30)
    return {
        **CHILD_ENV,
        "DEMO_PAY_URL": f"http://127.0.0.1:{http}",
        "DEMO_SMTP": f"127.0.0.1:{smtp}",
    }


def _stopped(p: subprocess.Popen[bytes]) -> bool:
    try:
        with open(f"/proc/{p.pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "T"
    except FileNotFoundError:
        return False


def _armed(spawn: Any, env: dict[str, str], failpoints: str, n: int) -> list[Any]:
    """``n`` executors with failpoints, one job slot each: each takes one job and acts."""
    return [
        spawn("run_executor", "--concurrency", "1", env={**env, "TENURE_FAILPOINTS": failpoints})
        for _ in range(n)
    ]


def _recover(spawn: Any, env: dict[str, str]) -> list[Any]:
    """The reaper and a replacement executor without failpoints."""
    return [
        spawn("run_scheduler", "--interval", "0.2", env=env),
        spawn("run_executor", "--concurrency", "4", env=env),
    ]


def _end(procs: list[Any]) -> None:
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGCONT)
            p.kill()
        p.wait(timeout=10)


def _settled(ids: list[int], timeout: float = 90) -> None:
    wait_until(
        lambda: not Job.objects.filter(pk__in=ids).exclude(state__in=SETTLED).exists(),
        timeout=timeout,
        interval=0.1,
    )


def _enqueue(modes: list[Mode], rng: random.Random, **kw: Any) -> list[tuple[Mode, Job]]:
    order = list(modes)
    rng.shuffle(order)
    return [(m, m.enqueue(rng.randrange(1, 10**9), **kw)) for m in order]


# ---------------------------------------------------------------------------------------------
# What each mode promises, checked against the destination
# ---------------------------------------------------------------------------------------------


def _check(mode: Mode, job: Job, scenario: str) -> int:
    """Assert the mode's promise for one job; returns the effects counted at the destination."""
    job.refresh_from_db()
    key = mode.key(job)
    n = mode.delivered(key)
    eff = Effect.objects.filter(key=key).first()
    history = list(
        Attempt.objects.filter(job=job)
        .order_by("fence")
        .values_list("fence", "kind", "outcome", "message")
    )
    where = f"{scenario}/{mode.name} job {job.pk} ({job.state}: {job.reason}) attempts {history}"
    # No job ever has two accepted completions.
    assert Attempt.objects.filter(job=job, outcome="succeeded").count() <= 1, where
    if mode.name in ("transactional", "idempotent", "reconcilable"):
        assert n == 1, f"{where}: {n} effects"
        assert job.state == "succeeded", where
        assert eff is not None and eff.state == "applied", where
    elif mode.name == "at_least_once":
        assert n >= 1, f"{where}: no effect"
        assert job.state == "succeeded", where
        if n > 1:
            # Every duplicate is recorded, with its cause.
            assert eff is not None and eff.duplicate_possible, where
            assert "duplicate possible" in eff.note, where
    else:
        assert n <= 1, f"{where}: {n} effects"
        assert job.state in ("succeeded", "indeterminate"), where
        if job.state == "succeeded":
            assert n == 1, where
        else:
            assert eff is not None and eff.state == "unknown", where
    print(f"effects {scenario:<22} {mode.name:<14} {n}  {job.state}")
    return n


# ---------------------------------------------------------------------------------------------
# Crashes
# ---------------------------------------------------------------------------------------------


def _crash_scenario(
    spawn: Any,
    env: dict[str, str],
    failpoint: str,
    seed: int,
    modes: list[Mode] | None = None,
) -> dict[str, Any]:
    rng = random.Random(seed)
    pairs = _enqueue(list(MODES.values()) if modes is None else modes, rng)
    armed = _armed(spawn, env, f"{failpoint}=kill", len(pairs))
    # Each armed executor takes one job and kills itself at the failpoint.
    wait_until(lambda: all(p.poll() is not None for p in armed), timeout=60, interval=0.1)
    assert {p.returncode for p in armed} == {-signal.SIGKILL}
    helpers = _recover(spawn, env)
    _settled([j.pk for _, j in pairs])
    counts = {m.name: (_check(m, j, failpoint), j) for m, j in pairs}
    _end(helpers)
    return counts


@pytest.mark.parametrize("seed", range(SEED, SEED + ROUNDS))
def test_kill_before_the_effect_each_mode_keeps_its_promise(
    spawn: Any, env: dict[str, str], seed: int
) -> None:
    counts = _crash_scenario(spawn, env, "before_effect", seed)
    # Nothing was sent: at-most-once cannot know that, so it parks with no effect.
    n, amo = counts["at_most_once"]
    assert (n, amo.state) == (0, "indeterminate")
    assert counts["at_least_once"][0] == 1


@pytest.mark.parametrize("seed", range(SEED, SEED + ROUNDS))
def test_kill_after_the_effect_each_mode_keeps_its_promise(
    spawn: Any, env: dict[str, str], seed: int
) -> None:
    counts = _crash_scenario(spawn, env, "after_effect", seed)
    _, idem = counts["idempotent"]
    outcomes = ProviderRequest.objects.filter(key=MODES["idempotent"].key(idem))
    assert sorted(outcomes.values_list("outcome", flat=True)) == ["applied", "replayed"]
    # Reconcilable: the lookup found the transfer; it was never sent a second time.
    _, rec = counts["reconcilable"]
    key = MODES["reconcilable"].key(rec)
    assert ProviderRequest.objects.filter(key=key, endpoint="transfer").count() == 1
    # It settled the effect, and the job resumed: its run attempt skipped the applied transfer.
    assert Attempt.objects.filter(job=rec, kind="reconcile", outcome="reconciled").exists()
    assert rec.state == "succeeded"
    # At least once: the repeat happened and is on record.
    n, alo = counts["at_least_once"]
    assert n == 2
    assert Effect.objects.get(key=MODES["at_least_once"].key(alo)).duplicate_possible
    n, amo = counts["at_most_once"]
    assert (n, amo.state) == (1, "indeterminate")


@pytest.mark.parametrize("seed", range(SEED, SEED + ROUNDS))
def test_kill_before_the_completion_is_acknowledged_each_mode_keeps_its_promise(
    spawn: Any, env: dict[str, str], seed: int
) -> None:
    counts = _crash_scenario(spawn, env, "in_commit", seed)
    # The effect was applied and recorded before the crash: every mode skips it on the rerun.
    for name, (n, j) in counts.items():
        assert (n, j.state) == (1, "succeeded"), name


@pytest.mark.parametrize("seed", range(SEED, SEED + ROUNDS))
def test_kill_while_a_completion_waits_for_the_group_write_each_mode_keeps_its_promise(
    spawn: Any, env: dict[str, str], seed: int
) -> None:
    """The window completions written together open (``TENURE_EXECUTOR_GROUP_COMMIT``): the
    handler returned and handed its completion to the executor's loop, which is killed before
    its write. The job stays leased until its lease expires, then runs again; the effect was
    recorded before the crash, so every mode skips it on the rerun. (``transactional`` jobs
    commit with their handler and never wait for the group write.)"""
    counts = _crash_scenario(spawn, env, "before_group_commit", seed, modes=EXTERNAL)
    for name, (n, j) in counts.items():
        assert (n, j.state) == (1, "succeeded"), name
        # The first attempt's completion was lost with the process: a second attempt ran.
        assert Attempt.objects.filter(job=j, outcome="lease_expired").count() == 1, name


# ---------------------------------------------------------------------------------------------
# The destination applies the request, then the caller times out
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(SEED, SEED + ROUNDS))
def test_destination_applies_then_times_out_each_mode_keeps_its_promise(
    spawn: Any, env: dict[str, str], seed: int
) -> None:
    rng = random.Random(seed)
    pairs = _enqueue(EXTERNAL, rng, timeout=1.0, slow_reply_attempts=1)
    helpers = _recover(spawn, env)
    _settled([j.pk for _, j in pairs])
    counts = {m.name: (_check(m, j, "applied_then_timeout"), j) for m, j in pairs}
    _end(helpers)
    # Idempotent: one effect, and the retry got the same reply.
    _, idem = counts["idempotent"]
    outcomes = ProviderRequest.objects.filter(key=MODES["idempotent"].key(idem))
    assert sorted(outcomes.values_list("outcome", flat=True)) == ["applied", "replayed"]
    # Reconcilable: found by the lookup, not re-run.
    _, rec = counts["reconcilable"]
    key = MODES["reconcilable"].key(rec)
    assert ProviderRequest.objects.filter(key=key, endpoint="transfer").count() == 1
    # At least once: duplicate, recorded. At most once: parked.
    assert counts["at_least_once"][0] == 2
    n, amo = counts["at_most_once"]
    assert (n, amo.state) == (1, "indeterminate")


# ---------------------------------------------------------------------------------------------
# A stale attempt paused between its intent and its call
# ---------------------------------------------------------------------------------------------


def _stale_writes(job: Job, fence: int) -> bool:
    return StaleWrite.objects.filter(job_id=job.pk, fence=fence).exclude(write="heartbeat").exists()


@pytest.mark.parametrize("seed", range(SEED, SEED + ROUNDS))
def test_stale_attempt_paused_between_intent_and_call_resumes_after_its_replacement(
    spawn: Any, env: dict[str, str], seed: int
) -> None:
    rng = random.Random(seed)
    pairs = _enqueue(EXTERNAL, rng)
    armed = _armed(spawn, env, "before_effect=stop", len(pairs))
    wait_until(lambda: all(_stopped(p) for p in armed), timeout=60, interval=0.1)
    helpers = _recover(spawn, env)
    _settled([j.pk for _, j in pairs])
    for p in rng.sample(armed, len(armed)):
        p.send_signal(signal.SIGCONT)
        time.sleep(rng.random() * 0.2)
    # Each resumed attempt makes its call with its old fence, then every write it tries is
    # refused (by the destination's fence or by the ledger's).
    wait_until(lambda: all(_stale_writes(j, 1) for _, j in pairs), timeout=30, interval=0.1)
    counts = {m.name: (_check(m, j, "stale_resumed"), j) for m, j in pairs}
    _end(armed + helpers)
    for name in ("idempotent", "reconcilable"):
        key = MODES[name].key(counts[name][1])
        refused = ProviderRequest.objects.filter(key=key, fence=1, outcome="stale_fence")
        assert refused.exists(), f"{name}: the destination's fence stopped the late call"
    # Nothing can stop an unprotected email: the late copy arrives, and the ledger says so.
    n, alo = counts["at_least_once"]
    assert n == 2
    assert Effect.objects.get(key=MODES["at_least_once"].key(alo)).duplicate_possible
    n, amo = counts["at_most_once"]
    assert (n, amo.state) == (1, "indeterminate")


def test_an_operator_retry_while_the_reaped_owner_is_paused_before_its_send(
    spawn: Any, env: dict[str, str]
) -> None:
    """Fault 43 (docs/faults.md). Each at-most-once owner records its intent and stops before its send; the
    reaper parks the jobs; the operator finds nothing at the destinations. The retry is
    refused while the owners may be in flight; accepted anyway, the replacement sends, and the
    resumed owners send too: the SMTP sink (no fence) takes a second message, the fenced
    provider refuses the older fence. Only a destination that checks the fence closes it."""
    from scheduler_core.exceptions import ActionRefused
    from tests.process import jobs as proc_jobs

    env = {**env, "TENURE_JOB_MODULES": "tests.process.jobs"}
    mail = demo_jobs.email_at_most_once.enqueue(to="owner-in-flight@example.test")
    transfer = proc_jobs.transfer_at_most_once.enqueue(invoice_id=43)
    armed = _armed(spawn, env, "before_effect=stop", 2)
    wait_until(lambda: all(_stopped(p) for p in armed), timeout=60, interval=0.1)
    helpers = [spawn("run_scheduler", "--interval", "0.2", env=env)]
    _settled([mail.pk, transfer.pk])
    mail_key, transfer_key = (
        driver().effect_key(mail.pk, "email"),
        driver().effect_key(transfer.pk, "transfer"),
    )
    assert (_mails(mail_key), _charges(transfer_key)) == (0, 0)  # the operator finds nothing
    for j in (mail, transfer):
        j.refresh_from_db()
        assert j.state == "indeterminate"
        assert len(driver().in_flight_owners(j.pk)) == 1
        with pytest.raises(ActionRefused, match="may still be in flight"):
            operator.operator_action(
                j.pk,
                action="retry",
                expected_version=j.version,
                actor="olivia",
                reason="nothing at the destination",
                verified="not_applied",
            )
        operator.operator_action(
            j.pk,
            action="retry",
            expected_version=j.version,
            actor="olivia",
            reason="nothing at the destination; accepting the paused owner",
            verified="not_applied",
            accept_in_flight=True,
        )
    helpers.append(spawn("run_executor", "--concurrency", "2", env=env))
    wait_until(
        lambda: Job.objects.filter(pk__in=[mail.pk, transfer.pk], state="succeeded").count() == 2,
        timeout=60,
        interval=0.1,
    )
    for p in armed:
        p.send_signal(signal.SIGCONT)
    wait_until(lambda: _mails(mail_key) == 2, timeout=30, interval=0.1)
    wait_until(
        lambda: ProviderRequest.objects.filter(key=transfer_key, fence=1).exists(),
        timeout=30,
        interval=0.1,
    )
    _end(armed + helpers)
    refused = ProviderRequest.objects.get(key=transfer_key, fence=1)
    assert refused.outcome == "stale_fence"
    assert _charges(transfer_key) == 1


def test_transactional_attempt_paused_past_its_lease_commits_its_credit_once(
    spawn: Any, env: dict[str, str]
) -> None:
    mode = MODES["transactional"]
    job = mode.enqueue(1)
    [armed] = _armed(spawn, env, "before_effect=stop", 1)
    wait_until(lambda: _stopped(armed), timeout=60, interval=0.1)
    helpers = _recover(spawn, env)
    if connection.vendor == "postgresql":
        # The paused transaction holds no lock its replacement needs: the replacement
        # commits, and the resumed attempt's whole transaction rolls back at its completion.
        _settled([job.pk])
        armed.send_signal(signal.SIGCONT)
        wait_until(lambda: _stale_writes(job, 1), timeout=30, interval=0.1)
        # The replacement's fence (2, or later if a loaded machine made a replacement miss
        # its own short lease): never the paused attempt's.
        winner = Attempt.objects.get(job=job, outcome="succeeded").fence
        assert winner >= 2
    else:
        # SQLite has one writer: the paused attempt holds the write lock, so no one can take
        # over (or write anything) until it resumes and commits under its still-current fence.
        time.sleep(job.lease_seconds + 2)
        armed.send_signal(signal.SIGCONT)
        _settled([job.pk])
        winner = 1
    _check(mode, job, "stale_resumed")
    history = list(
        Attempt.objects.filter(job=job)
        .order_by("fence")
        .values_list("fence", "executor", "outcome", "error_type", "message")
    )
    assert list(LedgerEntry.objects.filter(job_id=job.pk).values_list("fence", flat=True)) == [
        winner
    ], history
    _end([armed, *helpers])


# ---------------------------------------------------------------------------------------------
# PostgreSQL: the connection breaks at COMMIT
# ---------------------------------------------------------------------------------------------


class _CommitReplyDropper:
    """A TCP proxy to PostgreSQL that drops the server's answer to one COMMIT.

    On the first connection that sent ``marker``, the next ``COMMIT`` is passed to the server
    (which commits) and its reply is thrown away; then both sides are cut. The client sees its
    connection die during COMMIT, not knowing whether the transaction landed.
    """

    def __init__(self, upstream: int, marker: bytes) -> None:
        import threading

        self.upstream = upstream
        self.marker = marker
        self.fired = threading.Event()
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = int(self.sock.getsockname()[1])
        self._threading = threading
        threading.Thread(target=self._accept, daemon=True).start()

    def close(self) -> None:
        self.sock.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.sock.accept()
            except OSError:
                return
            server = socket.create_connection(("127.0.0.1", self.upstream))
            state = {"marked": False, "drop": False}
            for target in (self._up, self._down):
                self._threading.Thread(
                    target=target, args=(client, server, state), daemon=True
                ).start()

    def _up(self, client: socket.socket, server: socket.socket, state: dict[str, bool]) -> None:
        try:
            while data := client.recv(65536):
                if not self.fired.is_set():
                    if self.marker in data:
                        state["marked"] = True
                    elif state["marked"] and b"COMMIT" in data:
                        self.fired.set()
                        state["drop"] = True
                        server.sendall(data)
                        time.sleep(0.5)  # the server commits and answers into the void
                        break
                server.sendall(data)
        except OSError:
            pass
        for s in (client, server):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            s.close()

    def _down(self, client: socket.socket, server: socket.socket, state: dict[str, bool]) -> None:
        try:
            while data := server.recv(65536):
                if not state["drop"]:
                    client.sendall(data)
        except OSError:
            pass


@pytest.mark.postgres
def test_connection_lost_during_commit_is_read_back_not_guessed(
    spawn: Any, env: dict[str, str], tmp_path: Any
) -> None:
    port = connection.settings_dict["PORT"]
    proxy = _CommitReplyDropper(int(port), b"demo_ledger_entry")
    log = tmp_path / "exec.log"
    try:
        job = MODES["transactional"].enqueue(7)
        # The executor reaches the database only through the proxy, over plain TCP so the
        # proxy can see the statements go by.
        proxied = conftest.test_database_url().replace(f":{port}/", f":{proxy.port}/")
        spawn(
            "run_executor",
            "--concurrency",
            "1",
            env={**env, "DATABASE_URL": proxied, "PGSSLMODE": "disable"},
            log="exec.log",
        )
        _settled([job.pk], timeout=60)
        wait_until(lambda: "read back: committed" in log.read_text(), timeout=30)
    finally:
        proxy.close()
    assert proxy.fired.is_set()
    _check(MODES["transactional"], job, "commit_reply_lost")
    # The commit had landed: the executor read that back instead of retrying or guessing.
    assert Attempt.objects.filter(job=job).count() == 1
    assert not StaleWrite.objects.filter(job_id=job.pk).exclude(write="heartbeat").exists()


@pytest.mark.postgres
def test_backend_terminated_before_commit_rolls_back_and_the_job_is_retried(
    spawn: Any, env: dict[str, str]
) -> None:
    job = MODES["transactional"].enqueue(8)
    [armed] = _armed(spawn, env, "in_commit=stop", 1)
    wait_until(lambda: _stopped(armed), timeout=60, interval=0.1)
    with connection.cursor() as cur:
        cur.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
            "AND state = 'idle in transaction' AND pid <> pg_backend_pid()"
        )
        pids = [r[0] for r in cur.fetchall()]
        assert len(pids) == 1, "the paused attempt's transaction is open"
        cur.execute("SELECT pg_terminate_backend(%s)", [pids[0]])
    armed.send_signal(signal.SIGCONT)
    first = Attempt.objects.filter(job=job, fence=1)
    wait_until(lambda: first.exclude(outcome="").exists(), timeout=30, interval=0.1)
    _end([armed])
    assert first.get().outcome == "retried"  # read back: not committed, still ours
    helpers = _recover(spawn, env)
    _settled([job.pk])
    _check(MODES["transactional"], job, "backend_terminated")
    assert LedgerEntry.objects.get(job_id=job.pk).fence > 1
    _end(helpers)


@pytest.mark.postgres
def test_an_executor_stopped_inside_its_completion_transaction_frees_the_job_for_the_reaper(
    spawn: Any, env: dict[str, str]
) -> None:
    # Stopped between the completion's write and COMMIT, the executor holds the job's row
    # lock; the server ends its idle transaction (EXECUTOR_IDLE_TX_TIMEOUT_MS), so the reaper,
    # which skips locked rows, rescues the job while the owner is still stopped.
    job = MODES["idempotent"].enqueue(9)
    frozen_env = {**env, "TENURE_EXECUTOR_IDLE_TX_TIMEOUT_MS": "500"}
    [armed] = _armed(spawn, frozen_env, "in_commit=stop", 1)
    wait_until(lambda: _stopped(armed), timeout=60, interval=0.1)
    helpers = _recover(spawn, env)
    first = Attempt.objects.filter(job=job, fence=1)
    wait_until(lambda: first.filter(outcome="lease_expired").exists(), timeout=30, interval=0.1)
    assert _stopped(armed), "rescued while its owner was still stopped"
    _settled([job.pk])
    armed.send_signal(signal.SIGCONT)
    time.sleep(1.0)  # the resumed owner finds its transaction ended; nothing of it lands
    _end([armed])
    _check(MODES["idempotent"], job, "stopped_in_commit")
    assert first.get().outcome == "lease_expired"
    assert Attempt.objects.filter(job=job, outcome="succeeded").exclude(fence=1).count() == 1
    _end(helpers)
