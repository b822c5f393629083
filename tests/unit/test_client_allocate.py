"""Allocation strategies: every queue assigned exactly once, an even split, stable results."""

from __future__ import annotations

import random

import pytest

from client.allocate import (
    AllocateMessageQueueAveragely,
    AllocateMessageQueueAveragelyByCircle,
    AllocateMessageQueueConsistentHash,
    AllocateStrategy,
)
from client.consumer import parse_tags
from client.errors import MQClientError
from client.message import Message, MessageQueue, new_msg_id
from client.producer import SelectMessageQueueByHash

STRATEGIES = [
    AllocateMessageQueueAveragely,
    AllocateMessageQueueAveragelyByCircle,
    AllocateMessageQueueConsistentHash,
]
EVEN = [AllocateMessageQueueAveragely, AllocateMessageQueueAveragelyByCircle]


def queues(n: int, groups: tuple[str, ...] = ("broker-a", "broker-b")) -> list[MessageQueue]:
    return [MessageQueue("T", g, q) for g in groups for q in range(n)]


def split(strategy: AllocateStrategy, mqs: list[MessageQueue], cids: list[str]) -> dict[str, list]:
    return {c: strategy("g", c, mqs, cids) for c in cids}


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("n_queues", [1, 3, 4, 8, 16])
@pytest.mark.parametrize("n_clients", [1, 2, 3, 5, 20])
def test_every_queue_exactly_once(
    strategy: AllocateStrategy, n_queues: int, n_clients: int
) -> None:
    mqs = queues(n_queues)
    cids = [f"10.0.0.{i}@{i}" for i in range(n_clients)]
    got = split(strategy, mqs, cids)
    assigned = [mq for share in got.values() for mq in share]
    assert sorted(assigned) == sorted(mqs)


@pytest.mark.parametrize("strategy", EVEN)
@pytest.mark.parametrize("n_queues", [1, 3, 4, 8, 16])
@pytest.mark.parametrize("n_clients", [1, 2, 3, 5, 20])
def test_even_split(strategy: AllocateStrategy, n_queues: int, n_clients: int) -> None:
    sizes = [
        len(s)
        for s in split(strategy, queues(n_queues), [f"c{i}" for i in range(n_clients)]).values()
    ]
    assert max(sizes) - min(sizes) <= 1


def test_averagely_is_contiguous_like_rocketmq() -> None:
    mqs = queues(8, ("a",))
    got = split(AllocateMessageQueueAveragely, mqs, ["c0", "c1", "c2"])
    assert [[mq.queue_id for mq in got[c]] for c in ["c0", "c1", "c2"]] == [
        [0, 1, 2],
        [3, 4, 5],
        [6, 7],
    ]
    circle = split(AllocateMessageQueueAveragelyByCircle, mqs, ["c0", "c1", "c2"])
    assert [mq.queue_id for mq in circle["c0"]] == [0, 3, 6]


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_stable_whatever_the_input_order(strategy: AllocateStrategy) -> None:
    mqs = queues(8)
    cids = [f"c{i}" for i in range(3)]
    expected = split(strategy, mqs, cids)
    rng = random.Random(7)
    for _ in range(20):
        m2, c2 = mqs[:], cids[:]
        rng.shuffle(m2)
        rng.shuffle(c2)
        assert split(strategy, m2, c2) == expected


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_unknown_client_or_no_queue_gets_nothing(strategy: AllocateStrategy) -> None:
    assert strategy("g", "stranger", queues(4), ["c0", "c1"]) == []
    assert strategy("g", "c0", [], ["c0", "c1"]) == []


def test_consistent_hash_moves_few_queues_when_a_consumer_joins() -> None:
    mqs = queues(32)
    before = split(AllocateMessageQueueConsistentHash, mqs, ["c0", "c1", "c2"])
    after = split(AllocateMessageQueueConsistentHash, mqs, ["c0", "c1", "c2", "c3"])
    owner_before = {mq: c for c, share in before.items() for mq in share}
    owner_after = {mq: c for c, share in after.items() for mq in share}
    moved = [mq for mq in mqs if owner_before[mq] != owner_after[mq]]
    assert all(owner_after[mq] == "c3" for mq in moved)


def test_tags_and_ids_and_hash_selector() -> None:
    assert parse_tags("*") is None and parse_tags("") is None
    assert parse_tags(" TagA || TagB ") == {"TagA", "TagB"}
    with pytest.raises(MQClientError):
        parse_tags("||")
    ids = {new_msg_id() for _ in range(100)}
    assert len(ids) == 100
    assert all(len(i) == 32 and i == i.upper() and int(i, 16) >= 0 for i in ids)
    mqs = queues(4)
    sel = SelectMessageQueueByHash()
    m = Message("T", b"x")
    assert sel.select(mqs, m, "order-1") == sel.select(mqs, m, "order-1")
    assert len({sel.select(mqs, m, f"order-{i}") for i in range(100)}) == len(mqs)
