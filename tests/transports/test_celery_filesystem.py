"""The transport contract on Celery on the filesystem broker.

The embedded default (one host): ``celery -A config worker``, prefork pool.
"""

import pytest

from tests.transports.contract import CeleryContract

pytestmark = [pytest.mark.process, pytest.mark.broker]


class TestCeleryFilesystem(CeleryContract):
    """Celery on the filesystem broker."""

    spec_id = "celery-filesystem"
