"""``manage.py jobs retry|resolve|cancel``: the dashboard's guarded actions from the command line.

Run as ``manage.py`` runs a command (``run_from_argv``: the exit status and stderr are what a
shell sees), against jobs made through the real write seam. Every action goes through the
same service function as the dashboard, is audited with ``cli:<OS user>`` as the actor, asks
for the verified fact exactly where the dashboard does, and a refusal exits non-zero with the
store's reason on stderr and changes nothing.

Each test fails on the code before the command existed."""

from __future__ import annotations

import getpass
from typing import Any

import pytest

from scheduler_core.domain import states
from scheduler_core.management.commands.jobs import EXIT_CONFLICT, EXIT_REFUSED, Command
from scheduler_core.models import AuditEntry, Effect, Job
from tests.ui import factories as f

pytestmark = pytest.mark.django_db(transaction=True)


def jobs_cli(capsys: Any, *args: str) -> tuple[int, str, str]:
    """``manage.py jobs <args>``: exit status, stdout, stderr."""
    capsys.readouterr()
    try:
        Command().run_from_argv(["manage.py", "jobs", *args])
        code = 0
    except SystemExit as e:
        code = int(e.code or 0)
    out = capsys.readouterr()
    return code, out.out, out.err


def snapshot() -> list[tuple[Any, ...]]:
    jobs = list(Job.objects.order_by("pk").values_list("pk", "state", "version"))
    effects = list(Effect.objects.order_by("pk").values_list("pk", "state"))
    return [*jobs, *effects, ("audit", AuditEntry.objects.count())]


