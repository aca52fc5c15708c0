"""The demo destinations' own tables: what they received and what they applied.

These are the ground truth the effect tests count against. The payment provider and the SMTP
sink run as their own process (``manage.py run_destinations``) and share the database only for
convenience; the job database's ledger (:class:`LedgerEntry`) is the transactional mode's
destination and belongs to the job database by design.

The second payment provider (``/demo/pay2/``, a fallback's destination) keeps its own keys,
fencing tokens and charges (``SecondPayment*``, :class:`SecondCharge`): it cannot know what
the first provider did with a key, which is what a fallback that does not share the effect key
means. Both providers log their requests in :class:`ProviderRequest`, by endpoint name.
"""

from __future__ import annotations

from django.db import models

from scheduler_core.destinations import FencedKeyBase, IdempotencyRecordBase


class PaymentKey(IdempotencyRecordBase):
    """The payment provider's idempotency keys and stored responses."""

    class Meta:
        db_table = "demo_payment_key"


class PaymentFence(FencedKeyBase):
    """The payment provider's highest fencing token per payment key."""

    class Meta:
        db_table = "demo_payment_fence"


class SecondPaymentKey(IdempotencyRecordBase):
    """The second payment provider's idempotency keys: its own, blind to the first's."""

    class Meta:
        db_table = "demo_pay2_key"


class SecondPaymentFence(FencedKeyBase):
    """The second payment provider's highest fencing token per payment key."""

    class Meta:
        db_table = "demo_pay2_fence"


class ProviderRequest(models.Model):
    """Every request the payment providers received (``endpoint`` names which), and how each
    was answered."""

    endpoint = models.CharField(max_length=30)
    key = models.CharField(max_length=300, db_index=True)
    fence = models.BigIntegerField(null=True)
    status = models.IntegerField(null=True)
    outcome = models.CharField(max_length=30, default="received")
    received_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        db_table = "demo_provider_request"

    def __str__(self) -> str:
        return f"{self.endpoint} {self.key} fence {self.fence}: {self.outcome}"


class Charge(models.Model):
    """One effect the payment provider applied. No unique key on purpose: duplicates show."""

    endpoint = models.CharField(max_length=30)
    key = models.CharField(max_length=300, db_index=True)
    fence = models.BigIntegerField()
    invoice_id = models.BigIntegerField()
    cents = models.BigIntegerField()
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        db_table = "demo_charge"

    def __str__(self) -> str:
        return f"charge {self.pk} {self.key} {self.cents}c"


class SecondCharge(models.Model):
    """One charge the second payment provider applied. No unique key: duplicates show."""

    key = models.CharField(max_length=300, db_index=True)
    fence = models.BigIntegerField()
    invoice_id = models.BigIntegerField()
    cents = models.BigIntegerField()
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        db_table = "demo_pay2_charge"

    def __str__(self) -> str:
        return f"second provider charge {self.pk} {self.key} {self.cents}c"


class MailMessage(models.Model):
    """Every message the SMTP sink accepted. No deduplication: duplicates show."""

    message_id = models.CharField(max_length=300, db_index=True)
    effect_key = models.CharField(max_length=300, db_index=True, blank=True, default="")
    mail_from = models.CharField(max_length=300)
    rcpt_to = models.TextField()
    subject = models.CharField(max_length=300, blank=True, default="")
    raw = models.TextField()
    received_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        db_table = "demo_mail_message"

    def __str__(self) -> str:
        return f"mail {self.message_id}"


class LedgerEntry(models.Model):
    """A credit written by the transactional job, in the job database's own transaction."""

    account = models.CharField(max_length=100)
    cents = models.BigIntegerField()
    effect_key = models.CharField(max_length=300, db_index=True)
    job_id = models.BigIntegerField()
    fence = models.BigIntegerField()
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        db_table = "demo_ledger_entry"

    def __str__(self) -> str:
        return f"ledger {self.account} +{self.cents}c ({self.effect_key})"
