"""The transport contract on RQ on Redis.

``manage.py rqworker`` through django-rq: a forked work horse per message.
"""

import pytest

from tests.transports.contract import RqContract

pytestmark = [pytest.mark.process, pytest.mark.broker]


class TestRqRedis(RqContract):
    """RQ on Redis."""

    spec_id = "rq-redis"
