"""Transactional messages' replicated state: the half messages waiting for their producer's
verdict, and the verdicts of the most recent resolved ones, built from committed entries only.

Every change is one :data:`broker.state.records.ENTRY_TXN` record proposed by the leader
(:mod:`broker.components.transactions`) with the leader's clock decision in it, so every member
holds the same table and a new leader carries on where the last applied record stopped. Nothing
here reads a clock. A record that breaks a rule raises :class:`InvalidTxnRecordError` before
anything changed (every member skips it); one that is merely stale (a second commit of the same
transaction, a check of one resolved since) changes nothing.

The records (docs/FORMAT.md, "Broker: transaction records"):

- prepare: the real topic and queue, then a batch of one message for :data:`HALF_TOPIC`
  queue 0 (the half message, stored like any message but in a topic no consumer reads). The
  half's commitlog position is the transaction's id;
- commit: the half's position, then a batch of the one visible copy for the real topic,
  applied only while the transaction is pending (so the copy is stored exactly once);
- rollback: the half's position;
- check: the leader's now, then (position, checks done before) per half checked back;
- discard: (position, checks done before) per half given up after the last check.
"""

from __future__ import annotations

import logging
import operator
import struct
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol

from broker.state.errors import BrokerError, InvalidRequestError
from broker.state.message import scan_dispatch
from broker.state.names import TRANS_HALF_TOPIC, is_valid_topic_name
from broker.state.records import MAX_QUEUE_NUMS, MAX_STORE_TIMESTAMP_MS
from mqerrors import codes as E

logger = logging.getLogger(__name__)

# RocketMQ's half-message topic: a half waits here, invisible to consumers (a system topic
# without a config: no pull or receive names it, no topic record may create it), until its
# transaction is resolved.
HALF_TOPIC = TRANS_HALF_TOPIC
# RocketMQ's MessageConst.PROPERTY_TRANSACTION_PREPARED: a send whose messages carry it with
# the value "true" stores half messages (RocketMQ 4's protocol; the v2 front end sets it for a
# TRANSACTION message it forwards).
PROPERTY_TRANSACTION_PREPARED = "TRAN_MSG"

OP_PREPARE = 1
OP_COMMIT = 2
OP_ROLLBACK = 3
OP_CHECK = 4
OP_DISCARD = 5
TXN_RECORD_VERSION = 1

COMMITTED = "COMMITTED"
ROLLED_BACK = "ROLLED_BACK"
DISCARDED = "DISCARDED"
OUTCOMES = (COMMITTED, ROLLED_BACK, DISCARDED)

# Half messages waiting on a broker: each costs ~330 bytes of memory and ~90 bytes of
# snapshot; a flood of never-resolved halves is refused at the send (TOO_MANY_REQUESTS) before
# it grows the table, and the check-back discards each after its last check.
MAX_PENDING_HALVES = 100_000
# Resolved transactions remembered, oldest forgotten first: a retried EndTransaction (a lost
# answer, a failover) finds its verdict here and is answered OK without a second copy. 100,000
# covers any retry schedule at thousands of transactions per second.
MAX_RESOLVED_KEPT = 100_000
# Items in one check, discard or rollback record.
MAX_RECORD_ITEMS = 1024
# A half is checked at most this many times (the configured transactionCheckMax is bounded by
# it): the count is a u16 in records.
MAX_CHECKS = 1000
MAX_QUEUE_ID = MAX_QUEUE_NUMS - 1
_I64_MAX = (1 << 63) - 1
# The leader's clock in a record: the same bound as a store timestamp.
MAX_TIME_MS = MAX_STORE_TIMESTAMP_MS

_HEAD = struct.Struct(">BB")  # version, op
_PREPARE = struct.Struct(">iB")  # real queue id, topic length (then the topic, then a batch)
_POSITION = struct.Struct(">q")
_COUNT = struct.Struct(">H")
_TIME = struct.Struct(">q")
_CHECK_ITEM = struct.Struct(">qH")  # half position, checks done before


class InvalidTxnRecordError(BrokerError):
    """A transaction record that breaks a rule: every member skips it."""

    code = E.INVALID_RECORD


class InvalidTransactionIdError(InvalidRequestError):
    """An EndTransaction naming no transaction of this broker, another message's or topic's,
    or a verdict contrary to the one already applied."""

    code = E.INVALID_TRANSACTION_ID


