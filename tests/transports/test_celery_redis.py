"""The transport contract on Celery on Redis.

``celery -A config worker``, prefork pool.
"""

import pytest

from tests.transports.contract import CeleryContract

pytestmark = [pytest.mark.process, pytest.mark.broker]


class TestCeleryRedis(CeleryContract):
    """Celery on Redis."""

    spec_id = "celery-redis"
