"""The consumer registry and queue locks, without gRPC."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from broker_world import world

from broker.components.consumers import ConsumerGroups
from broker.components.locks import CONSUMER_EXPIRE_MS
from broker.state.errors import InvalidRequestError
from dledger.core import NotLeaderError, Role


def test_locks_go_to_one_live_consumer_and_expire_with_it(tmp_path: Path) -> None:
    async def body() -> None:
        node, _, topics, _ = world(tmp_path)
        await topics.upsert("T", 2, 2, 6)
        groups = ConsumerGroups(topics)
        clock = [1_000_000]
        groups.clock_ms = lambda: clock[0]
        groups.heartbeat("g", "a", [("T", "*")], [])
        groups.heartbeat("g", "b", [("T", "A || B")], [])
        assert groups.clients("g") == ["a", "b"]
        assert groups.lock("g", "a", [("T", 0), ("T", 1), ("T", 2), ("Nope", 0)]) == [
            ("T", 0),
            ("T", 1),
        ]
        assert groups.lock("g", "b", [("T", 0)]) == []  # held by a live consumer
        assert groups.unlock("g", "b", [("T", 1)]) == []  # not b's
        assert groups.unlock("g", "a", [("T", 1)]) == [("T", 1)]
        clock[0] += CONSUMER_EXPIRE_MS - 10_000
        groups.heartbeat("g", "b", [], [])
        assert groups.lock("g", "a", [("T", 0)]) == [("T", 0)]  # renewed: a live lock
        clock[0] += 10_001  # a sent no heartbeat for too long; b did
        assert groups.clients("g") == ["b"] and len(groups.locks) == 0  # a and its lock gone
        assert groups.lock("g", "b", [("T", 0)]) == [("T", 0)]  # a's lock went with it
        assert groups.unregister("g", "b") and not groups.unregister("g", "b")
        with pytest.raises(InvalidRequestError):
            groups.heartbeat("g", "", [], [])
        node.role = Role.FOLLOWER
        with pytest.raises(NotLeaderError):
            groups.lock("g", "c", [("T", 0)])

    asyncio.run(body())