@pytest.fixture
def os_user(monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setattr(getpass, "getuser", lambda: "alice")
    return "cli:alice"


def test_retry_a_failed_job_prints_what_changed_and_audits_the_os_user(
    capsys: Any, os_user: str
) -> None:
    j = f.failed()
    code, out, err = jobs_cli(capsys, "retry", str(j.pk), "--reason", "card replaced")
    assert (code, err) == (0, "")
    assert f"job {j.pk}: failed -> waiting" in out and os_user in out
    row = Job.objects.get(pk=j.pk)
    assert row.state == "waiting"
    audit = AuditEntry.objects.get(job=j)
    assert (audit.actor, audit.action, audit.reason) == (os_user, "retry", "card replaced")
    assert audit.detail["transition"] == states.OP_RETRY.name


def test_the_actor_is_the_operating_system_user(capsys: Any) -> None:
    j = f.failed()
    assert jobs_cli(capsys, "retry", str(j.pk), "--reason", "r")[0] == 0
    assert AuditEntry.objects.get(job=j).actor == f"cli:{getpass.getuser()}"


def test_resolve_needs_the_verified_fact_and_records_it(capsys: Any, os_user: str) -> None:
    j = f.indeterminate("ui.charge")
    before = snapshot()
    code, out, err = jobs_cli(capsys, "resolve", str(j.pk), "--reason", "seen at the bank")
    assert code == EXIT_REFUSED and out == ""
    assert "verified=applied" in err and "--verified" in err
    assert snapshot() == before
    code, out, err = jobs_cli(
        capsys,
        "resolve",
        str(j.pk),
        "--reason",
        "seen at the bank",
        "--verified",
        "applied",
        "--effect",
        "charge",
    )
    assert (code, err) == (0, "")
    assert "indeterminate -> succeeded" in out and "verified applied: charge" in out
    assert Job.objects.get(pk=j.pk).state == "succeeded"
    assert Effect.objects.get(job=j).state == Effect.APPLIED
    audit = AuditEntry.objects.get(job=j)
    assert (audit.actor, audit.verified) == (os_user, "applied")


def test_retry_asks_for_a_fact_exactly_where_the_dashboard_does(capsys: Any) -> None:
    unknown = f.with_unknown_effect(states.FAIL)  # failed, its effect outcome unknown
    before = snapshot()
    code, _, err = jobs_cli(capsys, "retry", str(unknown.pk), "--reason", "r")
    assert code == EXIT_REFUSED and "needs the fact you verified" in err
    assert snapshot() == before
    code, out, _ = jobs_cli(
        capsys,
        "retry",
        str(unknown.pk),
        "--reason",
        "r",
        "--verified",
        "not_applied",
        "--effect",
        "charge",
    )
    assert code == 0 and "failed -> waiting" in out
    assert Effect.objects.get(job=unknown).state == Effect.NOT_APPLIED
    # A failed job with no unknown outcome takes no fact: stating one is refused.
    plain = f.failed()
    code, _, err = jobs_cli(
        capsys, "retry", str(plain.pk), "--reason", "r", "--fact", "applied", "--effect", "charge"
    )
    assert code == EXIT_REFUSED and "has none" in err
    # Same key only for an idempotent job.
    amo = f.indeterminate("ui.notify")
    code, _, err = jobs_cli(capsys, "retry", str(amo.pk), "--reason", "r", "--verified", "same_key")
    assert code == EXIT_REFUSED and "idempotent" in err
    assert Job.objects.get(pk=amo.pk).state == "indeterminate"


def test_cancel_a_waiting_job_at_once_and_ask_a_running_one_to_stop(
    capsys: Any, os_user: str
) -> None:
    waiting = f.enqueue()
    code, out, _ = jobs_cli(capsys, "cancel", str(waiting.pk), "--reason", "duplicate order")
    assert code == 0 and "waiting -> cancelled" in out
    assert Job.objects.get(pk=waiting.pk).state == "cancelled"
    running, _lease = f.running()
    code, out, _ = jobs_cli(capsys, "cancel", str(running.pk), "--reason", "hung on a vendor")
    assert code == 0
    # What happened, in words: the state did not move, so no "leased -> leased".
    assert "leased -> leased" not in out
    assert (
        "cancel requested: the running attempt stops at its next heartbeat (cancel_running" in out
    )
    assert "cancel requested at" in out
    row = Job.objects.get(pk=running.pk)
    assert row.state == "leased" and row.cancel_requested_at is not None
    audit = AuditEntry.objects.get(job=running)
    assert (audit.actor, audit.action) == (os_user, "cancel_running")
    # Asked once: a second request is refused and changes nothing.
    before = snapshot()
    code, _, err = jobs_cli(capsys, "cancel", str(running.pk), "--reason", "again")
    assert code == EXIT_REFUSED and "already requested" in err
    assert snapshot() == before


def test_refusals_exit_non_zero_with_the_reason_and_change_nothing(capsys: Any) -> None:
    done = f.succeeded()
    failed = f.failed()
    before = snapshot()
    code, out, err = jobs_cli(capsys, "cancel", str(done.pk), "--reason", "r")
    assert (code, out) == (EXIT_REFUSED, "")
    assert "cancel does not apply to a succeeded job" in err
    stale = str(failed.version - 1)
    code, _, err = jobs_cli(capsys, "retry", str(failed.pk), "--reason", "r", "--version", stale)
    assert code == EXIT_CONFLICT and "changed since version" in err
    code, _, err = jobs_cli(capsys, "retry", str(failed.pk), "--reason", "   ")
    assert code == EXIT_REFUSED and "a reason is required" in err
    code, _, err = jobs_cli(capsys, "retry", "999999", "--reason", "r")
    assert code == EXIT_REFUSED and "job 999999 does not exist" in err
    assert snapshot() == before
    # The version the operator names is the one checked: the current one goes through.
    code, _, _ = jobs_cli(
        capsys, "retry", str(failed.pk), "--reason", "r", "--version", str(failed.version)
    )
    assert code == 0


def test_a_reason_is_required_by_the_command_line_itself(capsys: Any) -> None:
    j = f.failed()
    code, _, err = jobs_cli(capsys, "retry", str(j.pk))
    assert code != 0 and "--reason" in err
    assert Job.objects.get(pk=j.pk).state == "failed"


def test_a_not_applied_fact_names_the_owners_it_accepts_by_fence(capsys: Any) -> None:
    """The command line acknowledges exactly the owners that may be in flight, by fence, as
    the dashboard's confirmation does (fails on the code before: a bare flag accepted any)."""
    j = f.reaped("ui.short_notify")
    fence = Job.objects.get(pk=j.pk).fence
    before = snapshot()
    code, _, err = jobs_cli(
        capsys, "retry", str(j.pk), "--reason", "r", "--fact", "not_applied", "--effect", "charge"
    )
    assert code == EXIT_REFUSED and "may still be in flight" in err
    assert f"--accept-in-flight {fence}" in err
    code, _, err = jobs_cli(
        capsys,
        "retry",
        str(j.pk),
        "--reason",
        "r",
        "--fact",
        "not_applied",
        "--effect",
        "charge",
        "--accept-in-flight",
        str(fence + 7),
    )
    assert code == EXIT_CONFLICT and f"showed fences {fence + 7}, now fences {fence}" in err
    assert snapshot() == before
    code, out, _ = jobs_cli(
        capsys,
        "retry",
        str(j.pk),
        "--reason",
        "r",
        "--fact",
        "not_applied",
        "--effect",
        "charge",
        "--accept-in-flight",
        str(fence),
    )
    assert code == 0 and "indeterminate -> waiting" in out


def test_cancel_states_the_fact_about_an_unknown_effect(capsys: Any) -> None:
    j = f.indeterminate("ui.charge", effects=("charge",))
    before = snapshot()
    code, _, err = jobs_cli(capsys, "cancel", str(j.pk), "--reason", "r")
    assert code == EXIT_REFUSED and "cancelled would hide" in err
    assert "--verified applied|not_applied" in err
    assert snapshot() == before
    code, out, _ = jobs_cli(
        capsys, "cancel", str(j.pk), "--reason", "r", "--fact", "applied", "--effect", "charge"
    )
    assert code == 0 and "indeterminate -> cancelled" in out
    assert Effect.objects.get(job=j).state == Effect.APPLIED


def test_a_fact_names_the_effect_it_is_about_even_the_only_one(capsys: Any) -> None:
    """The console's dialog ticks no effect for the operator; the command line implies none
    either (fails on the code before: a fact with no --effect settled the only unknown one)."""
    j = f.indeterminate("ui.charge")
    before = snapshot()
    for action, fact in (("resolve", "applied"), ("retry", "not_applied")):
        code, out, err = jobs_cli(capsys, action, str(j.pk), "--reason", "r", "--fact", fact)
        assert (code, out) == (EXIT_REFUSED, "")
        assert f"name each effect you verified {fact} (--effect NAME)" in err
        assert "the outcome of charge is unknown" in err
    assert snapshot() == before
    code, out, _ = jobs_cli(
        capsys, "resolve", str(j.pk), "--reason", "r", "--fact", "applied", "--effect", "charge"
    )
    assert code == 0 and "verified applied: charge" in out
