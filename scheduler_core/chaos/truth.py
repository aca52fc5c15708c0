"""The destinations' own records: how many times each effect key really happened.

The demo destinations log every effect they apply — the provider's charges and transfers, the
SMTP sink's messages, the ledger's credits — with the effect key that caused it. These
counts are the ground truth the verifier holds the scheduler's ledger against.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from django.db.models import Count

EFFECT_TABLE = {
    "credit": "ledger",
    "charge": "charge",
    "transfer": "transfer",
    "email": "mail",
}
"""Effect name -> the destination record that shows it."""


def effect_name(key: str) -> str:
    """The effect name of a key ``tenure-<job>-<name>``."""
    parts = key.split("-", 2)
    return parts[2] if len(parts) == 3 else ""


def _chunks(items: list[str], size: int = 2000) -> Iterable[list[str]]:
    for i in range(0, len(items), size):
        yield items[i : i + size]


def applied_counts(keys: Iterable[str] | None = None) -> Counter[str]:
    """Effects applied per key at the destinations (every key when ``keys`` is None)."""
    from demo.models import Charge, LedgerEntry, MailMessage

    out: Counter[str] = Counter()
    wanted = None if keys is None else sorted(set(keys))
    sources = [
        (LedgerEntry.objects.all(), "effect_key"),
        (Charge.objects.filter(endpoint="charge"), "key"),
        (Charge.objects.filter(endpoint="transfer"), "key"),
        (MailMessage.objects.all(), "effect_key"),
    ]
    for qs, field in sources:
        batches: Iterable[list[str] | None] = [None] if wanted is None else _chunks(wanted)
        for batch in batches:
            q = qs if batch is None else qs.filter(**{f"{field}__in": batch})
            for row in q.values(field).annotate(n=Count("id")):
                if row[field]:
                    out[row[field]] += row["n"]
    return out


def requests_by_outcome() -> dict[str, Counter[str]]:
    """The provider's request log: per endpoint, how each request was answered."""
    from demo.models import ProviderRequest

    out: dict[str, Counter[str]] = {}
    for row in ProviderRequest.objects.values("endpoint", "outcome").annotate(n=Count("id")):
        out.setdefault(row["endpoint"], Counter())[row["outcome"]] += row["n"]
    return out


def replayed_keys() -> set[str]:
    """Keys the provider answered from its idempotency store at least once."""
    from demo.models import ProviderRequest

    return set(
        ProviderRequest.objects.filter(outcome="replayed").values_list("key", flat=True).distinct()
    )
