"""Producer(poll_name_server_interval_s=...): RocketMQ's pollNameServerInterval, bounded."""

from __future__ import annotations

import pytest

from client import MQClientError, Producer
from client.producer import MAX_POLL_S, MIN_POLL_NAME_SERVER_INTERVAL_S


@pytest.mark.parametrize("seconds", [0.0, MIN_POLL_NAME_SERVER_INTERVAL_S / 2, MAX_POLL_S + 1])
def test_an_interval_out_of_bounds_is_refused(seconds: float) -> None:
    with pytest.raises(MQClientError, match="poll_name_server_interval_s"):
        Producer("pg", "127.0.0.1:9876", poll_name_server_interval_s=seconds)


def test_the_interval_is_what_the_route_cache_keeps() -> None:
    producer = Producer("pg", "127.0.0.1:9876", poll_name_server_interval_s=0.5)
    producer.start()
    try:
        assert producer._routes is not None and producer._routes._poll_interval_s == 0.5
    finally:
        producer.shutdown()