@dataclass(slots=True)
class Half:
    """One half message waiting for its verdict. ``position`` is its commitlog position (the
    transaction id), ``topic``/``queue_id`` where a commit stores it, ``stored_ms`` the store
    time the leader gave it, ``last_check_ms`` the leader's time of the last check (0: none)."""

    position: int
    size: int
    uniq_id: str
    topic: str
    queue_id: int
    stored_ms: int
    checks: int = 0
    last_check_ms: int = 0


class Resolved(NamedTuple):
    uniq_id: str
    topic: str
    outcome: str


class TxnRecord(NamedTuple):
    """One decoded record. ``items`` are (position, checks before) for check and discard,
    (position, 0) for commit and rollback; ``batch_at`` is where a prepare's or a commit's
    message batch starts in the body (0: none)."""

    op: int
    topic: str = ""
    queue_id: int = 0
    now_ms: int = 0
    items: tuple[tuple[int, int], ...] = ()
    batch_at: int = 0


class StoredMessage(Protocol):
    """What applying a batch reports per message (``broker.state.machine.SendResult``)."""

    @property
    def position(self) -> int: ...
    @property
    def store_timestamp_ms(self) -> int: ...
    @property
    def uniq_id(self) -> str: ...
    @property
    def duplicate(self) -> bool: ...


# Applies the record's message batch from this body offset (deduplicated by uniq id or not).
StoreBatch = Callable[[int, bool], Sequence[StoredMessage]]
CheckListener = Callable[[Sequence[Half]], None]


def transaction_id(position: int) -> str:
    """The transaction id a producer is given: the half's position, 16 upper-case hex."""
    return f"{position:016X}"


def parse_transaction_id(text: str) -> int:
    """The half position a transaction id names; InvalidTransactionIdError when malformed."""
    if len(text) != 16 or any(c not in "0123456789ABCDEF" for c in text):
        raise InvalidTransactionIdError(
            f"transaction id {text[:40]!r} is not 16 upper-case hex characters"
        )
    return int(text, 16)


# ------------------------------------------------------------------------- records


def encode_prepare(topic: str, queue_id: int, batch: bytes) -> bytes:
    name = topic.encode("ascii")
    head = _HEAD.pack(TXN_RECORD_VERSION, OP_PREPARE) + _PREPARE.pack(queue_id, len(name))
    return head + name + batch


def encode_commit(position: int, batch: bytes) -> bytes:
    return _HEAD.pack(TXN_RECORD_VERSION, OP_COMMIT) + _POSITION.pack(position) + batch


def encode_rollback(position: int) -> bytes:
    return _HEAD.pack(TXN_RECORD_VERSION, OP_ROLLBACK) + _POSITION.pack(position)


def encode_checks(op: int, now_ms: int, items: Sequence[tuple[int, int]]) -> bytes:
    """A check (``now_ms`` the leader's time) or discard record of (position, checks) items."""
    assert op in (OP_CHECK, OP_DISCARD) and 0 < len(items) <= MAX_RECORD_ITEMS
    parts = [_HEAD.pack(TXN_RECORD_VERSION, op), _TIME.pack(now_ms), _COUNT.pack(len(items))]
    parts.extend(_CHECK_ITEM.pack(p, c) for p, c in items)
    return b"".join(parts)


def decode_txn_record(body: bytes) -> TxnRecord:
    """The record's fields, range-checked; InvalidTxnRecordError when malformed."""
    try:
        version, op = _HEAD.unpack_from(body, 0)
        at = _HEAD.size
        if version != TXN_RECORD_VERSION:
            raise InvalidTxnRecordError(f"transaction record version {version}")
        if op == OP_PREPARE:
            queue_id, n = _PREPARE.unpack_from(body, at)
            at += _PREPARE.size
            topic = bytes(body[at : at + n]).decode("ascii")
            record = TxnRecord(op, topic, queue_id, batch_at=at + n)
        elif op in (OP_COMMIT, OP_ROLLBACK):
            (position,) = _POSITION.unpack_from(body, at)
            end = at + _POSITION.size
            if op == OP_ROLLBACK and end != len(body):
                raise InvalidTxnRecordError("rollback record size mismatch")
            record = TxnRecord(op, items=((position, 0),), batch_at=end if op == OP_COMMIT else 0)
        elif op in (OP_CHECK, OP_DISCARD):
            (now_ms,) = _TIME.unpack_from(body, at)
            (count,) = _COUNT.unpack_from(body, at + _TIME.size)
            at += _TIME.size + _COUNT.size
            if len(body) != at + count * _CHECK_ITEM.size:
                raise InvalidTxnRecordError("check record size mismatch")
            items = tuple(_CHECK_ITEM.iter_unpack(body[at:]))
            record = TxnRecord(op, now_ms=now_ms, items=items)
        else:
            raise InvalidTxnRecordError(f"transaction record op {op}")
    except (struct.error, UnicodeDecodeError) as exc:
        raise InvalidTxnRecordError(f"truncated transaction record: {exc}") from None
    _check_record(record, len(body))
    return record


