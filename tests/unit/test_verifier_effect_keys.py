"""The fault verifier's I2 ("no effect without a committed enqueue") knows an effect key of
either format at a destination: one that belongs to no committed job is reported, whether it
was made before the version marker or after (the check read only ``tenure-...`` keys before)."""

from __future__ import annotations

from collections import Counter

from verifier.checker import jobs_section
from verifier.evidence import Evidence


def _evidence(applied: Counter[str]) -> Evidence:
    return Evidence(
        plan={},
        meta={},
        enqueues=[],
        faults=[],
        operator=[],
        events=[],
        sweep=None,
        jobs={},
        other_jobs=[],
        attempts={},
        effects={},
        stale=[],
        audits={},
        applied=applied,
        replayed=set(),
    )


def test_an_effect_without_a_job_is_reported_in_either_key_format() -> None:
    keys = ["tenure2:a1b2c3:7:hefg8dts00:charge", "tenure-a1b2c3-8-charge"]
    applied = Counter({k: 1 for k in [*keys, "someone-else's-key"]})
    sections = jobs_section(_evidence(applied))
    found = [s for s in sections if "effects_without_job" in s]
    assert found and found[0]["effects_without_job"] == sorted(keys)
