"""The baseline of the OpenTelemetry comparison (``bench.systems.TenureUntraced``): a copy of
this checkout's committed files in which every tracing and signal hook of the job path does
nothing, so that it differs from the checkout by those hooks alone.

``scheduler_core/tracing.py``'s functions and ``scheduler_core/runtime/observe.py``'s
``started``, ``finished`` and ``abandoned`` are defined again at the end of their modules as
functions that return at once (a module's last definition of a name is the one its callers
find); ``logged_end`` and the reaper's ``reaped`` keep their logging. A hook that is not where
this expects it stops the benchmark: a baseline that had silently kept it would measure
nothing.
"""

from __future__ import annotations

from pathlib import Path

TRACING = """

# -- bench.untraced: every tracing hook does nothing --------------------------------------
def active() -> bool:
    return False


def start_enqueue(name: str, queue: str) -> tuple[Span, dict[str, str] | None]:
    return None, None


def end_enqueue(span: Span, job_ids: list[int], error: BaseException | None = None) -> None:
    return None


def start_attempt(carrier: Mapping[str, str] | None, attributes: dict[str, Any], name: str) -> Span:
    return None


def current(span: Span) -> AbstractContextManager[None]:
    return _NOTHING


def end_attempt(span: Span, outcome: str, error: BaseException | None = None) -> None:
    return None


def start_effect(name: str, attributes: dict[str, Any]) -> Span:
    return None


def end_effect(span: Span, key: str, state: str) -> None:
    return None
"""

OBSERVE = """

# -- bench.untraced: no span, no signal ---------------------------------------------------
def started(ctx: JobContext, sender: Any) -> None:
    return None


def finished(ctx: JobContext, sender: Any, outcome: str) -> None:
    return None


def abandoned(ctx: JobContext, error: BaseException) -> None:
    return None
"""

HOOKS = {
    "scheduler_core/tracing.py": (
        TRACING,
        (
            "active",
            "start_enqueue",
            "end_enqueue",
            "start_attempt",
            "current",
            "end_attempt",
            "start_effect",
            "end_effect",
        ),
    ),
    "scheduler_core/runtime/observe.py": (OBSERVE, ("started", "finished", "abandoned")),
}
"""Each module's emptied hooks, and the names it must define already."""


def strip(root: Path) -> None:
    """Empty the hooks of the copy under ``root`` (once: a copy already emptied is left)."""
    for rel, (tail, names) in HOOKS.items():
        path = root / rel
        text = path.read_text()
        if "bench.untraced" in text:
            continue
        missing = [n for n in names if f"\ndef {n}(" not in text]
        if missing:
            raise SystemExit(f"bench.untraced: {rel} no longer defines {', '.join(missing)}")
        path.write_text(text + tail)
