"""Transactional messages on the leader: store half messages, resolve them, check them back.

RocketMQ's model (a half message the consumers cannot see, a verdict from the producer, a
check-back when the verdict does not come), with its state in the replicated log
(:mod:`broker.state.transactions`): every decision is one ``ENTRY_TXN`` entry the leader
proposes, so a commit or rollback sent to a new leader after a failover finds the same table,
and a commit stores the visible copy exactly once however often it is sent.

Time-based decisions are the leader's: a pass of :meth:`Transactions._loop` finds the halves
whose immunity time (``transactionTimeOut``) or check interval (``transactionCheckInterval``)
has passed and proposes one check record for them (each member then asks the producers it is
connected to); a half checked ``transactionCheckMax`` times without a verdict is discarded one
interval after its last check, with a log line, counted in ``TxnState.discarded``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

from broker.components.applied import (
    AppliedMessages,
    require_leader,
    run_while_leading,
    start_leader_task,
)
from broker.components.sending import OutgoingMessage
from broker.state.errors import (
    InvalidRequestError,
    ResourceExhaustedError,
    TopicNotFoundError,
)
from broker.state.machine import SendResult
from broker.state.message import Message, UniqIdGenerator, encode_batch, message_from_fields
from broker.state.records import ENTRY_TXN, TopicConfig
from broker.state.transactions import (
    COMMITTED,
    HALF_TOPIC,
    MAX_PENDING_HALVES,
    MAX_RECORD_ITEMS,
    OP_CHECK,
    OP_DISCARD,
    PROPERTY_TRANSACTION_PREPARED,
    ROLLED_BACK,
    Half,
    InvalidTransactionIdError,
    encode_checks,
    encode_commit,
    encode_prepare,
    encode_rollback,
    parse_transaction_id,
)
from dledger.core import Role
from mqerrors import codes as E
from msgcodec import PROPERTY_DELAY, PROPERTY_REAL_QID, PROPERTY_REAL_TOPIC

logger = logging.getLogger(__name__)

# RocketMQ's defaults: a half is first checked 6 s after it was stored (transactionTimeOut),
# then every 30 s (transactionCheckInterval, RocketMQ 5), at most 15 times (transactionCheckMax).
DEFAULT_TIMEOUT_MS = 6000
DEFAULT_CHECK_INTERVAL_MS = 30_000
DEFAULT_CHECK_MAX = 15
# The checker looks again after this long when nothing is due sooner (a new half is due one
# immunity time after it was stored, so this bounds how late a check can be).
CHECK_IDLE_MS = 1000
CHECK_MIN_WAIT_MS = 20
# A new leader answers an EndTransaction only after it applied its own first entry (until then
# it may not have applied a half an older leader stored): it waits this long at most, polling.
CATCH_UP_WAIT_MS = 2000
CATCH_UP_POLL_MS = 10
# A pass reads the pending halves this many at a time, letting other work run in between (a
# scan of 100,000 takes ~100 ms of a loaded core).
CHECK_SCAN_CHUNK = 4096
# Records one pass proposes at most (each of up to MAX_RECORD_ITEMS halves): the next pass
# goes on, so a backlog of 100,000 due halves never makes one burst of proposals.
CHECK_RECORDS_PER_PASS = 8


@dataclass(frozen=True, slots=True)
class TxnSettings:
    """``timeout_ms``: immunity time before the first check; ``check_interval_ms`` between
    checks; ``check_max`` checks before a half is discarded."""

    timeout_ms: int = DEFAULT_TIMEOUT_MS
    check_interval_ms: int = DEFAULT_CHECK_INTERVAL_MS
    check_max: int = DEFAULT_CHECK_MAX


class TooManyHalvesError(ResourceExhaustedError):
    code = E.TOO_MANY_HALF_MESSAGES


class CatchingUpError(ResourceExhaustedError):
    """A new leader has not applied the entries of earlier terms yet (the client retries)."""

    code = E.LEADER_CATCHING_UP


def due_halves(
    halves: Iterable[Half], now_ms: int, cfg: TxnSettings
) -> tuple[list[tuple[int, int]], list[tuple[int, int]], int | None]:
    """The (position, checks) of halves to check and of halves to discard now, and the next
    time (ms) another one falls due (None: none pending)."""
    checks: list[tuple[int, int]] = []
    discards: list[tuple[int, int]] = []
    next_due: int | None = None
    for h in halves:
        if h.checks == 0:
            due = h.stored_ms + cfg.timeout_ms
        else:
            due = h.last_check_ms + cfg.check_interval_ms
        if due > now_ms:
            next_due = due if next_due is None else min(next_due, due)
        elif h.checks >= cfg.check_max:
            discards.append((h.position, h.checks))
        else:
            checks.append((h.position, h.checks))
    return checks, discards, next_due


def _chunks(items: list[tuple[int, int]]) -> list[list[tuple[int, int]]]:
    return [items[i : i + MAX_RECORD_ITEMS] for i in range(0, len(items), MAX_RECORD_ITEMS)]


def to_half(msg: Message, queue_id: int) -> Message:
    """The stored half of ``msg``: in :data:`HALF_TOPIC` queue 0, its real topic and queue in
    properties (as RocketMQ stores it)."""
    props = dict(msg.properties)
    props[PROPERTY_REAL_TOPIC] = msg.topic
    props[PROPERTY_REAL_QID] = str(queue_id)
    props[PROPERTY_TRANSACTION_PREPARED] = "true"
    return replace(msg, topic=HALF_TOPIC, queue_id=0, properties=props)


def visible_copy(half: Message, topic: str, queue_id: int, now_ms: int) -> Message:
    """The message a commit stores for consumers: the half's, in its real topic and queue,
    without the broker's properties, stored now."""
    props = dict(half.properties)
    for key in (PROPERTY_REAL_TOPIC, PROPERTY_REAL_QID, PROPERTY_TRANSACTION_PREPARED):
        props.pop(key, None)
    return replace(
        half, topic=topic, queue_id=queue_id, properties=props, store_timestamp_ms=now_ms
    )


