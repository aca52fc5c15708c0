"""The verifier's system checks: failpoints are a testing facility, said so at start-up."""

from __future__ import annotations

import os
from typing import Any

from django.core.checks import Error, Warning, register

from .failpoints import parse


@register()
def check_failpoints(app_configs: Any, **kwargs: Any) -> list[Any]:
    """``TENURE_FAILPOINTS`` must parse, and is warned about when set."""
    spec = os.environ.get("TENURE_FAILPOINTS")
    if not spec:
        return []
    try:
        parse(spec)
    except ValueError as e:
        return [Error(f"TENURE_FAILPOINTS: {e}", id="tenure.E004")]
    return [Warning(f"TENURE_FAILPOINTS is set ({spec}): a testing facility", id="tenure.W001")]