def _check_record(r: TxnRecord, size: int) -> None:
    if r.op == OP_PREPARE and (
        not is_valid_topic_name(r.topic) or not 0 <= r.queue_id <= MAX_QUEUE_ID
    ):
        raise InvalidTxnRecordError("prepare record names an invalid topic or queue")
    if r.batch_at and r.batch_at >= size:
        raise InvalidTxnRecordError("prepare or commit record without its message")
    if len(r.items) > MAX_RECORD_ITEMS or (r.op in (OP_CHECK, OP_DISCARD) and not r.items):
        raise InvalidTxnRecordError(f"transaction record of {len(r.items)} items")
    if not 0 <= r.now_ms <= MAX_TIME_MS:
        raise InvalidTxnRecordError(f"transaction record time {r.now_ms} out of range")
    if any(not 0 <= p <= _I64_MAX or c > MAX_CHECKS for p, c in r.items):
        raise InvalidTxnRecordError("transaction record item out of range")


# ------------------------------------------------------------------------- the table


class TxnState:
    """Pending halves by position (in prepare order) and recent verdicts, bounded."""

    def __init__(self) -> None:
        self.pending: dict[int, Half] = {}
        self.resolved: OrderedDict[int, Resolved] = OrderedDict()
        # Halves given up after their last check, since start (every member counts the same
        # records): for metrics and status.
        self.discarded = 0
        self._check_listeners: list[CheckListener] = []

    def add_check_listener(self, listener: CheckListener) -> None:
        """Called on apply with the halves a check record checked (the v2 front end asks
        their producers, :mod:`broker.frontends.v2.txn`)."""
        self._check_listeners.append(listener)

    def verdict(self, position: int) -> Resolved | None:
        return self.resolved.get(position)

    def apply(self, index: int, body: bytes, store: StoreBatch) -> None:
        """Apply one record; ``store(at, dedup)`` applies its message batch."""
        r = decode_txn_record(body)
        if r.op == OP_PREPARE:
            self._apply_prepare(r, body, store)
        elif r.op == OP_COMMIT:
            self._apply_commit(index, r, body, store)
        elif r.op == OP_ROLLBACK:
            position = r.items[0][0]
            if position in self.pending:
                self._resolve(position, ROLLED_BACK)
        elif r.op == OP_CHECK:
            self._apply_check(r)
        else:
            self._apply_discard(index, r)

    def _apply_prepare(self, r: TxnRecord, body: bytes, store: StoreBatch) -> None:
        rows = scan_dispatch(memoryview(body)[r.batch_at :])
        if len(rows) != 1 or rows[0][2] != HALF_TOPIC or rows[0][3] != 0:
            raise InvalidTxnRecordError(f"prepare record not of one message for {HALF_TOPIC}/0")
        if len(self.pending) >= MAX_PENDING_HALVES:
            raise InvalidTxnRecordError(f"the broker holds {MAX_PENDING_HALVES} half messages")
        stored = store(r.batch_at, True)[0]
        if stored.duplicate:
            return  # a retried send: the first prepare registered it
        self.pending[stored.position] = Half(
            stored.position,
            rows[0][1],
            stored.uniq_id,
            r.topic,
            r.queue_id,
            stored.store_timestamp_ms,
        )

    def _apply_commit(self, index: int, r: TxnRecord, body: bytes, store: StoreBatch) -> None:
        position = r.items[0][0]
        rows = scan_dispatch(memoryview(body)[r.batch_at :])
        if len(rows) != 1:
            raise InvalidTxnRecordError("commit record of more than one message")
        half = self.pending.get(position)
        if half is None:
            logger.info("skip stale commit index=%d position=%d", index, position)
            return
        _, _, topic, queue_id, _, _, uniq_id, _ = rows[0]
        if topic != half.topic or uniq_id != half.uniq_id or not 0 <= queue_id <= MAX_QUEUE_ID:
            raise InvalidTxnRecordError(f"commit record's message is not the half at {position}")
        store(r.batch_at, False)
        self._resolve(position, COMMITTED)

    def _apply_check(self, r: TxnRecord) -> None:
        checked = []
        for position, before in r.items:
            half = self.pending.get(position)
            if half is not None and half.checks == before:
                half.checks = before + 1
                half.last_check_ms = r.now_ms
                checked.append(half)
        if checked:
            for listener in self._check_listeners:
                listener(checked)

    def _apply_discard(self, index: int, r: TxnRecord) -> None:
        for position, before in r.items:
            half = self.pending.get(position)
            if half is not None and half.checks == before:
                self._resolve(position, DISCARDED)
                self.discarded += 1
                logger.warning(
                    "transaction discarded after %d checks: message %s topic %s position %d"
                    " index=%d",
                    before,
                    half.uniq_id,
                    half.topic,
                    position,
                    index,
                )

    def _resolve(self, position: int, outcome: str) -> None:
        half = self.pending.pop(position)
        self.resolved[position] = Resolved(half.uniq_id, half.topic, outcome)
        while len(self.resolved) > MAX_RESOLVED_KEPT:
            self.resolved.popitem(last=False)

    def drop_topic(self, topic: str) -> None:
        """A deleted topic's pending halves can never be delivered: forgotten (as rolled
        back: an EndTransaction after the delete is told so)."""
        for position in [p for p, h in self.pending.items() if h.topic == topic]:
            self._resolve(position, ROLLED_BACK)

    # ------------------------------------------------------------------ snapshot

    def reset(self) -> None:
        self.pending.clear()
        self.resolved.clear()
        self.discarded = 0

    def capture(self) -> dict[str, Any]:
        """The table as snapshot rows (on the event loop: 100,000 pending halves take ~30 ms)."""
        return {
            "pending": list(map(_HALF_ROW, self.pending.values())),
            "resolved": [(p, *r) for p, r in self.resolved.items()],
            "discarded": self.discarded,
        }

    def load(self, data: Mapping[str, Any]) -> list[str]:
        """Replace the table by a snapshot's; the rows left out as invalid (named)."""
        self.reset()
        bad: list[str] = []
        for row in _rows(data.get("pending", ()), MAX_PENDING_HALVES, bad):
            try:
                half = _half_of_row(row)
            except (TypeError, ValueError):
                bad.append(f"pending {str(row)[:60]}")
                continue
            self.pending[half.position] = half
        for row in _rows(data.get("resolved", ()), MAX_RESOLVED_KEPT, bad):
            try:
                position, resolved = _resolved_of_row(row)
            except (TypeError, ValueError):
                bad.append(f"resolved {str(row)[:60]}")
                continue
            self.resolved[position] = resolved
        discarded = data.get("discarded", 0)
        self.discarded = discarded if isinstance(discarded, int) and discarded >= 0 else 0
        return bad