class Transactions:
    """Half messages, verdicts and the check-back on the leader of one node's group."""

    def __init__(self, applied: AppliedMessages) -> None:
        """The send path stores half messages through :meth:`prepare` (``SendPath``'s
        ``halves``, given by the composition root)."""
        self.ctx = applied.ctx
        self.applied = applied
        c = self.ctx.cfg
        self.cfg = TxnSettings(c.txn_timeout_ms, c.txn_check_interval_ms, c.txn_check_max)
        self.task: asyncio.Task[None] | None = None
        self._ids = UniqIdGenerator()
        # The term this node last led and the log index it had then: its own first entry of
        # that term (the no-op every new leader appends) is at or before it.
        self._term = -1
        self._term_first = 0
        self.ctx.sm.add_change_listener(self.maybe_start)

    # ------------------------------------------------------------------ half messages

    async def prepare(
        self, topic: TopicConfig, messages: Sequence[OutgoingMessage]
    ) -> list[SendResult]:
        """Store one half message (SendPath checked the node, the topic and the queue): its
        result, the position being the transaction id."""
        if len(messages) != 1:
            raise InvalidRequestError("a transactional send holds exactly one message")
        m = messages[0]
        if PROPERTY_DELAY in m.properties:
            raise InvalidRequestError("a transactional message cannot be delayed")
        if len(self.ctx.sm.txn.pending) >= MAX_PENDING_HALVES:
            raise TooManyHalvesError(f"{MAX_PENDING_HALVES} half messages wait; retry later")
        now_ms = int(time.time() * 1000)
        msg = message_from_fields(topic.name, m, now_ms, m.msg_id or self._ids.next_id())
        batch, _ = encode_batch([to_half(msg, m.queue_id)], self.ctx.cfg.max_message_size_bytes)
        body = encode_prepare(topic.name, m.queue_id, batch)
        if len(body) > self.ctx.node.max_body_bytes:
            raise InvalidRequestError(f"half message of {len(body)} bytes: larger than an entry")
        first, _, _ = await self.ctx.node.propose([body], ENTRY_TXN)
        results = self.ctx.sm.take_results(first)
        if not results:
            raise TooManyHalvesError("the half message was refused when applied; retry later")
        return [results[0]._replace(topic=topic.name, queue_id=m.queue_id)]

    # ------------------------------------------------------------------ verdicts

    async def end(self, topic: str, uniq_id: str, txn_id: str, commit: bool) -> str:
        """Commit or roll back the transaction ``txn_id`` of message ``uniq_id`` in ``topic``:
        the verdict now applied (COMMITTED or ROLLED_BACK). A verdict already applied is
        answered again without a new entry; InvalidTransactionIdError for an unknown
        transaction, another message's or topic's, or a contrary verdict."""
        require_leader(self.ctx.node)
        position = parse_transaction_id(txn_id)
        await self._caught_up()
        half = self.ctx.sm.txn.pending.get(position)
        if half is not None:
            if half.uniq_id != uniq_id or half.topic != topic:
                raise InvalidTransactionIdError(
                    f"transaction {txn_id} belongs to another message or topic"
                )
            body = self._commit_body(half) if commit else encode_rollback(position)
            await self.ctx.node.propose([body], ENTRY_TXN)
        return self._verdict(position, topic, uniq_id, txn_id, commit)

    async def _caught_up(self) -> None:
        """Wait until this leader applied its own first entry of the term: every half stored
        by an earlier leader is then in the table."""
        self._note_term()
        deadline = time.monotonic() + CATCH_UP_WAIT_MS / 1000
        while self.ctx.sm.last_applied < self._term_first:
            if time.monotonic() >= deadline:
                raise CatchingUpError("the new leader is still applying earlier entries")
            await asyncio.sleep(CATCH_UP_POLL_MS / 1000)

    def _note_term(self) -> None:
        node = self.ctx.node
        if node.role is Role.LEADER and node.term != self._term:
            self._term, self._term_first = node.term, node.last_index

    def _verdict(self, position: int, topic: str, uniq_id: str, txn_id: str, commit: bool) -> str:
        v = self.ctx.sm.txn.verdict(position)
        if v is None:
            raise InvalidTransactionIdError(
                f"no transaction {txn_id} on this broker (never sent here, or resolved long ago)"
            )
        if v.uniq_id != uniq_id or v.topic != topic:
            raise InvalidTransactionIdError(
                f"transaction {txn_id} belongs to another message or topic"
            )
        delivered = v.outcome == COMMITTED
        if delivered != commit:
            raise InvalidTransactionIdError(f"transaction {txn_id} is already {v.outcome}")
        return COMMITTED if delivered else ROLLED_BACK

    def _commit_body(self, half: Half) -> bytes:
        topic = self.ctx.sm.topics.get(half.topic)
        if topic is None:
            raise TopicNotFoundError(f"topic {half.topic!r} of the transaction is gone")
        stored = self.applied.message(half.position, half.size)
        now_ms = int(time.time() * 1000)
        copy = visible_copy(stored, half.topic, half.queue_id % topic.write_queue_nums, now_ms)
        batch, _ = encode_batch([copy], self.ctx.cfg.max_message_size_bytes)
        return encode_commit(half.position, batch)

    # ------------------------------------------------------------------ check-back

    def maybe_start(self) -> None:
        """A change listener: a node that became leader notes where its term starts and starts
        checking halves back."""
        self._note_term()
        self.task = start_leader_task(self.ctx, self.task, self._loop, "transaction-checker")

    async def _loop(self) -> None:
        # Each record stands alone: after a failed pass the next leader finds what was applied.
        idle_s = CHECK_IDLE_MS / 1000
        await run_while_leading(self.ctx, "transaction-checker", self._pass, idle_s)

    async def _pass(self) -> float:
        """One :meth:`check_pass`; seconds until the next half is due (bounded)."""
        next_due = await self.check_pass(int(time.time() * 1000))
        wait_ms = CHECK_IDLE_MS if next_due is None else next_due - time.time() * 1000
        return min(max(wait_ms, CHECK_MIN_WAIT_MS), CHECK_IDLE_MS) / 1000

    async def _scan(
        self, now_ms: int
    ) -> tuple[list[tuple[int, int]], list[tuple[int, int]], int | None]:
        """:func:`due_halves` of the pending halves, a chunk at a time (what is applied
        meanwhile makes some items stale: their records change nothing)."""
        halves = list(self.ctx.sm.txn.pending.values())
        checks: list[tuple[int, int]] = []
        discards: list[tuple[int, int]] = []
        next_due: int | None = None
        for at in range(0, len(halves), CHECK_SCAN_CHUNK):
            if at:
                await asyncio.sleep(0)
            c, d, due = due_halves(halves[at : at + CHECK_SCAN_CHUNK], now_ms, self.cfg)
            checks += c
            discards += d
            if due is not None and (next_due is None or due < next_due):
                next_due = due
        return checks, discards, next_due

    async def check_pass(self, now_ms: int) -> int | None:
        """Propose the due discards and checks; the next due time (now when some were left
        for the next pass)."""
        checks, discards, next_due = await self._scan(now_ms)
        records = [(OP_DISCARD, part) for part in _chunks(discards)]
        records += [(OP_CHECK, part) for part in _chunks(checks)]
        for op, items in records[:CHECK_RECORDS_PER_PASS]:
            await self.ctx.node.propose([encode_checks(op, now_ms, items)], ENTRY_TXN)
        if len(records) > CHECK_RECORDS_PER_PASS:
            return now_ms
        return next_due
