"""What a payload search means: the text an operator types, read as a JSON fragment.

Two spellings name the same thing, a fragment the job's payload must contain:

* a JSON object, ``{"invoice_id": 1005}`` or ``{"customer": {"email": "a@b.c"}}``;
* a key path and a value, ``invoice_id=1005`` or ``customer.email=a@b.c``. The value is read
  as JSON when it is valid JSON (``1005`` a number, ``"1005"`` a string, ``true``, ``null``),
  otherwise as the text typed (``a@b.c``).

A payload matches when every key of the fragment is present with an equal value (numbers
compare as numbers, never equal to a string); nested objects match the same way, level by
level. Arrays are refused: "contains" means different things for them across databases, and a
key inside them is named with a path instead. This module is pure: the drivers turn a
:class:`PayloadQuery` into each database's own condition
(:meth:`scheduler_core.storage.base.Driver.payload_contains`).
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Any

MAX_DEPTH = 8
"""The deepest nesting a fragment may name."""
MAX_LEAVES = 20
"""The most values one search may compare."""
_PATH = re.compile(r"^[A-Za-z_][A-Za-z0-9_\-]*(\.[A-Za-z0-9_\-]+)*=")
_KEY_FORBIDDEN = ('"', "\\", "\x00")

Scalar = str | int | float | bool | None


class PayloadQueryError(ValueError):
    """Text that looks like a payload search but is not a valid one; the message says why."""


@dataclass(frozen=True)
class PayloadQuery:
    """A validated fragment, and its leaves: each key path with the scalar found there (an
    empty object is a leaf of its own: the key must hold an object)."""

    fragment: dict[str, Any]
    leaves: tuple[tuple[tuple[str, ...], Scalar | dict[str, Any]], ...]

    def describe(self) -> str:
        """The fragment as compact JSON, for the page that lists what it matched."""
        return json.dumps(self.fragment, sort_keys=True, ensure_ascii=False)


def looks_like_payload_query(text: str) -> bool:
    """Whether the search text is meant as a payload search (a JSON object or ``path=value``)
    rather than a job id or part of a unique key."""
    t = text.strip()
    return t.startswith("{") or bool(_PATH.match(t))


def _leaves(value: dict[str, Any], prefix: tuple[str, ...], out: list[Any], depth: int) -> None:
    if depth > MAX_DEPTH:
        raise PayloadQueryError(f"the fragment nests deeper than {MAX_DEPTH} levels")
    if not value and prefix:
        out.append((prefix, {}))
        return
    for key, v in value.items():
        if not key or any(c in key for c in _KEY_FORBIDDEN):
            raise PayloadQueryError(
                f"key {key!r} cannot be searched: keys must be non-empty, without quotes or "
                "backslashes"
            )
        path = (*prefix, key)
        if isinstance(v, dict):
            _leaves(v, path, out, depth + 1)
        elif isinstance(v, list):
            raise PayloadQueryError(
                f"{'.'.join(path)} is an array: search a value inside it by its own key path"
            )
        else:
            _check_scalar(path, v)
            out.append((path, v))
    if len(out) > MAX_LEAVES:
        raise PayloadQueryError(f"a search compares at most {MAX_LEAVES} values")


def _check_scalar(path: tuple[str, ...], v: Any) -> None:
    """Numbers every database stores and compares: finite, integers within 64 bits."""
    where = ".".join(path)
    if isinstance(v, float) and not math.isfinite(v):
        raise PayloadQueryError(f"{where}: {v} cannot be searched; use a finite number")
    if isinstance(v, int) and not isinstance(v, bool) and not -(2**63) <= v < 2**63:
        raise PayloadQueryError(f"{where}: the number is too large to search")


def _value(text: str) -> Scalar | dict[str, Any]:
    try:
        value = json.loads(text)
    except ValueError:
        return text
    if isinstance(value, list):
        raise PayloadQueryError("an array value cannot be searched: name a key inside it")
    return value  # type: ignore[no-any-return]


def parse(text: str) -> PayloadQuery:
    """The fragment ``text`` names (see the module docstring).

    Raises :class:`PayloadQueryError` with a message an operator can act on.
    """
    t = text.strip()
    fragment: Any
    if t.startswith("{"):
        try:
            fragment = json.loads(t)
        except json.JSONDecodeError as e:
            raise PayloadQueryError(
                f"not valid JSON ({e.msg} at character {e.pos + 1}); write an object such as "
                '{"invoice_id": 1005}'
            ) from None
        if not isinstance(fragment, dict):
            raise PayloadQueryError('a JSON search must be an object such as {"invoice_id": 1005}')
    else:
        if not _PATH.match(t):
            raise PayloadQueryError(
                "write a key path and a value such as invoice_id=1005 or customer.email=a@b.c"
            )
        path, _, raw = t.partition("=")
        value = _value(raw.strip())
        fragment = value
        for key in reversed(path.split(".")):
            fragment = {key: fragment}
    if not fragment:
        raise PayloadQueryError("name at least one key to search for")
    leaves: list[Any] = []
    _leaves(fragment, (), leaves, 1)
    return PayloadQuery(fragment=fragment, leaves=tuple(leaves))
