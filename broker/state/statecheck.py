"""Replicated broker state checked against the commitlog (docs/BROKER.md, "Derived state").

POP, delay-level, timer-level and transaction state are not files derived from the log but
tables built by applying it, kept in memory and in ``config/snapshot.json``. A snapshot changed
on disk (or a table changed in memory) would make this node, once it leads, redeliver the wrong
message, deliver delayed messages that do not exist yet, or commit a transaction into the wrong
topic. Each row can be checked against the log cheaply:

* a POP in-flight record ``(queue offset, position)`` is the ConsumeQueue record at that
  offset (one record read: the ConsumeQueue itself is checked against the log first), and a
  POP queue's position is at most its queue's max offset;
* a delay level's delivered offset and a timer level's moved offset are at most their
  queue's max offset (apply refuses a record that reaches further);
* a pending transaction's half ``(position, size, uniq id)`` is a message of
  ``RMQ_SYS_TRANS_HALF_TOPIC`` queue 0 of that size and id, right behind the prepare record
  head naming the half's topic and queue (one read of both heads).

A row can be wrong in ways that no other row tells how to correct (which field changed?), so
there is no in-place repair: at open the whole broker state is rebuilt by replaying the log
from its first entry (exact when that is entry 1); when retention deleted a prefix, a replay
would lose what the deleted entries made (topics, offsets, users), so the node takes a snapshot
from its leader instead (see :func:`refuse_inexact_rebuild`). At run time a mismatch
marks the node for that rebuild at its next start (``config/rebuild-derived``).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from broker.state import derived
from broker.state.derived import STORE_LEVEL, STORE_POP, STORE_TXN
from broker.state.errors import BrokerError, QueueStoreClosedError
from broker.state.names import SCHEDULE_TOPIC, TIMER_TOPIC
from broker.state.popstate import PopKey
from broker.state.transactions import HALF_TOPIC, Half, encode_prepare
from dledger.log import DLedgerError
from dledger.rewind import NeedsSnapshotError
from msgcodec import (
    BATCH_HEADER,
    BATCH_HEADER_SIZE,
    BATCH_MAGIC,
    BATCH_VERSION,
    MESSAGE_MAGIC,
    MESSAGE_VERSION,
)

if TYPE_CHECKING:
    from broker.state.machine import BrokerStateMachine

logger = logging.getLogger(__name__)

# The open-time check covers every row: the tables' own bounds (200,000 in-flight records,
# 100,000 POP queue positions, 100,000 pending halves, 255 delay and 32 timer levels: about
# 400,000 rows) keep it to about 2 s of CPU (4 µs a POP row, 6.3 µs a half, measured with
# bench/statecheckcost.py: docs/BROKER.md, "Derived state"). This bound is above them all; it
# is there so that no table grown past its limit can hold the start longer.
OPEN_CHECK_MAX_ROWS = 500_000
# What a run-time mismatch writes into config/rebuild-derived: the next start knows the
# replicated state (not only derived files) is at stake (see refuse_inexact_rebuild).
MARKER_PREFIX = "replicated state: "

# A row to check, named so that it can be looked up again when a slice of the scrubber
# reaches it (the tables change between slices: a row gone meanwhile is skipped):
# ("pop", key, offset) an in-flight record, offset -1 the queue's position; (SCHEDULE_TOPIC or
# TIMER_TOPIC, None, level) a delay or timer level; ("transaction", None, position) a half.
Row = tuple[str, object, int]


def rows_of(sm: BrokerStateMachine) -> list[Row]:
    """Every row of the replicated tables as they stand (levels first: a handful)."""
    rows: list[Row] = [(SCHEDULE_TOPIC, None, level) for level in sorted(sm.schedule_offsets)]
    rows += [(TIMER_TOPIC, None, level) for level in sorted(sm.timer_offsets)]
    for key, q in list(sm.pop.queues.items()):
        rows.append((STORE_POP, key, -1))
        rows += [(STORE_POP, key, offset) for offset in list(q.inflight)]
    rows += [(STORE_TXN, None, position) for position in list(sm.txn.pending)]
    return rows


def _store_of(row: Row) -> str:
    return STORE_LEVEL if row[0] in (SCHEDULE_TOPIC, TIMER_TOPIC) else row[0]


def row_problem(sm: BrokerStateMachine, row: Row) -> str | None:
    """Why ``row`` disagrees with the log; "" when it agrees, None when it is gone (changed
    by an apply since it was listed) or cannot be checked (its entries deleted by retention)."""
    kind, key, n = row
    if kind == STORE_POP:
        assert isinstance(key, tuple)
        return _pop_problem(sm, key, n)
    if kind == STORE_TXN:
        half = sm.txn.pending.get(n)
        return None if half is None else half_problem(sm, half)
    offsets = sm.schedule_offsets if kind == SCHEDULE_TOPIC else sm.timer_offsets
    offset = offsets.get(n)
    if offset is None:
        return None
    queue_id = n - 1 if kind == SCHEDULE_TOPIC else n
    cq = sm.cqs.find(kind, queue_id)
    held = 0 if cq is None else cq.max_offset
    if offset > held:
        return f"level {n} is at offset {offset}, its queue {kind}/{queue_id} holds {held}"
    return ""


def _pop_problem(sm: BrokerStateMachine, key: PopKey, offset: int) -> str | None:
    group, topic, queue_id = key
    q = sm.pop.get(key)
    if q is None:
        return None
    cq = sm.cqs.find(topic, queue_id)
    held = 0 if cq is None else cq.max_offset
    if offset < 0:
        if q.offset > held:
            return f"{group}@{topic}/{queue_id} pops from offset {q.offset}, the queue holds {held}"
        return ""
    rec = q.inflight.get(offset)
    if rec is None:
        return None
    if cq is None or offset >= held:
        return f"{group}@{topic}/{queue_id} offset {offset} in flight, the queue holds {held}"
    if offset < cq.min_offset or rec.position < derived.first_body_position(sm):
        return None  # its record or message was deleted by retention: nothing to compare
    position = cq.get(offset)[0]
    if position != rec.position:
        return (
            f"{group}@{topic}/{queue_id} offset {offset} in flight at position {rec.position},"
            f" its queue record is at {position}"
        )
    return ""


def half_problem(sm: BrokerStateMachine, half: Half) -> str | None:
    """Why a pending half is not the message its prepare record stored; None when the log
    below it was deleted by retention."""
    head = encode_prepare(half.topic, half.queue_id, b"")
    # The prepare record's head, then its batch's header (a batch of one), then the half.
    before = len(head) + BATCH_HEADER_SIZE
    start = half.position - before
    if start < derived.first_body_position(sm):
        return None
    if half.size <= 0 or half.position + half.size > sm.dispatch_end:
        return f"half ({half.position}, {half.size}) outside the applied log [0, {sm.dispatch_end})"
    raw = sm.log.read_at(start, before + min(half.size, derived.HEAD_READ_BYTES))
    if not _prepared_here(raw[:before], head):
        return f"no prepare record of {half.topic}/{half.queue_id} right before {half.position}"
    return _half_message_problem(raw[before:], half)


def _prepared_here(raw: bytes, head: bytes) -> bool:
    """Whether ``raw`` ends with a prepare record's ``head`` and the header of a batch of one
    message, or with ``head`` alone (a batch may be one message without a header)."""
    magic, version, _r8, _r16, count = BATCH_HEADER.unpack_from(raw, len(head))
    batch = (magic, version, count) == (BATCH_MAGIC, BATCH_VERSION, 1)
    return (batch and raw[: len(head)] == head) or raw.endswith(head)


def _half_message_problem(raw: bytes, half: Half) -> str:
    if len(raw) < derived._HEAD.size:
        return f"size {half.size} is below a message's head"
    total, magic, version, qid, _ts, _tag, uniq, topic_len = derived._HEAD.unpack_from(raw)
    if magic != MESSAGE_MAGIC or version != MESSAGE_VERSION:
        return f"no message starts at {half.position}"
    if total != half.size:
        return f"message at {half.position} is {total} bytes, the half says {half.size}"
    name = raw[derived._HEAD.size : derived._HEAD.size + topic_len]
    if qid != 0 or name != HALF_TOPIC.encode():
        return f"message at {half.position} is of {name[:127]!r}/{qid}, not {HALF_TOPIC}/0"
    if uniq.hex().upper() != half.uniq_id:
        return f"message at {half.position} is {uniq.hex().upper()}, the half says {half.uniq_id}"
    return ""


def check_rows(sm: BrokerStateMachine, rows: Iterable[Row], where: str) -> list[str]:
    """Check ``rows``, counting them in ``sm.derived`` and logging one WARNING line per wrong
    one; the problems found. A commitlog read that fails is the log's damage: raised."""
    counters = sm.derived
    found = []
    for row in rows:
        why = row_problem(sm, row)
        if why is None:
            continue
        store = _store_of(row)
        counters.checked[store] += 1
        if not why:
            continue
        counters.wrong(store, where)
        found.append(why)
        logger.warning(
            "derived state: %s record wrong where=%s problem=%r: the broker state is rebuilt"
            " from the commitlog%s",
            store,
            where,
            why,
            " now" if where == "open" else " at the next start",
        )
    return found