_HALF_ROW = operator.attrgetter(
    "position", "size", "uniq_id", "topic", "queue_id", "stored_ms", "checks", "last_check_ms"
)


def _rows(rows: Iterable[Any], limit: int, bad: list[str]) -> Iterable[Any]:
    for n, row in enumerate(rows):
        if n >= limit:
            bad.append(f"rows past {limit}")
            return
        yield row


def _half_of_row(row: Sequence[Any]) -> Half:
    if len(row) != 8:
        raise ValueError(f"pending row of {len(row)} items")
    position, size, uniq_id, topic, queue_id, stored_ms, checks, last_ms = row
    ints = (position, size, queue_id, stored_ms, checks, last_ms)
    if not all(isinstance(v, int) and v >= 0 for v in ints):
        raise ValueError("pending row values out of range")
    if not is_valid_topic_name(topic) or queue_id > MAX_QUEUE_ID or checks > MAX_CHECKS:
        raise ValueError("pending row names an invalid topic, queue or check count")
    if not isinstance(uniq_id, str) or len(uniq_id) != 32:
        raise ValueError("pending row message id")
    return Half(position, size, uniq_id, topic, queue_id, stored_ms, checks, last_ms)


def _resolved_of_row(row: Sequence[Any]) -> tuple[int, Resolved]:
    if len(row) != 4:
        raise ValueError(f"resolved row of {len(row)} items")
    position, uniq_id, topic, outcome = row
    if not isinstance(position, int) or position < 0 or outcome not in OUTCOMES:
        raise ValueError("resolved row values out of range")
    if not is_valid_topic_name(topic) or not isinstance(uniq_id, str) or len(uniq_id) != 32:
        raise ValueError("resolved row names an invalid topic or message id")
    return position, Resolved(uniq_id, topic, outcome)
