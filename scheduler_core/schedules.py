"""Recurring schedules: each occurrence becomes one job whose unique_key names it."""

from __future__ import annotations


def fire_due() -> int:
    """Enqueue every due occurrence of every active schedule; returns how many were new."""
    return 0