def check_at_open(sm: BrokerStateMachine) -> str:
    """The open-time check of every row (up to :data:`OPEN_CHECK_MAX_ROWS`); a reason to
    rebuild the whole state from the log, or "" when every row agrees (the rebuild itself
    asks for a snapshot when it could not be exact: :func:`refuse_inexact_rebuild`)."""
    rows = rows_of(sm)
    try:
        problems = check_rows(sm, rows[:OPEN_CHECK_MAX_ROWS], "open")
    except DLedgerError as exc:
        # The commitlog's own damage: the log's checks and repair deal with it.
        logger.error("replicated state: open-time check stopped, commitlog unreadable: %s", exc)
        return ""
    logger.info(
        "replicated state checked at open rows=%d of %d wrong=%d",
        min(len(rows), OPEN_CHECK_MAX_ROWS),
        len(rows),
        len(problems),
    )
    if not problems:
        return ""
    return f"{MARKER_PREFIX}{len(problems)} rows disagree with the log, e.g. {problems[0]}"


def refuse_inexact_rebuild(sm: BrokerStateMachine, why: str) -> None:
    """Raise :class:`NeedsSnapshotError` when the broker state must be rebuilt from the log
    (for ``why``) and the log no longer starts at entry 1: a rebuild starts from empty
    tables, so a replay would drop every topic, offset, user and POP or transaction row the
    deleted entries made, and serve that as the truth (whether the cause was the replicated
    state or derived files only). The node then drops its log and restarts, its promise kept,
    and a leader installs a snapshot (dledger.server.rewinds); a member alone in its group
    cannot, and refuses to start."""
    first = sm.log.first_index()
    if first <= 1:
        return
    logger.error("replicated state cannot be rebuilt: the log starts at index %d: %s", first, why)
    raise NeedsSnapshotError(
        f"the broker state disagrees with the commitlog ({why[:300]}) and cannot be rebuilt"
        f" from it: retention deleted the entries before index {first}"
    )


def check_slice(sm: BrokerStateMachine, rows: Sequence[Row]) -> None:
    """One scrubber slice of rows: a wrong one marks the node for the rebuild at its next
    start (the state in memory is not changed: there is nothing to change it to)."""
    try:
        problems = check_rows(sm, rows, "scrub")
    except QueueStoreClosedError:
        raise  # a snapshot install closed the stores: the scrubber's pass stops
    except BrokerError as exc:
        logger.warning("replicated-state scrub slice stopped: %s", exc)
        return
    if problems:
        sm.request_rebuild(f"{MARKER_PREFIX}{problems[0]}")
