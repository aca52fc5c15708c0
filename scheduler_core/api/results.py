"""What a handler may return to have it kept as its job's result: JSON that Tenure stores as
it is, at most ``TENURE_MAX_RETURN_VALUE_BYTES``. Checked on the attempt's thread once the
handler has returned, before the completion, which stores the value on the attempt's row
under the attempt's fence (the same statement that marks the job succeeded)."""

from __future__ import annotations

from typing import Any

from ..conf import tenure_settings
from ..exceptions import EnqueueError, InvalidResult
from .registry import check_json


def checked_result(value: Any) -> Any:
    """``value`` if it can be kept as a result (``None``: nothing to keep); else
    :class:`~scheduler_core.exceptions.InvalidResult` saying why, which fails the attempt."""
    if value is None:
        return None
    limit = tenure_settings().MAX_RETURN_VALUE_BYTES
    try:
        check_json(value, what="result", max_bytes=limit)
    except EnqueueError as e:
        raise InvalidResult(
            f"the handler's {e}; a job's result is stored as JSON of at most {limit} bytes "
            "(TENURE_MAX_RETURN_VALUE_BYTES)"
        ) from None
    return value
