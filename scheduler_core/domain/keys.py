"""Effect keys: how the installation, the job and the effect's name make one key that names one
effect in the world, and how a key reads back.

The format (version 2, docs/guarantees.md, "The key is work identity")::

    tenure2:<installation>:<job id>:<created>:<name>

* ``tenure2`` marks the version: keys recorded before it read ``tenure-<installation>-<job
  id>-<name>`` and are kept as they were recorded (:func:`is_effect_key` knows both).
* ``<installation>`` is 1..40 of ``[A-Za-z0-9._-]`` (:func:`check_installation_id`): never
  ``:``.
* ``<job id>`` in decimal, and ``<created>``, the job's creation instant by the database's
  clock in microseconds since the Unix epoch, in base 36: a job id reused after a sequence
  reset or a restored backup comes with another creation instant, so the key differs.
* ``<name>`` keeps the name's UTF-8 bytes in ``[A-Za-z0-9._-]`` as they are and writes every
  other byte as ``:`` and two upper-case hex digits (``send email`` is ``send:20email``);
  when that is longer than :data:`NAME_LIMIT`, it is ``:h`` and the first 32 hex digits of the
  name's SHA-256 instead, which no escaped name can start with.

The first four parts contain no ``:`` and the last is written without ambiguity, so two
different (installation, job, creation, name) give two different keys (hashed names: unless
SHA-256 collides in 128 bits). A key is printable ASCII of ``[A-Za-z0-9._:-]``, at most
:data:`MAX_LENGTH` characters: most providers' idempotency keys accept it.
"""

from __future__ import annotations

import datetime as dt
import hashlib
from dataclasses import dataclass

from .installation import check_installation_id

PREFIX = "tenure2:"
"""The version marker every key of this format starts with."""
LEGACY_PREFIX = "tenure-"
"""How keys recorded before the version marker start (``tenure-<installation>-<job>-<name>``)."""
NAME_LIMIT = 100
"""The longest escaped name kept readable; a longer one is hashed."""
MAX_LENGTH = len(PREFIX) + 40 + 1 + 19 + 1 + 12 + 1 + NAME_LIMIT
"""The longest key: a 40-character installation id, a 19-digit job id, a creation instant
before the year 10000, and a name at its limit (182)."""

_SAFE = frozenset(b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-")
_DIGITS36 = "0123456789abcdefghijklmnopqrstuvwxyz"
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
_HASHED = ":h"


@dataclass(frozen=True, kw_only=True)
class KeyParts:
    """What a key of this format says."""

    installation: str
    job_id: int
    created_us: int
    """The job's creation instant, microseconds since the Unix epoch."""
    name: str | None
    """The effect's name; None when the key carries its hash instead."""


def microseconds(created: dt.datetime) -> int:
    """``created`` as microseconds since the Unix epoch (a naive time read as UTC)."""
    if created.tzinfo is None:
        created = created.replace(tzinfo=dt.UTC)
    delta = created - _EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def _base36(n: int) -> str:
    if n < 0:
        return "-" + _base36(-n)
    out = ""
    while True:
        n, r = divmod(n, 36)
        out = _DIGITS36[r] + out
        if n == 0:
            return out


def _escaped(name: str) -> str:
    raw = name.encode("utf-8", "surrogatepass")
    text = "".join(chr(b) if b in _SAFE else f":{b:02X}" for b in raw)
    if len(text) <= NAME_LIMIT:
        return text
    return _HASHED + hashlib.sha256(raw).hexdigest()[:32]


def effect_key(installation: str, job_id: int, created: dt.datetime, name: str) -> str:
    """The key of effect ``name`` of job ``job_id``, created at ``created``, in installation
    ``installation`` (``ValueError`` for an installation id that cannot be one)."""
    check_installation_id(installation)
    if job_id < 0:
        raise ValueError(f"job id {job_id} cannot name a job")
    return f"{PREFIX}{installation}:{job_id}:{_base36(microseconds(created))}:{_escaped(name)}"


def parse_effect_key(key: str) -> KeyParts | None:
    """What ``key`` says, or None when it is not a key of this format (a recorded legacy key,
    or another system's)."""
    if not key.startswith(PREFIX):
        return None
    parts = key[len(PREFIX) :].split(":", 3)
    if len(parts) != 4:
        return None
    installation, job, created, name = parts
    try:
        check_installation_id(installation)
        job_id = int(job) if job.isdigit() else -1
        created_us = int(created, 36)
    except ValueError:
        return None
    if job_id < 0:
        return None
    if name.startswith(_HASHED):
        return KeyParts(installation=installation, job_id=job_id, created_us=created_us, name=None)
    plain = _unescaped(name)
    if plain is None:
        return None
    return KeyParts(installation=installation, job_id=job_id, created_us=created_us, name=plain)


def _unescaped(text: str) -> str | None:
    out = bytearray()
    i = 0
    while i < len(text):
        c = text[i]
        if c == ":":
            pair = text[i + 1 : i + 3]
            if len(pair) != 2 or any(h not in "0123456789ABCDEF" for h in pair):
                return None
            out.append(int(pair, 16))
            i += 3
        else:
            out.append(ord(c))
            i += 1
    try:
        return out.decode("utf-8", "surrogatepass")
    except UnicodeDecodeError:
        return None


def is_effect_key(key: str) -> bool:
    """Whether ``key`` looks like a Tenure effect key, of this format or the legacy one."""
    return key.startswith((PREFIX, LEGACY_PREFIX))
