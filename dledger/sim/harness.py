"""A tiny synchronous cluster for unit tests of the core: no clock, no randomness of its own.

Messages go into one FIFO; :meth:`Cluster.deliver` hands them over (optionally through a
filter that drops some), and every node's Ready is processed right away, following the
driver contract (early messages, persist, messages, apply, advance), unless the node's
persists are held (:attr:`Cluster.hold_persist`). Commit notices a Ready says are held are
released once the queue is empty (the linger ends when the burst it waited on is over).
Snapshots: a Ready's ``snapshot_requests`` are answered at once with an InstallSnapshot of
the leader's applied prefix (delivered through the queue like a message; the leader hears
``report_snapshot`` when it is delivered), and a Ready's ``snapshot`` is installed into the
follower's MemLog before the rest of its job. :meth:`Cluster.compact` deletes a log prefix.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence

from dledger.core import (
    ConfState,
    InstallSnapshot,
    Message,
    RaftConfig,
    RaftNode,
    Ready,
    Role,
    SnapshotMeta,
)
from dledger.core.membership import joining
from dledger.log import Entry, persist
from dledger.sim.memlog import MemLog

MAX_DELIVERIES = 100_000  # a unit-test cluster that delivers more than this is livelocked

Item = Message | InstallSnapshot
DropFilter = Callable[[Item], bool]


def finish_ready(node: RaftNode, log: MemLog, rd: Ready) -> list[Message]:
    """Steps 2-5 of the driver contract for ``rd`` (whose early messages the caller sent):
    persist, then return the messages to send now; ``rd.committed`` is the caller's to apply.
    """
    persist(log, rd.hard_state, rd.truncate_from, rd.entries, flush=True)
    log.save_promise(rd.promise, rd.hard_state, hold=node.repairing)
    node.advance(rd)
    return list(rd.messages)


def drain(node: RaftNode, log: MemLog) -> list[Message]:
    """Every Ready of ``node`` carried out; the messages it sent, early ones first per Ready."""
    out: list[Message] = []
    while node.has_ready():
        rd = node.ready()
        out.extend(rd.early_messages)
        out.extend(finish_ready(node, log, rd))
    return out


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
        self.queue: list[Item] = []
        self.sent: list[Item] = []  # every message ever sent, for assertions
        # Snapshots in transit or accepted, per receiver: (meta, prefix hashes, entries).
        self.staged: dict[str, tuple[SnapshotMeta, list[int], list[int], list[Entry]]] = {}
        self.isolated: set[str] = set()
        self.drop: DropFilter | None = None
        # These nodes' persist jobs wait (their Ready stays outstanding) until release().
        self.hold_persist: set[str] = set()
        self.held: dict[str, Ready] = {}
        # Nodes whose last Ready held commit notices: released when the queue runs dry.
        self.lingering: set[str] = set()
        # Nodes that joined an existing group start (and restart) from this configuration.
        self.boot_conf: dict[str, ConfState] = {}
        self.boot_peers = self.ids
        for nid in self.ids:
            self.start(nid)

    def start(self, nid: str) -> RaftNode:
        cfg = self.configs.get(nid, self.config)
        log = self.logs[nid]
        promised, hard_state = log.start_state()
        node = RaftNode(
            nid,
            self.boot_peers,
            log,
            cfg,
            random.Random(f"{self.seed}-{nid}"),
            applied_index=log.first_index() - 1,
            conf_state=self.boot_conf.get(nid),
            promised=promised,
            hard_state=hard_state,
        )
        self.nodes[nid] = node
        self.applied[nid] = []
        return node

    def join(self, nid: str) -> RaftNode:
        """A new node with an empty log, waiting to be added (it knows only itself)."""
        self.ids = (*self.ids, nid)
        self.logs[nid] = MemLog()
        self.boot_conf[nid] = joining(nid)
        return self.start(nid)

    def crash_and_restart(self, nid: str) -> RaftNode:
        self.logs[nid].crash()
        self.held.pop(nid, None)  # its persist never happened
        self.lingering.discard(nid)  # a new incarnation holds no notice
        self.queue = [m for m in self.queue if m.to_id != nid and m.from_id != nid]
        return self.start(nid)

    # driving ----------------------------------------------------------------------------

    def process(self, nid: str) -> None:
        node = self.nodes[nid]
        while nid not in self.held and node.has_ready():
            rd = node.ready()
            if rd.notices_held:
                self.lingering.add(nid)
            else:
                self.lingering.discard(nid)  # an append carried the commit: nothing held
            self._send(rd.early_messages)
            for req in rd.snapshot_requests:
                self._send_snapshot(nid, req.to_id, req.term)
            if nid in self.hold_persist:
                self.held[nid] = rd
                return
            self._finish(nid, rd)

    def release(self, nid: str) -> None:
        """Stop holding ``nid``'s persists; the held one completes now."""
        self.hold_persist.discard(nid)
        rd = self.held.pop(nid, None)
        if rd is not None:
            self._finish(nid, rd)
        self.process(nid)

    def _finish(self, nid: str, rd: Ready) -> None:
        if rd.snapshot is not None:
            meta, hashes, chains, entries = self.staged.pop(nid)
            assert meta == rd.snapshot, "installed a snapshot that was not transferred"
            self.logs[nid].install(meta, hashes, chains)
            self.applied[nid] = list(entries)
        self._send(finish_ready(self.nodes[nid], self.logs[nid], rd))
        if rd.rewind_to is not None:
            self.applied[nid] = [e for e in self.applied[nid] if e.index <= rd.rewind_to]
        self.applied[nid].extend(rd.committed)

    def _send_snapshot(self, nid: str, to: str, term: int) -> None:
        """The leader's applied prefix, as a snapshot for ``to``."""
        log = self.logs[nid]
        entries = self.applied[nid]
        index = entries[-1].index if entries else log.first_index() - 1
        meta = SnapshotMeta(index, log.term_at(index), chain=log.chain_at(index))
        self.staged[to] = (meta, log.prefix_hashes(index), log.prefix_chains(index), list(entries))
        self._send([InstallSnapshot(nid, to, term, meta.index, meta.term, None, meta.chain)])

    def compact(self, nid: str, upto: int) -> None:
        """Retention on ``nid``: delete its log up to ``upto`` (applied there)."""
        self.logs[nid].compact(upto)

    def _send(self, messages: Sequence[Item]) -> None:
        self.sent.extend(messages)
        self.queue.extend(messages)

    def process_all(self) -> None:
        for nid in self.ids:
            self.process(nid)

    def _blocked(self, m: Item) -> bool:
        if m.from_id in self.isolated or m.to_id in self.isolated:
            return True
        return self.drop is not None and self.drop(m)

    def deliver(self, max_messages: int = MAX_DELIVERIES) -> int:
        """Deliver queued messages (and the ones they cause) until the queue is empty and
        no commit notice is held."""
        self.process_all()
        count = 0
        while self.queue or self.lingering:
            if not self.queue:
                self._release_notices()
                continue
            m = self.queue.pop(0)
            count += 1
            assert count <= max_messages, "cluster did not quiesce"
            if self._blocked(m) or m.to_id not in self.nodes:  # no such node: lost
                continue
            self.nodes[m.to_id].step(m)
            self.process(m.to_id)
            if isinstance(m, InstallSnapshot):
                self.nodes[m.from_id].report_snapshot(m.to_id, True, m.snapshot_index)
                self.process(m.from_id)
        return count

    def _release_notices(self) -> None:
        """The linger is over for every node that holds commit notices."""
        lingering, self.lingering = self.lingering, set()
        for nid in sorted(lingering):
            self.nodes[nid].release_notices()
            self.process(nid)

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
