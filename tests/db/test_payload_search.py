"""Payload search on both databases: a JSON fragment or a key path and value finds the jobs
whose payload contains it (nested keys, numbers never equal to strings); bad input is refused
with a message and lists nothing; on PostgreSQL the search reads the GIN index."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection, transaction

from admin_ui.forms import JobFilterForm
from scheduler_core import job
from scheduler_core.api import registry
from scheduler_core.domain import payload_search
from scheduler_core.models import Job
from scheduler_core.read.jobs import JobFilter
from scheduler_core.storage.drivers import driver

pytestmark = pytest.mark.django_db


def _any(ctx: Any, **payload: Any) -> None:
    """Never run: the tests read the store."""


job(name="search.charge", queue="billing", effect="at_least_once")(_any)


def _jobs() -> dict[str, int]:
    made = {
        "1005": {"invoice_id": 1005, "customer": {"email": "a@b.c", "tier": "gold"}},
        "1005s": {"invoice_id": "1005", "customer": {"email": "z@b.c"}},
        "1006": {"invoice_id": 1006, "customer": {"email": "a@b.c"}, "paid": True},
        "flag": {"invoice_id": 7, "paid": False, "note": None, "meta": {}},
        "one": {"invoice_id": 1, "paid": 1},
    }
    return {k: registry.enqueue("search.charge", p).pk for k, p in made.items()}


def _found(text: str) -> set[int]:
    return set(JobFilter(q=text).queryset().values_list("pk", flat=True))


def test_a_json_fragment_finds_the_jobs_whose_payload_contains_it() -> None:
    ids = _jobs()
    assert _found('{"invoice_id": 1005}') == {ids["1005"]}
    assert _found('{"customer": {"email": "a@b.c"}}') == {ids["1005"], ids["1006"]}
    assert _found('{"invoice_id": 1005, "customer": {"tier": "gold"}}') == {ids["1005"]}
    assert _found('{"invoice_id": 1005, "customer": {"tier": "silver"}}') == set()


def test_a_key_path_and_value_finds_the_same_jobs() -> None:
    ids = _jobs()
    assert _found("invoice_id=1005") == {ids["1005"]}
    assert _found("customer.email=a@b.c") == {ids["1005"], ids["1006"]}
    assert _found("customer.tier=gold") == {ids["1005"]}
    assert _found("customer.email=nobody@b.c") == set()


def test_numbers_never_equal_strings_nor_booleans_numbers() -> None:
    ids = _jobs()
    assert _found('invoice_id="1005"') == {ids["1005s"]}
    assert _found('{"invoice_id": "1005"}') == {ids["1005s"]}
    assert _found("invoice_id=1005.0") == {ids["1005"]}
    assert _found("paid=true") == {ids["1006"]}
    assert _found("paid=false") == {ids["flag"]}
    assert _found("paid=1") == {ids["one"]}
    assert _found("note=null") == {ids["flag"]}
    assert _found('{"meta": {}}') == {ids["flag"]}


def test_the_driver_condition_combines_with_other_filters() -> None:
    ids = _jobs()
    q = payload_search.parse("customer.email=a@b.c")
    qs = Job.objects.filter(driver().payload_contains(q), pk__gt=ids["1005"])
    assert set(qs.values_list("pk", flat=True)) == {ids["1006"]}


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ('{"invoice_id": 1005', "not valid JSON"),
        ("{'invoice_id': 1005}", "not valid JSON"),
        ("{}", "at least one key"),
        ('{"ids": [1, 2]}', "array"),
        ("ids=[1,2]", "array"),
        ('{"a\\"b": 1}', "cannot be searched"),
        ("invoice_id=99999999999999999999", "too large"),
        ("invoice_id=Infinity", "finite"),
        ('{"invoice_id": NaN}', "finite"),
    ],
)
def test_bad_input_is_refused_with_a_message_and_lists_nothing(text: str, says: str) -> None:
    _jobs()
    with pytest.raises(payload_search.PayloadQueryError, match=says):
        payload_search.parse(text)
    form = JobFilterForm({"q": text})
    assert not form.is_valid()
    assert says in " ".join(form.errors["q"])


def test_plain_text_is_still_an_id_or_unique_key_search() -> None:
    ids = _jobs()
    keyed = registry.enqueue("search.charge", {"invoice_id": 9}, unique_key="invoice-9-charge")
    assert not payload_search.looks_like_payload_query("invoice-9")
    assert _found("invoice-9") == {keyed.pk}
    assert _found(str(ids["1005"])) == {ids["1005"]}


@pytest.mark.postgres
def test_postgres_search_reads_the_gin_index() -> None:
    """The search reads the GIN index, which holds jobs in every state (waiting and leased
    ones too, unlike the state index)."""
    registry.enqueue_many(
        "search.charge", [{"invoice_id": n, "customer": {"email": f"{n}@b.c"}} for n in range(2000)]
    )
    Job.objects.exclude(spec__payload__invoice_id__in=[7, 8]).update(state="succeeded")
    Job.objects.filter(spec__payload__invoice_id=8).update(state="leased")
    for n in (7, 8):
        assert JobFilter(q=f"invoice_id={n}").queryset().count() == 1
    qs = JobFilter(q="invoice_id=1005").queryset()
    with transaction.atomic():
        with connection.cursor() as cur:
            cur.execute("ANALYZE tenure_job, tenure_job_spec")
            # Only whether the index can answer the condition is in question here; on a table
            # this small the planner may otherwise prefer reading it.
            cur.execute("SET LOCAL enable_seqscan = off")
        plan = qs.explain()
    assert "tenure_job_spec_payload" in plan, plan
    assert qs.count() == 1
