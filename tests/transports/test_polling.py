"""The transport contract on the broker-less executor.

``manage.py run_executor``: nothing to run but the database.
"""

import pytest

from tests.transports.contract import TransportContract

pytestmark = [pytest.mark.process]


class TestPolling(TransportContract):
    """the broker-less executor."""

    spec_id = "polling"
