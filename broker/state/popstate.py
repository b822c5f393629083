"""POP consumption's replicated state: per (consumer group, topic, queue) the pop position and
the in-flight messages (received, not yet acknowledged), built from committed entries only.

Every change is one :data:`broker.state.records.ENTRY_POP` record proposed by the leader
(:mod:`broker.components.pop`) with the leader's clock decision in it (a deadline, or "now" for a
redelivery), so every member holds the same state and a new leader carries on where the last
applied record stopped. Nothing here reads a clock. A record that breaks a rule raises
:class:`InvalidRecordError` (every member skips it); one that is merely stale (proposed by a
deposed leader, or twice) changes nothing.

A receipt handle names (group, topic, queue, queue offset, sequence): the sequence is the log
index of the record that last handed the message out, so a handle is valid only while its
message is in flight under exactly that delivery (docs/RMQ5.md, "Receipt handles").
"""

from __future__ import annotations

import base64
import binascii
import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from broker.state.errors import BrokerError, InvalidRequestError
from broker.state.names import is_valid_group_name, is_valid_topic_name
from broker.state.records import MAX_QUEUE_NUMS
from mqerrors import codes as E

OP_POP = 1  # pop position moves to ``to``; new messages and redelivered ones go in flight
OP_ACK = 2  # acknowledged: out of flight
OP_CHANGE = 3  # a new deadline (and sequence: the old handle is dead)
OP_REVIVE = 4  # deadline passed: visible again, attempt + 1
OP_DROP = 5  # out of flight after its dead-letter copy was stored
# A FIFO group's pop: as OP_POP, but stale while any message of the queue is still invisible,
# and new messages only when none is in flight (the queue's previous batch is done), so the
# blocking needs no state of its own and a deposed leader's pop cannot break the order.
OP_POP_FIFO = 6
OP_RENEW = 7  # auto_renew: a new deadline for the same delivery (the handle stays valid)
_POPS = frozenset({OP_POP, OP_POP_FIFO})
_OPS = frozenset({OP_POP, OP_ACK, OP_CHANGE, OP_REVIVE, OP_DROP, OP_POP_FIFO, OP_RENEW})
POP_RECORD_VERSION = 1

# In-flight messages of one (group, topic, queue): RocketMQ's popInflightMessageThreshold; a
# group that receives and never acks stops getting new messages there, not the broker memory.
MAX_INFLIGHT_PER_QUEUE = 10_000
# In-flight messages on the broker: each costs ~150 bytes of memory and ~60 bytes of snapshot
# (a snapshot of 200,000 is ~12 MB, written in the background).
MAX_INFLIGHT_TOTAL = 200_000
# (group, topic, queue) triples with POP state: far above real deployments (groups x queues),
# small enough that made-up group names cannot grow the state without bound.
MAX_POP_QUEUES = 100_000
# Items in one record: a receive batch is at most 32 (the proxy's), a redelivery or ack pass
# takes at most this many at once.
MAX_RECORD_ITEMS = 1024
_I64_MAX = (1 << 63) - 1
MAX_QUEUE_ID = MAX_QUEUE_NUMS - 1

# version, op, queue id, now, deadline, from, to
_HEAD = struct.Struct(">BBiqqqq")
_ITEM = struct.Struct(">qq")
_U8 = struct.Struct(">B")
_U16 = struct.Struct(">H")
# version, queue id, queue offset, sequence (then u8 len + group, u8 len + topic)
_HANDLE = struct.Struct(">Biqq")
HANDLE_VERSION = 1
# A handle's characters: base64 of at most 1 + 4 + 16 + 2 + 2 * 255 bytes.
MAX_HANDLE_CHARS = 1024

# The one answer to a handle that is not one, or names another group or topic than the request.
MALFORMED_HANDLE = "the receipt handle is malformed or not of this group and topic"
PopKey = tuple[str, str, int]  # consumer group, topic, queue id


class InvalidPopRecordError(BrokerError):
    """A POP record that breaks a rule: every member skips it."""

    code = E.INVALID_RECORD


