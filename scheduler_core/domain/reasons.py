"""An operator's reason: required, and at most :data:`REASON_MAX_CHARS` characters, for every
action on a job, a queue or a schedule, from the console and the command line alike. A longer
reason is refused with a message, never cut."""

from __future__ import annotations

from ..exceptions import ActionRefused

REASON_MAX_CHARS = 4000
"""The longest reason an operator action keeps (the audit row keeps all of it)."""

TOO_LONG = (
    "A reason is at most %(limit_value)d characters; this one has %(show_value)d. Shorten it: "
    "nothing was changed."
)
"""The form's message for a reason over the limit (Django's ``max_length`` placeholders)."""


def check_reason(reason: str | None) -> str:
    """``reason`` stripped; refused (:class:`ActionRefused`) when empty or too long."""
    text = (reason or "").strip()
    if not text:
        raise ActionRefused("a reason is required")
    if len(text) > REASON_MAX_CHARS:
        raise ActionRefused(
            f"the reason has {len(text)} characters, more than the {REASON_MAX_CHARS} kept; "
            "shorten it"
        )
    return text
