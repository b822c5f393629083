"""The broker service's pure parts: subscriptions and the one error-to-status mapping."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import grpc
import pytest

from broker.errors import (
    CorruptMessageError,
    InvalidTopicError,
    MessageNotFoundError,
    MessageTooLargeError,
    NoPermissionError,
    QueueIdOutOfRangeError,
    TopicNotFoundError,
)
from broker.service import error_status, parse_subscription
from dledger.core import BackPressureError, NotLeaderError
from dledger.server.node import ProposalLostError


def test_subscriptions() -> None:
    assert parse_subscription("*") is None
    assert parse_subscription("  ") is None
    assert parse_subscription("TagA || TagB") == {"TagA", "TagB"}
    assert parse_subscription("TagA") == {"TagA"}
    with pytest.raises(Exception, match="names no tag"):
        parse_subscription("||")


def _node() -> Any:
    return SimpleNamespace(
        leader_client_addr=lambda: ("n2", "127.0.0.1:10931"),
        cfg=SimpleNamespace(append_timeout_ms=3000),
    )


@pytest.mark.parametrize(
    ("exc", "status", "prefix"),
    [
        (
            NotLeaderError("x", leader_id="n2"),
            grpc.StatusCode.FAILED_PRECONDITION,
            "NOT_LEADER leader=n2 addr=127.0.0.1:10931",
        ),
        (TopicNotFoundError("t"), grpc.StatusCode.NOT_FOUND, "TOPIC_NOT_FOUND "),
        (MessageNotFoundError("m"), grpc.StatusCode.NOT_FOUND, "MESSAGE_NOT_FOUND "),
        (MessageTooLargeError("m"), grpc.StatusCode.INVALID_ARGUMENT, "MESSAGE_TOO_LARGE "),
        (InvalidTopicError("m"), grpc.StatusCode.INVALID_ARGUMENT, "INVALID_TOPIC "),
        (QueueIdOutOfRangeError("q"), grpc.StatusCode.INVALID_ARGUMENT, "QUEUE_ID_OUT_OF_RANGE "),
        (NoPermissionError("p"), grpc.StatusCode.PERMISSION_DENIED, "NO_PERMISSION "),
        (CorruptMessageError("bad", 3), grpc.StatusCode.DATA_LOSS, "CORRUPT_MESSAGE "),
        (BackPressureError("b"), grpc.StatusCode.RESOURCE_EXHAUSTED, "BACK_PRESSURE "),
        (ProposalLostError("l"), grpc.StatusCode.UNAVAILABLE, "LEADERSHIP_LOST "),
        (TimeoutError(), grpc.StatusCode.UNAVAILABLE, "NO_QUORUM "),
        (RuntimeError("boom"), grpc.StatusCode.INTERNAL, "INTERNAL RuntimeError"),
    ],
)
def test_every_error_maps_to_a_status_and_a_stable_code(
    exc: BaseException, status: grpc.StatusCode, prefix: str
) -> None:
    got_status, detail = error_status(exc, _node())
    assert got_status == status
    assert detail.startswith(prefix), detail


@pytest.mark.parametrize(
    ("slave_read", "role", "behind_bytes", "expected"),
    [
        (True, "LEADER", 2_000, True),  # far behind the write position: likely not in memory
        (True, "LEADER", 500, False),  # recent data: page cache, serve it here
        (False, "LEADER", 2_000, False),  # slaveReadEnable=false: never send reads away
        (True, "FOLLOWER", 2_000, False),  # a follower is where the hint sends you already
    ],
)
def test_pull_from_follower_hint(
    slave_read: bool, role: str, behind_bytes: int, expected: bool
) -> None:
    from broker.service import BrokerServicer
    from dledger.core import Role

    servicer = object.__new__(BrokerServicer)
    servicer.cfg = SimpleNamespace(slave_read_enable=slave_read)  # type: ignore[assignment]
    servicer.node = SimpleNamespace(  # type: ignore[assignment]
        core=SimpleNamespace(role=Role[role]), store=SimpleNamespace(write_position=10_000)
    )
    servicer._memory_limit_bytes = 1_000
    assert servicer._suggest_follower(10_000 - behind_bytes) is expected
