"""Effect keys name one effect: two different (installation, job, creation, name) never give the
same key, over many seeded random ones drawn from alphabets chosen to collide (``-``, ``:``,
digits, escapes, non-ASCII, names long enough to be hashed); every key is short printable ASCII
that providers accept; a key reads back as what it was made from. The same property run on the
encoding used before the version marker (``tenure-<installation>-<job id>-<name>``) finds
collisions, so it can fail."""

from __future__ import annotations

import datetime as dt
import random
import re
from collections.abc import Callable

import pytest

from scheduler_core.domain import keys
from scheduler_core.domain.installation import check_installation_id

SEEDS = range(8)
SAMPLES = 6000
T0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
ACCEPTED = re.compile(r"^[A-Za-z0-9._:-]+$")
"""What most providers accept in an idempotency key."""

Quad = tuple[str, int, dt.datetime, str]


def _installation(rng: random.Random) -> str:
    return "".join(
        rng.choice(["a", "b", "1", "-", ".", "_", "a-1"]) for _ in range(rng.randint(1, 4))
    )[:40]


def _name(rng: random.Random) -> str:
    if rng.random() < 0.1:
        # Long enough to be hashed, often sharing a long prefix with another.
        return "x" * rng.randint(95, 100) + "".join(rng.choice("é -") for _ in range(3))
    alphabet = ["a", "1", "-", ":", "_", ".", " ", "é", "\x00", ":3A", ":h", "2-a", "1-", "%"]
    return "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 6)))[:100]


def _quads(seed: int) -> set[Quad]:
    rng = random.Random(seed)
    return {
        (
            _installation(rng),
            rng.randint(0, 40),
            T0 + dt.timedelta(microseconds=rng.choice([0, 1, 999, 1000, 36**3])),
            _name(rng),
        )
        for _ in range(SAMPLES)
    }


def _collisions(encode: Callable[[Quad], str], quads: set[Quad]) -> list[tuple[Quad, Quad]]:
    seen: dict[str, Quad] = {}
    found = []
    for q in sorted(quads):
        key = encode(q)
        if key in seen:
            found.append((seen[key], q))
        seen[key] = q
    return found


def _new(q: Quad) -> str:
    return keys.effect_key(*q)


def _legacy(q: Quad) -> str:
    installation, job_id, _, name = q
    return f"tenure-{installation}-{job_id}-{name}"


@pytest.mark.parametrize("seed", SEEDS)
def test_two_different_effects_never_share_a_key(seed: int) -> None:
    quads = _quads(seed)
    assert len(quads) > SAMPLES * 0.8
    assert _collisions(_new, quads) == []


@pytest.mark.parametrize("seed", SEEDS)
def test_the_legacy_encoding_fails_the_same_property(seed: int) -> None:
    found = _collisions(_legacy, _quads(seed))
    assert found, "the property cannot tell an ambiguous encoding"
    # For instance installation "a-1", job 2, name "x" against installation "a", job 1, "2-x":
    assert _legacy(("a-1", 2, T0, "x")) == _legacy(("a", 1, T0, "2-x"))
    assert _new(("a-1", 2, T0, "x")) != _new(("a", 1, T0, "2-x"))


@pytest.mark.parametrize("seed", SEEDS)
def test_every_key_is_short_printable_ascii_and_reads_back(seed: int) -> None:
    for q in _quads(seed):
        key = _new(q)
        assert ACCEPTED.match(key), key
        assert len(key) <= keys.MAX_LENGTH
        parts = keys.parse_effect_key(key)
        assert parts is not None, key
        installation, job_id, created, name = q
        assert (parts.installation, parts.job_id, parts.created_us) == (
            installation,
            job_id,
            keys.microseconds(created),
        )
        assert parts.name in (name, None)
        assert (parts.name is None) == key.split(":", 4)[4].startswith(":h")


def test_the_longest_key_fits_every_common_provider() -> None:
    longest = keys.effect_key(
        "i" * 40, 2**63 - 1, dt.datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=dt.UTC), "é" * 100
    )
    assert len(longest) <= keys.MAX_LENGTH == 182 <= 255
    escaped = keys.effect_key(
        "i" * 40, 2**63 - 1, dt.datetime(9999, 1, 1, tzinfo=dt.UTC), "n" * 100
    )
    assert len(escaped) == keys.MAX_LENGTH


def test_a_readable_name_stays_readable_and_others_are_escaped_or_hashed() -> None:
    assert (
        keys.effect_key("a1b2c3", 42, T0, "charge.v2") == "tenure2:a1b2c3:42:hefg8dts00:charge.v2"
    )
    assert keys.effect_key("a1b2c3", 42, T0, "send email").endswith(":send:20email")
    assert keys.effect_key("a1b2c3", 42, T0, "a:b").endswith(":a:3Ab")
    assert keys.effect_key("a1b2c3", 42, T0, "é").endswith(":42:hefg8dts00::C3:A9")
    hashed = keys.effect_key("a1b2c3", 42, T0, "é" * 20)
    assert re.fullmatch(r"tenure2:a1b2c3:42:hefg8dts00::h[0-9a-f]{32}", hashed)


def test_the_creation_instant_tells_a_reused_job_id_apart() -> None:
    """After a sequence reset or a restored backup a job id comes again, later."""
    first = keys.effect_key("a1b2c3", 7, T0, "charge")
    again = keys.effect_key("a1b2c3", 7, T0 + dt.timedelta(milliseconds=1), "charge")
    assert first != again


def test_a_naive_creation_instant_reads_as_utc() -> None:
    naive = dt.datetime(2026, 1, 1)
    assert keys.effect_key("a", 1, naive, "n") == keys.effect_key("a", 1, T0, "n")


@pytest.mark.parametrize("bad", ["", "a:b", "x" * 41, "sp ace", "é"])
def test_an_installation_id_that_cannot_be_one_is_refused(bad: str) -> None:
    with pytest.raises(ValueError, match="installation id"):
        keys.effect_key(bad, 1, T0, "n")
    with pytest.raises(ValueError, match="installation id"):
        check_installation_id(bad)


def test_legacy_keys_are_known_as_effect_keys_but_not_parsed() -> None:
    legacy = "tenure-a1b2c3-42-charge"
    assert keys.is_effect_key(legacy)
    assert keys.parse_effect_key(legacy) is None
    assert keys.is_effect_key(keys.effect_key("a", 1, T0, "n"))
    assert not keys.is_effect_key("order-42")
    assert not keys.effect_key("a", 1, T0, "n").startswith(keys.LEGACY_PREFIX)
