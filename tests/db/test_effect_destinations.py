"""Helpers for destinations: fencing tokens and idempotency keys, through the demo provider."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

import pytest
from django.db import transaction
from django.test import Client, RequestFactory
from django.utils import timezone

from demo.models import Charge, PaymentFence, PaymentKey, ProviderRequest
from scheduler_core.destinations import (
    FenceRefused,
    IdempotencyStore,
    check_fence,
    highest_token,
    request_fingerprint,
)

pytestmark = pytest.mark.django_db(transaction=True)


def _charge(client: Client, key: str, fence: int, cents: int = 500, **extra: str) -> Any:
    return client.post(
        "/demo/pay/charge/",
        data=json.dumps({"invoice_id": 1, "cents": cents}),
        content_type="application/json",
        headers={"Idempotency-Key": key, "Fencing-Token": str(fence), **extra},
    )


def test_fenced_write_refuses_a_token_lower_than_the_highest_seen() -> None:
    with transaction.atomic():
        check_fence(PaymentFence, "k", 2)
    with transaction.atomic():
        check_fence(PaymentFence, "k", 2)  # the same attempt may repeat itself
    with pytest.raises(FenceRefused), transaction.atomic():
        check_fence(PaymentFence, "k", 1)
    with transaction.atomic():
        check_fence(PaymentFence, "k", 5)
    assert highest_token(PaymentFence, "k") == 5


def test_a_refused_write_rolls_back_and_leaves_the_highest_token() -> None:
    with pytest.raises(RuntimeError), transaction.atomic():
        check_fence(PaymentFence, "k", 7)
        raise RuntimeError("the write failed")
    assert highest_token(PaymentFence, "k") is None


def test_same_key_same_request_replays_the_stored_response_with_one_effect() -> None:
    c = Client()
    first = _charge(c, "key-1", 1)
    again = _charge(c, "key-1", 2)  # an honest retry carries a newer fence
    assert first.status_code == again.status_code == 201
    assert again.json() == first.json()
    assert again["Idempotent-Replayed"] == "true"
    assert Charge.objects.filter(key="key-1").count() == 1
    assert list(
        ProviderRequest.objects.filter(key="key-1").order_by("pk").values_list("outcome", flat=True)
    ) == ["applied", "replayed"]


def test_same_key_different_request_is_refused_422_and_applies_nothing() -> None:
    c = Client()
    _charge(c, "key-2", 1, cents=500)
    r = _charge(c, "key-2", 1, cents=900)
    assert r.status_code == 422 and r.json()["error"] == "key_reused"
    assert list(Charge.objects.filter(key="key-2").values_list("cents", flat=True)) == [500]


def test_key_still_in_flight_answers_409_and_applies_nothing() -> None:
    store = IdempotencyStore(PaymentKey)
    same = RequestFactory().post(
        "/demo/pay/charge/",
        data=json.dumps({"invoice_id": 1, "cents": 500}),
        content_type="application/json",
    )
    fp = request_fingerprint(same)
    held = store.begin("key-3", fp)
    assert held.outcome == "new"
    r = _charge(Client(), "key-3", 1)
    assert r.status_code == 409 and r.json()["error"] == "in_flight"
    assert r["Retry-After"] == "1"
    assert not Charge.objects.filter(key="key-3").exists()


def test_stale_fence_is_refused_even_when_the_keys_answer_is_stored() -> None:
    c = Client()
    assert _charge(c, "key-4", 3).status_code == 201
    r = _charge(c, "key-4", 2)
    assert r.status_code == 409 and r.json()["error"] == "stale_fence"
    assert Charge.objects.filter(key="key-4").count() == 1


def test_lookup_answers_and_raises_the_fence_so_a_late_older_request_is_refused() -> None:
    c = Client()
    r = c.get("/demo/pay/lookup/?reference=ref-1", headers={"Fencing-Token": "2"})
    assert r.json() == {"status": "not_applied"}
    late = c.post(
        "/demo/pay/transfer/",
        data=json.dumps({"invoice_id": 1, "cents": 500}),
        content_type="application/json",
        headers={"Reference": "ref-1", "Fencing-Token": "1"},
    )
    assert late.status_code == 409 and late.json()["error"] == "stale_fence"
    assert not Charge.objects.filter(key="ref-1").exists()


def test_abandoned_in_flight_key_is_taken_over_and_the_late_first_request_rolls_back() -> None:
    store = IdempotencyStore(PaymentKey, in_flight_timeout=dt.timedelta(seconds=10))
    first = store.begin("key-5", "fp")
    later = timezone.now() + dt.timedelta(seconds=11)
    second = store.begin("key-5", "fp", now=later)
    assert second.outcome == "new" and second.claim != first.claim
    with pytest.raises(RuntimeError), transaction.atomic():
        Charge.objects.create(endpoint="charge", key="key-5", fence=1, invoice_id=1, cents=1)
        store.finish(first, status=201, content_type="application/json", body="{}")
    assert not Charge.objects.filter(key="key-5").exists()
    with transaction.atomic():
        store.finish(second, status=201, content_type="application/json", body="{}")
    assert store.begin("key-5", "fp", now=later).outcome == "replay"


def test_keys_are_forgotten_after_the_retention_window() -> None:
    store = IdempotencyStore(PaymentKey, retention=dt.timedelta(hours=1))
    s = store.begin("key-6", "fp")
    with transaction.atomic():
        store.finish(s, status=201, content_type="application/json", body="{}")
    assert store.begin("key-6", "fp").outcome == "replay"
    later = timezone.now() + dt.timedelta(hours=2)
    assert store.purge(now=later) == 1
    # Past retention the same key is new again: a job must stop retrying before that
    # (demo.charge declares max_age, and an ambiguous outcome past it parks the job).
    assert store.begin("key-6", "fp", now=later).outcome == "new"
