"""Queue allocation strategies for clustering consumers (RocketMQ's AllocateMessageQueue*).

Pure functions of (consumer group, this client's id, every queue, every client id): every
consumer of a group computes the same split from the same inputs, so each queue is consumed
by exactly one of them. Inputs are sorted here, so callers' ordering does not matter.
"""

from __future__ import annotations

import bisect
import hashlib
from collections.abc import Sequence
from typing import Protocol

from client.message import MessageQueue

# Virtual nodes per consumer on the consistent-hash ring (RocketMQ's default is 10).
CONSISTENT_HASH_VIRTUAL_NODES = 10


class AllocateStrategy(Protocol):
    def __call__(
        self,
        consumer_group: str,
        current_id: str,
        queues: Sequence[MessageQueue],
        client_ids: Sequence[str],
    ) -> list[MessageQueue]: ...


def _prepare(
    current_id: str, queues: Sequence[MessageQueue], client_ids: Sequence[str]
) -> tuple[list[MessageQueue], list[str]] | None:
    mqs = sorted(set(queues))
    cids = sorted(set(client_ids))
    if not mqs or current_id not in cids:
        return None
    return mqs, cids


def AllocateMessageQueueAveragely(
    consumer_group: str,
    current_id: str,
    queues: Sequence[MessageQueue],
    client_ids: Sequence[str],
) -> list[MessageQueue]:
    """Contiguous blocks: with 8 queues and 3 consumers, 3 + 3 + 2."""
    prepared = _prepare(current_id, queues, client_ids)
    if prepared is None:
        return []
    mqs, cids = prepared
    index, n = cids.index(current_id), len(cids)
    mod = len(mqs) % n
    if len(mqs) <= n:
        size = 1 if index < len(mqs) else 0
    elif mod > 0 and index < mod:
        size = len(mqs) // n + 1
    else:
        size = len(mqs) // n
    start = index * size if mod > 0 and index < mod else index * size + mod
    return mqs[start : start + size] if size else []


def AllocateMessageQueueAveragelyByCircle(
    consumer_group: str,
    current_id: str,
    queues: Sequence[MessageQueue],
    client_ids: Sequence[str],
) -> list[MessageQueue]:
    """Round robin: queue i goes to consumer i mod n."""
    prepared = _prepare(current_id, queues, client_ids)
    if prepared is None:
        return []
    mqs, cids = prepared
    index = cids.index(current_id)
    return [mq for i, mq in enumerate(mqs) if i % len(cids) == index]


def _hash(text: str) -> int:
    return int.from_bytes(hashlib.md5(text.encode(), usedforsecurity=False).digest()[:8], "big")


def AllocateMessageQueueConsistentHash(
    consumer_group: str,
    current_id: str,
    queues: Sequence[MessageQueue],
    client_ids: Sequence[str],
) -> list[MessageQueue]:
    """Each queue goes to the first consumer (virtual node) clockwise on a hash ring: when a
    consumer joins or leaves, only the queues next to its virtual nodes move."""
    prepared = _prepare(current_id, queues, client_ids)
    if prepared is None:
        return []
    mqs, cids = prepared
    ring = sorted(
        (_hash(f"{cid}-{v}"), cid) for cid in cids for v in range(CONSISTENT_HASH_VIRTUAL_NODES)
    )
    points = [p for p, _ in ring]
    out = []
    for mq in mqs:
        i = bisect.bisect_left(points, _hash(mq.key())) % len(ring)
        if ring[i][1] == current_id:
            out.append(mq)
    return out
