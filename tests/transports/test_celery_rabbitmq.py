"""The transport contract on Celery on RabbitMQ.

``celery -A config worker``, prefork pool.
"""

import pytest

from tests.transports.contract import CeleryContract

pytestmark = [pytest.mark.process, pytest.mark.broker]


class TestCeleryRabbitmq(CeleryContract):
    """Celery on RabbitMQ."""

    spec_id = "celery-rabbitmq"
