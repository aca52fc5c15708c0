"""Read-only registration of the record in Django's admin.

Nothing can be added, changed or deleted here: every write to a job goes through
``scheduler_core.storage`` (executors) or the operator dashboard's guarded actions.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest

from .models import (
    Attempt,
    AuditEntry,
    Effect,
    EffectEvent,
    Executor,
    Job,
    Schedule,
    StaleWrite,
)


class ReadOnlyAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    """A model admin that can only look."""

    actions = None

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(Job)
class JobAdmin(ReadOnlyAdmin):
    list_display = ("id", "name", "queue", "state", "effect", "attempts", "fence", "updated_at")
    list_filter = ("state", "spec__effect", "queue")
    list_select_related = ("spec",)
    search_fields = ("=id", "name", "unique_key")
    date_hierarchy = "created_at"


@admin.register(Attempt)
class AttemptAdmin(ReadOnlyAdmin):
    list_display = ("id", "job", "number", "fence", "kind", "outcome", "error_class", "claimed_at")
    list_filter = ("kind", "outcome", "error_class")
    search_fields = ("=job__id", "executor")
    raw_id_fields = ("job",)


@admin.register(Effect)
class EffectAdmin(ReadOnlyAdmin):
    list_display = (
        "key",
        "job",
        "name",
        "state",
        "in_doubt",
        "fence",
        "intents",
        "duplicate_possible",
    )
    list_filter = ("state", "in_doubt", "duplicate_possible")
    search_fields = ("key", "=job__id")
    raw_id_fields = ("job", "attempt")


@admin.register(EffectEvent)
class EffectEventAdmin(ReadOnlyAdmin):
    list_display = ("created_at", "effect", "fence", "event", "state_after", "in_doubt_after")
    list_filter = ("event",)
    search_fields = ("=effect__job__id", "effect__key")
    raw_id_fields = ("effect", "attempt")


@admin.register(AuditEntry)
class AuditEntryAdmin(ReadOnlyAdmin):
    list_display = (
        "created_at",
        "actor",
        "action",
        "verified",
        "job",
        "state_before",
        "state_after",
    )
    list_filter = ("action", "verified")
    search_fields = ("actor", "=job__id", "reason")
    raw_id_fields = ("job",)


@admin.register(Executor)
class ExecutorAdmin(ReadOnlyAdmin):
    list_display = (
        "id",
        "transport",
        "queues",
        "concurrency",
        "active",
        "heartbeat_at",
        "stopped_at",
    )
    list_filter = ("transport",)


@admin.register(Schedule)
class ScheduleAdmin(ReadOnlyAdmin):
    list_display = ("name", "job_name", "cron", "interval_seconds", "paused", "next_fire_at")
    list_filter = ("paused", "source")
    search_fields = ("name", "job_name")


@admin.register(StaleWrite)
class StaleWriteAdmin(ReadOnlyAdmin):
    list_display = ("created_at", "job_id", "fence", "write", "executor")
    list_filter = ("write",)
