"""A broker node without Raft or gRPC for component tests: a real BrokerStateMachine over an
in-memory log that applies every proposal at once (a one-node group that always commits)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from broker.components.applied import AppliedMessages, NodeContext
from broker.components.settings import ServiceConfig
from broker.components.topics import Topics
from broker.state.machine import BrokerStateMachine
from broker.state.message import UniqIdGenerator
from dledger.core import Role
from dledger.log import Entry, IndexOutOfRangeError

ENTRY_HEADER_BYTES = 48  # any per-entry overhead: positions only depend on the log


class MemoryLog:
    """Committed entries laid out back to back, readable by position like the real store."""

    def __init__(self) -> None:
        self.entries: list[Entry] = []
        self.positions: list[int] = []
        self.data = bytearray()

    def add(self, body: bytes, entry_type: int) -> Entry:
        e = Entry(term=1, index=len(self.entries) + 1, body=body, type=entry_type)
        self.data += bytes(ENTRY_HEADER_BYTES)
        self.positions.append(len(self.data))
        self.data += body
        self.entries.append(e)
        return e

    def body_position(self, index: int) -> int:
        return self.positions[index - 1]

    def first_index(self) -> int:
        return 1

    def last_index(self) -> int:
        return len(self.entries)

    def read_at(self, position: int, size: int) -> bytes:
        return bytes(self.data[position : position + size])

    def read(self, index: int) -> Entry:
        return self.entries[index - 1]

    @property
    def write_position(self) -> int:
        return len(self.data)


class LeaderNode:
    """A ``broker.components.raftnode.RaftNode`` for component tests: a leader whose proposals
    commit and apply at once; ``proposals`` counts them. A test changes ``role``, ``term`` or
    ``last_index`` as an election would."""

    def __init__(self, sm: BrokerStateMachine, log: MemoryLog) -> None:
        self.sm = sm
        self.store = log
        self.self_id = "n0"
        self.role = Role.LEADER
        self.leader_id: str | None = "n0"
        self.term = 1
        self.last_index = 0
        self.max_body_bytes = 8 << 20
        self.append_timeout_ms = 3000
        self.removed_listeners: list[Callable[[], None]] = []
        self.proposals = 0
        self.gate: Any = None  # an asyncio.Event a proposal waits for, when set
        self.readers_waiting = False  # as set_readers_waiting last said
        self.readers_waiting_calls = 0

    def set_readers_waiting(self, waiting: bool) -> None:
        self.readers_waiting = waiting
        self.readers_waiting_calls += 1

    def suspect_damage(self, position: int, found_by: str = "read") -> None:
        """The real node checks the log entry holding ``position``; this log has no damage."""

    def leader_client_addr(self) -> tuple[str | None, str]:
        return self.leader_id, ""

    async def start(self) -> None:
        """Nothing to open: the log is in memory."""

    async def stop(self) -> None:
        """Nothing to close."""

    async def propose(
        self, bodies: list[bytes], entry_type: int, *, headroom_bytes: int = 0
    ) -> tuple[int, int, int]:
        self.proposals += 1
        if self.gate is not None:
            await self.gate.wait()
        entries = [self.store.add(b, entry_type) for b in bodies]
        self.sm.apply(entries)
        return entries[0].index, entries[-1].index, 1


class LogAgain:
    """For a restart test: a log that holds every index the first run wrote (the snapshot's
    applied index must be inside the log; its entries are not read again)."""

    def body_position(self, index: int) -> int:
        return 0

    def first_index(self) -> int:
        return 1

    def last_index(self) -> int:
        return 1 << 40

    def read(self, index: int) -> Entry:
        raise IndexOutOfRangeError("LogAgain holds no entries: the open-time check stops")

    def read_at(self, position: int, size: int) -> bytes:
        raise IndexOutOfRangeError("LogAgain holds no bytes: the open-time check stops")


def world(
    root: Path, cfg: ServiceConfig | None = None
) -> tuple[LeaderNode, BrokerStateMachine, Topics, AppliedMessages]:
    """(node, state machine, topics, applied messages) of a fresh one-node leader."""
    log = MemoryLog()
    sm = BrokerStateMachine(root, hash_slots=1000, max_index_records=5000)
    sm.attach(log)
    sm.applied_index()
    sm.on_role_change(Role.LEADER, 1, "n0")  # results are kept for a leader's send handlers
    node = LeaderNode(sm, log)
    ctx = NodeContext(node, sm, cfg or ServiceConfig("127.0.0.1", 10911))
    return node, sm, Topics(ctx), AppliedMessages(ctx)


IDS = UniqIdGenerator(ip="10.0.0.1", pid=7, instance_hash=1)


@dataclass
class Outgoing:
    """A message as a front end hands it over (the fields a producer fills)."""

    queue_id: int
    body: bytes
    msg_id: str
    properties: dict[str, str] = field(default_factory=dict)
    topic: str = ""
    tags: str = "A"
    keys: tuple[str, ...] = ()
    born_host: str = ""
    born_timestamp_ms: int = 0
    producer_group: str = ""
    reconsume_times: int = 0
    flag: int = 0
    sys_flag: int = 0


def outgoing(queue_id: int, n: int, **properties: str) -> Outgoing:
    return Outgoing(queue_id, f"body-{n}".encode(), IDS.next_id(), properties)


def reopen(root: Path) -> BrokerStateMachine:
    """The state machine of a node restarted on ``root``, from its snapshot (closed by the
    caller)."""
    sm = BrokerStateMachine(root, hash_slots=1000, max_index_records=5000)
    sm.attach(LogAgain())
    sm.applied_index()
    return sm
