"""Effect modes and the guarantee each gives, stated in one place."""

from __future__ import annotations

import enum
from dataclasses import dataclass


class EffectMode(enum.StrEnum):
    """How a job's business effect is protected (``@job(effect=...)``)."""

    TRANSACTIONAL = "transactional"
    IDEMPOTENT = "idempotent"
    RECONCILABLE = "reconcilable"
    AT_LEAST_ONCE = "at_least_once"
    AT_MOST_ONCE = "at_most_once"


@dataclass(frozen=True, kw_only=True)
class Guarantee:
    """What a mode promises about the effect, and what it needs from the destination."""

    mode: EffectMode
    mechanism: str
    promise: str
    needs: str
    on_ambiguity: str


GUARANTEES: dict[EffectMode, Guarantee] = {
    EffectMode.TRANSACTIONAL: Guarantee(
        mode=EffectMode.TRANSACTIONAL,
        mechanism="The handler's database writes and the fenced completion commit in one "
        "transaction.",
        promise="Exactly once, in this database.",
        needs="The effect is a write to the job database itself.",
        on_ambiguity="Nothing is ambiguous: a lost fence or crash rolls the writes back and the "
        "job is retried; a connection lost during COMMIT is read back, never guessed.",
    ),
    EffectMode.IDEMPOTENT: Guarantee(
        mode=EffectMode.IDEMPOTENT,
        mechanism="The effect key is sent as the idempotency key and the fence as a fencing "
        "token to a destination that deduplicates.",
        promise="Once, if the destination keeps keys longer than retries last.",
        needs="Destination deduplicates by key (and refuses lower fencing tokens).",
        on_ambiguity="Retried under the same key; the destination absorbs the repeat.",
    ),
    EffectMode.RECONCILABLE: Guarantee(
        mode=EffectMode.RECONCILABLE,
        mechanism="After an ambiguous outcome a reconcile attempt asks the destination what "
        "happened before anything is re-run.",
        promise="Once, when the destination can answer and its lookup fences out older "
        "requests; otherwise the job waits for an operator as indeterminate.",
        needs="A lookup by effect key at the destination (reconcile=...) that also fences out "
        "older requests: once it has answered, a request from an earlier attempt that arrives "
        "late must be refused (the lookup raises the key's fencing token), or a 'not applied' "
        "answer could be overtaken by that request.",
        on_ambiguity="Reconcile attempt: applied -> succeeded, not applied -> run again, "
        "unknown -> indeterminate.",
    ),
    EffectMode.AT_LEAST_ONCE: Guarantee(
        mode=EffectMode.AT_LEAST_ONCE,
        mechanism="Nothing the destination can check; ambiguous attempts are re-run.",
        promise="At least once: duplicates are possible, and each one is recorded.",
        needs="Nothing.",
        on_ambiguity="Re-run; the ledger records that a duplicate is possible.",
    ),
    EffectMode.AT_MOST_ONCE: Guarantee(
        mode=EffectMode.AT_MOST_ONCE,
        mechanism="Nothing the destination can check; ambiguous attempts are never re-run.",
        promise="At most once: the effect may be lost, and each such job is parked visibly.",
        needs="Nothing from the destination; an operator for each ambiguous attempt: the job "
        "is parked indeterminate until someone checks the destination and resolves, retries "
        "or gives it up.",
        on_ambiguity="Parked as indeterminate for an operator; never re-run automatically.",
    ),
}

MODE_CHOICES = [(m.value, m.value) for m in EffectMode]
