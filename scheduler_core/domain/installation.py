"""An installation's name and the database identity it was made for: what an installation id
may contain, how a new one is made, and how a database's identity is compared with the one
recorded when the id was made (a restored or cloned database must not silently keep the
original's id, or both send the same effect keys to a shared destination)."""

from __future__ import annotations

import secrets
from collections.abc import Mapping

INSTALLATION_ID_CHARS = frozenset(
    "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-"
)
"""What an installation id may contain: never ``:``, the effect key's separator."""

Identity = Mapping[str, str]
"""A database's identity as its driver reads it, e.g. ``{"vendor": "postgresql",
"system_identifier": ..., "database_oid": ..., "database": ...}``; empty when unreadable."""

_WHAT_DIFFERS = {
    "system_identifier": (
        "another PostgreSQL cluster (a dump restored into another server, a copy for staging, "
        "or a major-version upgrade, which makes a new cluster)"
    ),
    "database_oid": (
        "another database of this cluster (restored from a dump, copied with CREATE DATABASE "
        "... TEMPLATE, or dropped and created again)"
    ),
    "database": "a database of another name (a copy, or this one renamed)",
    "file": "another SQLite file (a copy, or this one moved)",
    "inode": "another file at the same path (a copy, or a backup put in its place)",
}


def check_installation_id(value: str) -> str:
    """``value`` if it can name an installation in effect keys; else ``ValueError``."""
    if (
        not isinstance(value, str)
        or not 1 <= len(value) <= 40
        or not set(value) <= (INSTALLATION_ID_CHARS)
    ):
        raise ValueError(
            f"installation id {value!r} must be 1..40 letters, digits, '.', '_' or '-'"
        )
    return value


def new_installation_id(*, avoid: str = "") -> str:
    """A new random installation id (12 hex digits), never ``avoid``."""
    while True:
        made = secrets.token_hex(6)
        if made != avoid:
            return made


def identity_differences(recorded: Identity, current: Identity) -> list[str]:
    """How ``current`` differs from ``recorded``, one phrase a difference; empty when they
    agree or cannot be compared. Only the parts both sides could read are compared: a
    database whose identity was not recorded, or cannot be read now, says nothing."""
    if not recorded or not current:
        return []
    if recorded.get("vendor") != current.get("vendor"):
        return [
            f"another kind of database ({recorded.get('vendor', '?')} recorded, "
            f"{current.get('vendor', '?')} now)"
        ]
    out = []
    for part, meaning in _WHAT_DIFFERS.items():
        was, now = recorded.get(part, ""), current.get(part, "")
        if was and now and was != now:
            out.append(f"{meaning}: {part} {was} recorded, {now} now")
    return out


def describe_identity(identity: Identity) -> str:
    """One line naming ``identity``'s parts, for people."""
    if not identity:
        return "not known"
    return ", ".join(f"{k}={v}" for k, v in identity.items())


def mismatch_text(*, in_force: str, configured: bool, differences: list[str]) -> str:
    """What an operator is told when this database is not the one its installation id was
    recorded for, and what to do about it."""
    said = "; ".join(differences)
    if configured:
        return (
            f"this database is not the one its installation identity was recorded for ({said}). "
            f"TENURE_INSTALLATION_ID={in_force!r} is in force, so new effect keys carry it: make "
            "sure no other copy of this database runs with the same value, then run "
            "`manage.py installation adopt --reason ...` to record this database's identity."
        )
    return (
        f"this database is not the one installation id {in_force!r} was made for ({said}), "
        "and new effect keys still carry that id. If it runs beside the original (a clone for "
        "staging, a restore to test), run `manage.py installation regenerate --reason ...` so "
        "its effects get keys of their own; if it replaces the original (restored in its "
        "place, moved, renamed, upgraded), run `manage.py installation adopt --reason ...`, "
        "so the same work keeps its keys."
    )