class InvalidReceiptHandleError(InvalidRequestError):
    """A receipt handle that is malformed, names another group or topic, or whose delivery is
    over (acknowledged, redelivered since, or its invisible time changed)."""

    code = E.INVALID_RECEIPT_HANDLE


@dataclass(slots=True)
class InFlight:
    """One received, unacknowledged message: ``deadline_ms`` 0 when it is visible again
    (waiting for the next receive), ``seq`` the log index that last handed it out."""

    position: int
    deadline_ms: int
    attempt: int
    seq: int


@dataclass(slots=True)
class QueuePop:
    offset: int = 0  # the next queue offset a receive looks at
    inflight: dict[int, InFlight] = field(default_factory=dict)  # by queue offset


class PopRecord(NamedTuple):
    """One decoded record. ``items`` are (queue offset, position) for OP_POP's new messages,
    (queue offset, sequence) for every other op; ``retakes`` (OP_POP only) are redelivered
    messages as (queue offset, sequence)."""

    op: int
    group: str
    topic: str
    queue_id: int
    now_ms: int = 0
    deadline_ms: int = 0
    from_offset: int = 0
    to_offset: int = 0
    items: tuple[tuple[int, int], ...] = ()
    retakes: tuple[tuple[int, int], ...] = ()


class Handle(NamedTuple):
    group: str
    topic: str
    queue_id: int
    offset: int
    seq: int


def encode_pop_record(r: PopRecord) -> bytes:
    g, t = r.group.encode("utf-8"), r.topic.encode("ascii")
    head = _HEAD.pack(
        POP_RECORD_VERSION, r.op, r.queue_id, r.now_ms, r.deadline_ms, r.from_offset, r.to_offset
    )
    parts = [head, _U8.pack(len(g)), g, _U8.pack(len(t)), t]
    for items in (r.items, r.retakes):
        parts.append(_U16.pack(len(items)))
        parts.extend(_ITEM.pack(a, b) for a, b in items)
    return b"".join(parts)


def decode_pop_record(body: bytes) -> PopRecord:
    try:
        version, op, queue_id, now, deadline, start, end = _HEAD.unpack_from(body, 0)
        at = _HEAD.size
        names = []
        for _ in range(2):
            n = body[at]
            names.append(bytes(body[at + 1 : at + 1 + n]))
            at += 1 + n
        lists = []
        for _ in range(2):
            (count,) = _U16.unpack_from(body, at)
            at += 2
            raw = body[at : at + count * _ITEM.size]
            if len(raw) != count * _ITEM.size:
                raise InvalidPopRecordError("truncated POP record items")
            lists.append(tuple(_ITEM.iter_unpack(raw)))
            at += count * _ITEM.size
        group, topic = names[0].decode("utf-8"), names[1].decode("ascii")
    except (IndexError, struct.error, UnicodeDecodeError) as exc:
        raise InvalidPopRecordError(f"truncated POP record: {exc}") from None
    if at != len(body) or version != POP_RECORD_VERSION or op not in _OPS:
        raise InvalidPopRecordError(f"POP record version {version} op {op} size {len(body)}")
    return PopRecord(op, group, topic, queue_id, now, deadline, start, end, lists[0], lists[1])


def _check_record(r: PopRecord) -> None:
    if not is_valid_group_name(r.group) or not is_valid_topic_name(r.topic):
        raise InvalidPopRecordError("POP record names an invalid group or topic")
    if not 0 <= r.queue_id <= MAX_QUEUE_ID:
        raise InvalidPopRecordError(f"POP record queue id {r.queue_id}")
    if len(r.items) + len(r.retakes) > MAX_RECORD_ITEMS:
        raise InvalidPopRecordError(f"POP record of more than {MAX_RECORD_ITEMS} items")
    values = (r.now_ms, r.deadline_ms, r.from_offset, r.to_offset)
    if any(not 0 <= v <= _I64_MAX for v in values) or r.from_offset > r.to_offset:
        raise InvalidPopRecordError("POP record times or offsets out of range")
    if any(a < 0 or b < 0 for a, b in (*r.items, *r.retakes)):
        raise InvalidPopRecordError("POP record item with a negative offset or position")
    if r.op in (OP_POP, OP_POP_FIFO, OP_CHANGE, OP_RENEW) and r.deadline_ms <= r.now_ms:
        raise InvalidPopRecordError("POP record with a deadline not after its time")


