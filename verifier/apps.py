"""The verifier app: listed only by the example project's settings. At start-up it installs the
verifier's hooks when ``TENURE_FAILPOINTS`` or ``TENURE_EVENT_LOG`` is set in the process's
environment (the verifier's and the process tests' children), and registers its checks."""

from __future__ import annotations

import os

from django.apps import AppConfig


class VerifierConfig(AppConfig):
    """The fault verifier (``manage.py chaos``)."""

    name = "verifier"
    verbose_name = "Tenure fault verifier"

    def ready(self) -> None:
        from scheduler_core import hooks

        from . import checks  # noqa: F401  (registers them)
        from .failpoints import VerifierHooks

        spec = os.environ.get("TENURE_FAILPOINTS", "")
        if spec or os.environ.get("TENURE_EVENT_LOG"):
            hooks.install(VerifierHooks(spec))
