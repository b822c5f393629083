"""A tiny synchronous cluster for unit tests of the core: no clock, no randomness of its own.

Messages go into one FIFO; :meth:`Cluster.deliver` hands them over (optionally through a
filter that drops some), and every node's Ready is processed right away, following the
driver contract (save hard state, flush, send, apply, advance).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence

from dledger.core import Message, RaftConfig, RaftNode, Role
from dledger.log import Entry
from dledger.sim.memlog import MemLog

MAX_DELIVERIES = 100_000  # a unit-test cluster that delivers more than this is livelocked

DropFilter = Callable[[Message], bool]


class Cluster:
    def __init__(
        self,
        n: int,
        config: RaftConfig | None = None,
        *,
        seed: int = 0,
        configs: dict[str, RaftConfig] | None = None,
    ) -> None:
        self.ids = tuple(f"n{i}" for i in range(n))
        self.config = config or RaftConfig()
        self.configs = configs or {}
        self.seed = seed
        self.logs = {nid: MemLog() for nid in self.ids}
        self.nodes: dict[str, RaftNode] = {}
        self.applied: dict[str, list[Entry]] = {nid: [] for nid in self.ids}
        self.queue: list[Message] = []
        self.sent: list[Message] = []  # every message ever sent, for assertions
        self.isolated: set[str] = set()
        self.drop: DropFilter | None = None
        self.hold_flush: set[str] = set()  # these nodes never report their flushes
        for nid in self.ids:
            self.start(nid)

    def start(self, nid: str) -> RaftNode:
        cfg = self.configs.get(nid, self.config)
        node = RaftNode(nid, self.ids, self.logs[nid], cfg, random.Random(f"{self.seed}-{nid}"))
        self.nodes[nid] = node
        self.applied[nid] = []
        return node

    def crash_and_restart(self, nid: str) -> RaftNode:
        self.logs[nid].crash()
        self.queue = [m for m in self.queue if m.to_id != nid and m.from_id != nid]
        return self.start(nid)

    # driving ----------------------------------------------------------------------------

    def process(self, nid: str) -> None:
        node = self.nodes[nid]
        log = self.logs[nid]
        while node.has_ready():
            rd = node.ready()
            if rd.hard_state is not None:
                log.save_hard_state(rd.hard_state)
            if rd.must_flush_log and nid not in self.hold_flush:
                log.flush()
            for m in rd.messages:
                self.sent.append(m)
                self.queue.append(m)
            self.applied[nid].extend(rd.committed)
            node.advance(rd, log.flushed_index())

    def process_all(self) -> None:
        for nid in self.ids:
            self.process(nid)

    def _blocked(self, m: Message) -> bool:
        if m.from_id in self.isolated or m.to_id in self.isolated:
            return True
        return self.drop is not None and self.drop(m)

    def deliver(self, max_messages: int = MAX_DELIVERIES) -> int:
        """Deliver queued messages (and the ones they cause) until the queue is empty."""
        self.process_all()
        count = 0
        while self.queue:
            m = self.queue.pop(0)
            count += 1
            assert count <= max_messages, "cluster did not quiesce"
            if self._blocked(m):
                continue
            self.nodes[m.to_id].step(m)
            self.process(m.to_id)
        return count

    def tick(self, nids: Sequence[str] | None = None, times: int = 1) -> None:
        for _ in range(times):
            for nid in nids or self.ids:
                self.nodes[nid].tick()
            self.deliver()

    def tick_until(self, cond: Callable[[], bool], max_ticks: int = 1_000) -> int:
        for i in range(max_ticks):
            if cond():
                return i
            self.tick()
        raise AssertionError("condition not reached within max_ticks")

    # queries ----------------------------------------------------------------------------

    def leaders(self) -> list[str]:
        return [nid for nid in self.ids if self.nodes[nid].role is Role.LEADER]

    def leader(self) -> str | None:
        live = [nid for nid in self.leaders() if nid not in self.isolated]
        if not live:
            return None
        return max(live, key=lambda nid: self.nodes[nid].term)

    def elect(self, max_ticks: int = 1_000) -> str:
        self.tick_until(lambda: self.leader() is not None, max_ticks)
        leader = self.leader()
        assert leader is not None
        return leader

    def bodies(self, nid: str) -> list[bytes]:
        return [e.body for e in self.applied[nid] if e.type == 0]
