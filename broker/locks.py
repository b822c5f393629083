"""Queue locks for orderly consumption: at most one live consumer of a group holds a queue.

RocketMQ's RebalanceLockManager, in memory on every node: an orderly consumer locks its queues
on the group's leader before consuming them (``LockBatchMQ``) and renews the locks every
``LOCK_RENEW_INTERVAL_S``; a lock not renewed for ``LOCK_MAX_LIVE_MS`` expires, so a consumer
that vanished without unlocking frees its queues after at most that long. Consumers also report
the queues they hold in every heartbeat, which goes to every node, so a node that becomes
leader already knows who holds what and does not hand a held queue to a second consumer.

The table is pure (the caller passes the time), so the rules are unit-tested without a clock.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

# RocketMQ's rocketmq.broker.rebalance.lockMaxLiveTime: a lock not renewed for this long is free.
LOCK_MAX_LIVE_MS = 60_000
# Bound on the table: consumer groups x queues one node tracks (a lying client cannot grow it
# without limit); beyond it, new locks are refused until expired ones are swept.
MAX_LOCKS = 100_000

# (consumer group, topic, queue id)
LockKey = tuple[str, str, int]


@dataclass(slots=True)
class _Holder:
    client_id: str
    renewed_ms: int


class QueueLockTable:
    """``lock``/``unlock``/``claim`` over ``(group, topic, queue)``; ``now_ms`` is passed in."""

    def __init__(self, max_live_ms: int = LOCK_MAX_LIVE_MS, max_locks: int = MAX_LOCKS) -> None:
        assert max_live_ms > 0 and max_locks > 0
        self.max_live_ms = max_live_ms
        self.max_locks = max_locks
        self._locks: dict[LockKey, _Holder] = {}

    def __len__(self) -> int:
        return len(self._locks)

    def holder(self, key: LockKey, now_ms: int) -> str | None:
        h = self._locks.get(key)
        if h is None or now_ms - h.renewed_ms >= self.max_live_ms:
            return None
        return h.client_id

    def _sweep(self, now_ms: int) -> None:
        expired = [k for k, h in self._locks.items() if now_ms - h.renewed_ms >= self.max_live_ms]
        for k in expired:
            del self._locks[k]

    def _take(self, key: LockKey, client_id: str, now_ms: int) -> bool:
        current = self.holder(key, now_ms)
        if current is not None and current != client_id:
            return False
        if key not in self._locks and len(self._locks) >= self.max_locks:
            self._sweep(now_ms)
            if len(self._locks) >= self.max_locks:
                return False
        self._locks[key] = _Holder(client_id, now_ms)
        return True

    def lock(
        self, group: str, client_id: str, queues: Iterable[tuple[str, int]], now_ms: int
    ) -> list[tuple[str, int]]:
        """Locks (or renews) every queue not held by another live consumer; returns those now
        held by ``client_id``."""
        return [q for q in queues if self._take((group, q[0], q[1]), client_id, now_ms)]

    def claim(
        self, group: str, client_id: str, queues: Iterable[tuple[str, int]], now_ms: int
    ) -> None:
        """A heartbeat's report of held queues: recorded unless another consumer holds one."""
        for q in queues:
            self._take((group, q[0], q[1]), client_id, now_ms)

    def unlock(
        self, group: str, client_id: str, queues: Iterable[tuple[str, int]]
    ) -> list[tuple[str, int]]:
        """Releases the queues ``client_id`` holds; returns those it held."""
        released = []
        for q in queues:
            key = (group, q[0], q[1])
            h = self._locks.get(key)
            if h is not None and h.client_id == client_id:
                del self._locks[key]
                released.append(q)
        return released

    def release_client(self, group: str, client_id: str) -> int:
        """A consumer that unregistered or expired: every lock it held is free. Returns how many."""
        keys = [k for k, h in self._locks.items() if k[0] == group and h.client_id == client_id]
        for k in keys:
            del self._locks[k]
        return len(keys)
