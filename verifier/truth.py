"""The destinations' own records: how many times each effect key really happened, and where.

The demo destinations log every effect they apply — the payment provider's charges and
transfers, the second provider's charges, the SMTP sink's messages, the ledger's credits —
with the effect key that caused it. These counts are the ground truth the verifier holds the
scheduler's ledger against. The keys are read from the records as they are (the checker gets
each job's keys from its ledger rows), never rebuilt.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import Any

from django.db.models import Count

DESTINATIONS = ("ledger", "pay", "pay2", "mail")
"""Where effects land: the job database's ledger (transactional), the payment provider
(charges and transfers), the second payment provider (charges by a fallback that keeps its
own keys) and the SMTP sink."""


def _chunks(items: list[str], size: int = 2000) -> Iterable[list[str]]:
    for i in range(0, len(items), size):
        yield items[i : i + size]


def _sources() -> list[tuple[str, Any, str]]:
    from demo.models import Charge, LedgerEntry, MailMessage, SecondCharge

    return [
        ("ledger", LedgerEntry.objects.all(), "effect_key"),
        ("pay", Charge.objects.filter(endpoint__in=("charge", "transfer")), "key"),
        ("pay2", SecondCharge.objects.all(), "key"),
        ("mail", MailMessage.objects.all(), "effect_key"),
    ]


def applied_by_destination(keys: Iterable[str] | None = None) -> dict[str, Counter[str]]:
    """Effects applied per destination and key (every key when ``keys`` is None)."""
    out: dict[str, Counter[str]] = {name: Counter() for name in DESTINATIONS}
    wanted = None if keys is None else sorted(set(keys))
    for name, qs, field in _sources():
        batches: Iterable[list[str] | None] = [None] if wanted is None else _chunks(wanted)
        for batch in batches:
            q = qs if batch is None else qs.filter(**{f"{field}__in": batch})
            for row in q.values(field).annotate(n=Count("id")):
                if row[field]:
                    out[name][row[field]] += row["n"]
    return out


def applied_counts(keys: Iterable[str] | None = None) -> Counter[str]:
    """Effects applied per key at all destinations together (every key when ``keys`` is
    None)."""
    out: Counter[str] = Counter()
    for counts in applied_by_destination(keys).values():
        out.update(counts)
    return out


def requests_by_outcome() -> dict[str, Counter[str]]:
    """The payment providers' request log: per endpoint, how each request was answered."""
    from demo.models import ProviderRequest

    out: dict[str, Counter[str]] = {}
    for row in ProviderRequest.objects.values("endpoint", "outcome").annotate(n=Count("id")):
        out.setdefault(row["endpoint"], Counter())[row["outcome"]] += row["n"]
    return out


def replayed_keys() -> set[str]:
    """Keys a payment provider answered from its idempotency store at least once."""
    from demo.models import ProviderRequest

    return set(
        ProviderRequest.objects.filter(outcome="replayed").values_list("key", flat=True).distinct()
    )


def turned_away(endpoint: str = "charge") -> Counter[str]:
    """Per key, how many requests ``endpoint`` answered 503 without looking at them."""
    from demo.models import ProviderRequest

    rows = (
        ProviderRequest.objects.filter(endpoint=endpoint, outcome="unavailable")
        .values("key")
        .annotate(n=Count("id"))
    )
    return Counter({row["key"]: row["n"] for row in rows})