class PopState:
    """Every (group, topic, queue)'s pop position and in-flight messages."""

    def __init__(self) -> None:
        self.queues: dict[PopKey, QueuePop] = {}
        self.inflight_total = 0

    def get(self, key: PopKey) -> QueuePop | None:
        return self.queues.get(key)

    def apply(self, index: int, body: bytes) -> PopRecord:
        """Apply one committed record (its log index is the sequence of what it hands out)."""
        r = decode_pop_record(body)
        _check_record(r)
        key = (r.group, r.topic, r.queue_id)
        if r.op in _POPS:
            self._apply_pop(index, key, r)
            return r
        q = self.queues.get(key)
        if q is None:
            return r
        for offset, seq in r.items:
            rec = q.inflight.get(offset)
            if rec is None or rec.seq != seq:
                continue  # stale: acknowledged or handed out again since
            if r.op in (OP_ACK, OP_DROP):
                del q.inflight[offset]
                self.inflight_total -= 1
            elif r.op == OP_CHANGE and rec.deadline_ms:
                rec.deadline_ms, rec.seq = r.deadline_ms, index
            elif r.op == OP_RENEW and rec.deadline_ms:
                rec.deadline_ms = r.deadline_ms
            elif r.op == OP_REVIVE and 0 < rec.deadline_ms <= r.now_ms:
                rec.deadline_ms, rec.attempt, rec.seq = 0, rec.attempt + 1, index
        return r

    def _apply_pop(self, index: int, key: PopKey, r: PopRecord) -> None:
        q = self.queues.get(key)
        current = 0 if q is None else q.offset
        if r.from_offset != current:
            return  # stale: another pop moved the position first
        held = 0 if q is None else len(q.inflight)
        if q is None and len(self.queues) >= MAX_POP_QUEUES:
            raise InvalidPopRecordError(f"the broker holds POP state of {MAX_POP_QUEUES} queues")
        if held + len(r.items) > MAX_INFLIGHT_PER_QUEUE or (
            self.inflight_total + len(r.items) > MAX_INFLIGHT_TOTAL
        ):
            raise InvalidPopRecordError("POP record over the in-flight limits")
        last = r.from_offset - 1
        for offset, _position in r.items:
            if not last < offset < r.to_offset:
                raise InvalidPopRecordError("POP record items out of order or range")
            last = offset
        for offset, seq in r.retakes:
            rec = None if q is None else q.inflight.get(offset)
            if rec is None or rec.seq != seq or rec.deadline_ms:
                return  # stale: taken, acknowledged or dropped since
        if r.op == OP_POP_FIFO and q is not None and fifo_blocked(q, bool(r.items)):
            return  # stale: the queue's previous batch is not done
        if q is None:
            q = self.queues[key] = QueuePop()
        q.offset = r.to_offset
        for offset, position in r.items:
            q.inflight[offset] = InFlight(position, r.deadline_ms, 1, index)
        self.inflight_total += len(r.items)
        for offset, _seq in r.retakes:
            rec = q.inflight[offset]
            rec.deadline_ms, rec.seq = r.deadline_ms, index

    def drop_topic(self, topic: str) -> None:
        """A deleted topic's POP state goes with its queues."""
        for key in [k for k in self.queues if k[1] == topic]:
            self.inflight_total -= len(self.queues.pop(key).inflight)

    def reset(self) -> None:
        self.queues = {}
        self.inflight_total = 0

    # ------------------------------------------------------------------ snapshot

    def capture(self) -> list[list[Any]]:
        """The state as JSON-ready rows: [group, topic, queue, offset, [[offset, position,
        deadline, attempt, seq], ...]]."""
        return [
            [
                g,
                t,
                qid,
                q.offset,
                [[o, r.position, r.deadline_ms, r.attempt, r.seq] for o, r in q.inflight.items()],
            ]
            for (g, t, qid), q in self.queues.items()
        ]

    def load(self, rows: Iterable[Sequence[Any]]) -> list[str]:
        """Replace the state with a snapshot's rows; the names of the rows left out (invalid)."""
        self.reset()
        bad: list[str] = []
        for row in rows:
            try:
                key, q = _row_queue(row)
            except (TypeError, ValueError, InvalidPopRecordError):
                bad.append(str(row)[:80])
                continue
            if len(self.queues) >= MAX_POP_QUEUES or (
                self.inflight_total + len(q.inflight) > MAX_INFLIGHT_TOTAL
            ):
                bad.append("/".join(map(str, key)))
                continue
            self.queues[key] = q
            self.inflight_total += len(q.inflight)
        return bad


def _row_queue(row: Sequence[Any]) -> tuple[PopKey, QueuePop]:
    group, topic, qid, offset, items = row
    r = PopRecord(
        OP_ACK, str(group), str(topic), int(qid), from_offset=int(offset), to_offset=int(offset)
    )
    _check_record(r)
    if len(items) > MAX_INFLIGHT_PER_QUEUE:
        raise ValueError("too many in-flight messages")
    q = QueuePop(int(offset))
    for o, position, deadline, attempt, seq in items:
        values = (int(o), int(position), int(deadline), int(attempt), int(seq))
        if any(not 0 <= v <= _I64_MAX for v in values):
            raise ValueError("in-flight values out of range")
        q.inflight[values[0]] = InFlight(*values[1:])
    return (r.group, r.topic, r.queue_id), q


def fifo_blocked(q: QueuePop, new_messages: bool) -> bool:
    """Whether a FIFO group may not pop from ``q``: a message of its last batch is still
    invisible (being processed), or new messages are asked while any message is in flight."""
    if new_messages and q.inflight:
        return True
    return any(rec.deadline_ms for rec in q.inflight.values())


# ---------------------------------------------------------------------- receipt handles


def encode_handle(h: Handle) -> str:
    g, t = h.group.encode("utf-8"), h.topic.encode("ascii")
    raw = _HANDLE.pack(HANDLE_VERSION, h.queue_id, h.offset, h.seq)
    raw += _U8.pack(len(g)) + g + _U8.pack(len(t)) + t
    return base64.urlsafe_b64encode(raw).decode("ascii").rstrip("=")


def decode_handle(text: str) -> Handle:
    """A handle's fields; :class:`InvalidReceiptHandleError` when it is not one."""
    if not 0 < len(text) <= MAX_HANDLE_CHARS:
        raise InvalidReceiptHandleError(MALFORMED_HANDLE)
    try:
        raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
        version, queue_id, offset, seq = _HANDLE.unpack_from(raw, 0)
        at = _HANDLE.size
        n = raw[at]
        group = raw[at + 1 : at + 1 + n].decode("utf-8")
        at += 1 + n
        m = raw[at]
        topic = raw[at + 1 : at + 1 + m].decode("ascii")
        at += 1 + m
    except (ValueError, IndexError, struct.error, binascii.Error):
        raise InvalidReceiptHandleError(MALFORMED_HANDLE) from None
    if version != HANDLE_VERSION or at != len(raw) or len(group) != n or len(topic) != m:
        raise InvalidReceiptHandleError(MALFORMED_HANDLE)
    if not 0 <= queue_id <= MAX_QUEUE_ID or offset < 0 or seq < 0:
        raise InvalidReceiptHandleError(MALFORMED_HANDLE)
    return Handle(group, topic, queue_id, offset, seq)


def check_handle(state: PopState, h: Handle, group: str, topic: str) -> InFlight:
    """The in-flight message ``h`` names, for ``group`` and ``topic``; raises
    :class:`InvalidReceiptHandleError` for another group's or topic's handle (with the answer
    of a malformed one: a caller learns nothing of handles outside its rights), or a delivery
    that is over."""
    if h.group != group or h.topic != topic:
        raise InvalidReceiptHandleError(MALFORMED_HANDLE)
    q = state.get((h.group, h.topic, h.queue_id))
    rec = None if q is None else q.inflight.get(h.offset)
    if rec is None or rec.seq != h.seq or not rec.deadline_ms:
        raise InvalidReceiptHandleError(
            "the receipt handle is stale: acknowledged, redelivered or changed since"
        )
    return rec
