"""Derived state checked against the commitlog, and repaired from it (docs/BROKER.md,
"Derived state").

The ConsumeQueues and the key index are derived from committed entries: the commitlog is the
source of truth. A record is *right* when it points at a committed message of its topic and
queue, with that size and tag (or store time, for the schedule and timer topics), at or after
the end of the record before it. A timer hop record instead points at a hop inside a timer
entry whose target is its queue.

A wrong ConsumeQueue record is rebuilt from the entries between its right neighbours: the
records of a queue are the queue's dispatched messages in commit order, so the slots between
two right records hold exactly the queue's dispatched messages between them. The entries
there are scanned as apply scanned them (messages, delivered schedule copies, timer hops and
copies, transaction halves and copies), leaving out what apply left out that can be decided
from the entry alone or the dedup window (an out-of-range store time, a duplicate of an id the
window still holds). When the count of what is left equals the number of slots, those are the
records. Otherwise the run is widened (a neighbour taken for right may be the wrong one), up to
:data:`MAX_WIDEN` times; past that the repair is *ambiguous*: at open the whole state is
rebuilt from the log (exact), at run time the queue is marked and the next start rebuilds it.

Nothing here writes the commitlog. A commitlog entry that fails its own CRC while a repair
reads it is the log's damage, not derived state's: the error is raised as it is.
"""

from __future__ import annotations

import logging
import struct
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypeVar

from broker.state.consumequeue import ConsumeQueue
from broker.state.delayrules import SCHEDULE_HEADER
from broker.state.errors import (
    BrokerError,
    CorruptMessageError,
    DerivedStateError,
    MessageNotFoundError,
    PositionOrderError,
)
from broker.state.indexfile import build_key, key_hash
from broker.state.names import SCHEDULE_TOPIC, TIMER_TOPIC, is_valid_topic_name
from broker.state.timerrules import HOP_RECORD_SIZE, TIMER_HEADER, decode_hop, decode_timer_header
from broker.state.transactions import OP_COMMIT, OP_PREPARE, decode_txn_record
from dledger.log import DLedgerError
from mqerrors import codes as E
from msgcodec import (
    MESSAGE_CRC_END,
    MESSAGE_FIXED_SIZE,
    MESSAGE_MAGIC,
    MESSAGE_VERSION,
    MIN_MESSAGE_SIZE,
    crc32c,
    dispatch_head_size,
    read_dispatch_head,
    scan_dispatch,
)

if TYPE_CHECKING:
    from broker.state.machine import BrokerStateMachine

logger = logging.getLogger(__name__)

# A message's head as a check reads it: total size, magic, (crc), version, (reserved), queue
# id, (flag, sys flag, reconsume times, born time), store time, tag hash, uniq id, topic length.
_HEAD = struct.Struct(">II4xH2xi12x8xqq16sB")
assert _HEAD.size == MESSAGE_FIXED_SIZE + 1
# A head read covers the fixed part and the longest topic (127 characters).
HEAD_READ_BYTES = _HEAD.size + 127
# An index record's check reads a message's first bytes, through its keys: this many cover
# the fixed part, the topic and usual tags and keys (longer ones take a second read of just
# what they need); never the body, which a whole read copied for every record scrubbed.
INDEX_CHECK_READ_BYTES = 1024
# A repair scans at most this many bytes of entries between a bad run's neighbours (a run at
# the very start of a queue has no left neighbour: its scan starts at the log's first entry).
# Beyond it the repair is ambiguous (the open-time fallback replays the whole log anyway).
MAX_REPAIR_SCAN_BYTES = 64 << 20
# How many times a run whose candidates do not fit is widened by one record on each side
# before it counts as ambiguous: one widening covers a record changed to point at another
# right message of its own queue (its neighbour is then the one out of order).
MAX_WIDEN = 4
# Store times apply refuses (broker.state.machine.MAX_STORE_TIMESTAMP_MS): such a batch was skipped.
_MAX_STORE_TS_MS = 221_845_392_000_000
# The scrubber's default rate (broker.conf scrubRecordsPerSecond): records of the ConsumeQueues
# and the key index checked a second. Its cost is measured in docs/BROKER.md, "Derived state".
DEFAULT_SCRUB_RECORDS_PER_SECOND = 2000
# The open-time check runs before the node serves, so its work is bounded by a CPU budget
# whatever the backlog: the newest OPEN_CHECK_MAX_RECORDS ConsumeQueue records (a message head
# read and compared each: CQ_RECORD_CHECK_US of CPU, measured with bench/scrubcost.py on a
# quiet machine) and OPEN_CHECK_MAX_INDEX_RECORDS key index records (a whole message each:
# INDEX_RECORD_CHECK_US), together within OPEN_CHECK_BUDGET_MS. The older records are the
# scrubber's, which starts with the node, and every read checks what it serves. (Issue 36: at
# 2,000,000 + 500,000 records the check cost ~8 s of CPU quiet and 40 s on a loaded machine
# with 1,000,000 messages of 128 B stored, most of a restart; a node holding 30,000,000 must
# serve within 10 s of its start.)
OPEN_CHECK_BUDGET_MS = 1000
CQ_RECORD_CHECK_US = 2.1
INDEX_RECORD_CHECK_US = 7.5
OPEN_CHECK_MAX_RECORDS = 250_000  # ~0.53 s
OPEN_CHECK_MAX_INDEX_RECORDS = 60_000  # ~0.45 s
assert (
    OPEN_CHECK_MAX_RECORDS * CQ_RECORD_CHECK_US
    + OPEN_CHECK_MAX_INDEX_RECORDS * INDEX_RECORD_CHECK_US
    <= OPEN_CHECK_BUDGET_MS * 1000
)
# A marker under config/: a run-time check found damage it could not rebuild in place; the
# next start rebuilds every derived store from the log.
REBUILD_MARKER = "rebuild-derived"
MAX_MARKER_BYTES = 1000  # the reason it holds, cut short
# ENTRY types whose batches are dispatched (broker.state.machine, broker.state.popstate, ...): kept
# here as numbers so that this module needs nothing of broker.state.machine at import.
_ENTRY_MESSAGES = 16
_ENTRY_SCHEDULE = 19
_ENTRY_TIMER = 23
_ENTRY_TXN = 24
_MAX_QUEUE_NUMS = 1024  # broker.state.machine.MAX_QUEUE_NUMS

CqRow = tuple[int, int, int]
_T = TypeVar("_T")


class AmbiguousRepairError(BrokerError):
    """The records of a damaged run cannot be told from the entries around it alone."""

    code = E.AMBIGUOUS_REPAIR


STORE_CQ = "consumequeue"
STORE_INDEX = "index"
# Replicated tables checked against the log (broker.state.statecheck): POP in-flight records and
# positions, delay and timer levels, pending transaction halves.
STORE_POP = "pop"
STORE_LEVEL = "level"
STORE_TXN = "transaction"
STORES = (STORE_CQ, STORE_INDEX, STORE_POP, STORE_LEVEL, STORE_TXN)


@dataclass
class DerivedCounters:
    """What the checks found since the process started (``raftmq_scrub_*``). ``where`` is
    ``open`` (the open-time check), ``read`` (a pull or POP receive) or ``scrub`` (the
    background scrubber)."""

    checked: dict[str, int] = field(default_factory=lambda: dict.fromkeys(STORES, 0))
    mismatches: dict[tuple[str, str], int] = field(default_factory=dict)
    rebuilt: int = 0  # ConsumeQueue records rewritten from the commitlog
    read_repairs: int = 0  # reads that met a wrong record and were answered after a rebuild
    unrepaired: int = 0  # damage left to the next start's rebuild (config/rebuild-derived)
    passes: int = 0
    last_pass_s: float = 0.0
    last_pass_end_unix_s: float = 0.0

    def wrong(self, store: str, where: str, n: int = 1) -> None:
        key = (store, where)
        self.mismatches[key] = self.mismatches.get(key, 0) + n

    def total_wrong(self, store: str) -> int:
        return sum(n for (s, _w), n in self.mismatches.items() if s == store)


def row_problem(sm: BrokerStateMachine, topic: str, queue_id: int, row: CqRow) -> str:
    """Why ``row`` of queue ``(topic, queue_id)`` is not right, or "" when it is (the head
    of its message is read, not its body's CRC: that is the commitlog's to check)."""
    position, size, _tag = row
    if size <= 0 or position < 0 or position + size > sm.dispatch_end:
        return f"record ({position}, {size}) outside the applied log [0, {sm.dispatch_end})"
    if topic == TIMER_TOPIC and size == HOP_RECORD_SIZE:
        try:
            target = decode_hop(sm.log.read_at(position, size))[0]
        except (ValueError, DLedgerError) as exc:
            return f"no hop record at {position}: {exc}"
        return "" if target == queue_id else f"hop at {position} targets level {target}"
    try:
        raw = sm.log.read_at(position, min(size, HEAD_READ_BYTES))
    except DLedgerError as exc:
        return f"position {position} not stored: {exc}"
    return raw_problem(raw, topic, queue_id, row)


def bad_runs(
    sm: BrokerStateMachine,
    topic: str,
    queue_id: int,
    start: int,
    rows: Sequence[CqRow],
    previous_end: int,
) -> tuple[list[tuple[int, int, str]], int]:
    """The runs ``(first, end, why)`` of wrong records among ``rows`` (queue offsets from
    ``start``), and the end of the last right one (``previous_end`` when none). A record is
    wrong when its message does not match or it lies before the end of the right one before."""
    runs: list[tuple[int, int, str]] = []
    end = previous_end
    first_position = first_body_position(sm)
    for i, row in enumerate(rows):
        if row[0] < first_position:
            continue  # its entry was deleted by retention: nothing to check against
        why = row_problem(sm, topic, queue_id, row)
        if not why and row[0] < end:
            why = f"record at {row[0]} overlaps the one before (ending at {end})"
        if not why:
            end = row[0] + row[1]
            continue
        offset = start + i
        if runs and runs[-1][1] == offset:
            runs[-1] = (runs[-1][0], offset + 1, runs[-1][2])
        else:
            runs.append((offset, offset + 1, why))
    return runs, end


def first_body_position(sm: BrokerStateMachine) -> int:
    """Where the log's first entry still held starts (0 for an empty log): retention deleted
    what lies below, so records pointing there are not checked."""
    log = sm.log
    first = log.first_index()
    return log.body_position(first) if first <= log.last_index() else 0


def _entry_at(sm: BrokerStateMachine, position: int) -> int:
    """The applied entry whose body holds ``position`` (or the first one when it is below)."""
    log = sm.log
    low, high = log.first_index(), sm.last_applied
    while low < high:
        mid = (low + high + 1) // 2
        if log.body_position(mid) <= position:
            low = mid
        else:
            high = mid - 1
    return low


def _batch_rows(
    sm: BrokerStateMachine, body: memoryview, at: int, base: int, dedup: bool
) -> list[tuple[str, int, CqRow]]:
    """The ConsumeQueue rows a batch at ``body[at:]`` dispatched, as apply made them."""
    out = []
    for offset_in, size, topic, queue_id, t_hash, _keys, uniq, store_ts in scan_dispatch(body[at:]):
        if not 0 <= store_ts <= _MAX_STORE_TS_MS or not _queue_ok(topic, queue_id):
            return []  # apply skipped the whole batch
        position = base + at + offset_in
        if dedup:
            known = sm.dedup.get(uniq)
            if known is not None and known.position != position:
                continue  # a duplicate the window answered: never dispatched
        tag = store_ts if topic in (SCHEDULE_TOPIC, TIMER_TOPIC) else t_hash
        out.append((topic, queue_id, (position, size, tag)))
    return out


def _queue_ok(topic: str, queue_id: int) -> bool:
    """broker.state.machine._check_queue's rule (a batch breaking it was skipped whole)."""
    return is_valid_topic_name(topic) and 0 <= queue_id < _MAX_QUEUE_NUMS


def entry_rows(sm: BrokerStateMachine, index: int) -> list[tuple[str, int, CqRow]]:
    """The ConsumeQueue rows applying entry ``index`` made (as far as the entry tells)."""
    entry = sm.log.read(index)
    base = sm.log.body_position(index)
    body = memoryview(entry.body)
    try:
        if entry.type == _ENTRY_MESSAGES:
            return _batch_rows(sm, body, 0, base, True)
        if entry.type == _ENTRY_SCHEDULE and len(body) > SCHEDULE_HEADER.size:
            return _batch_rows(sm, body, SCHEDULE_HEADER.size, base, False)
        if entry.type == _ENTRY_TIMER:
            return _timer_rows(sm, body, base)
        if entry.type == _ENTRY_TXN:
            record = decode_txn_record(entry.body)
            if record.batch_at and record.op in (OP_PREPARE, OP_COMMIT):
                return _batch_rows(sm, body, record.batch_at, base, record.op == OP_PREPARE)
    except (BrokerError, ValueError, struct.error):
        return []  # a record apply skipped
    return []


def _timer_rows(
    sm: BrokerStateMachine, body: memoryview, base: int
) -> list[tuple[str, int, CqRow]]:
    _level, _from, _to, now_ms, hops = decode_timer_header(body)
    copies_at = TIMER_HEADER.size + hops * HOP_RECORD_SIZE
    out = [
        (TIMER_TOPIC, decode_hop(body, at)[0], (base + at, HOP_RECORD_SIZE, now_ms))
        for at in range(TIMER_HEADER.size, copies_at, HOP_RECORD_SIZE)
    ]
    if len(body) > copies_at:
        out += _batch_rows(sm, body, copies_at, base, False)
    return out


def expected_rows(
    sm: BrokerStateMachine, topic: str, queue_id: int, low: int, high: int
) -> list[CqRow]:
    """The rows of ``(topic, queue_id)`` the applied entries hold in ``[low, high)``."""
    log = sm.log
    index = _entry_at(sm, low)
    scanned = 0
    out: list[CqRow] = []
    while index <= sm.last_applied and log.body_position(index) < high:
        for t, q, row in entry_rows(sm, index):
            if t == topic and q == queue_id and low <= row[0] < high:
                out.append(row)
        scanned += _entry_span(sm, index)
        if scanned > MAX_REPAIR_SCAN_BYTES:
            raise AmbiguousRepairError(
                f"more than {MAX_REPAIR_SCAN_BYTES} bytes of entries around the damage"
            )
        index += 1
    out.sort()
    return out


def _entry_span(sm: BrokerStateMachine, index: int) -> int:
    if index < sm.last_applied:
        return sm.log.body_position(index + 1) - sm.log.body_position(index)
    return max(sm.dispatch_end - sm.log.body_position(index), 0)


def repair_run(
    sm: BrokerStateMachine, cq: ConsumeQueue, topic: str, queue_id: int, first: int, end: int
) -> tuple[int, int]:
    """Rebuild the records ``[first, end)`` of ``cq`` from the commitlog; the run actually
    rewritten (it may have been widened). :class:`AmbiguousRepairError` when it cannot."""
    first_position = first_body_position(sm)
    for _ in range(MAX_WIDEN + 1):
        low = cq.get(first - 1)[0] + cq.get(first - 1)[1] if first > cq.min_offset else 0
        high = cq.get(end)[0] if end < cq.max_offset else sm.dispatch_end
        rows = expected_rows(sm, topic, queue_id, max(low, first_position), high)
        if len(rows) == end - first:
            try:
                cq.rewrite(first, rows)
                return first, end
            except PositionOrderError:
                pass  # a neighbour taken for right overlaps them: it is wrong too
        wider = max(first - 1, cq.min_offset), min(end + 1, cq.max_offset)
        if wider == (first, end):
            break
        first, end = wider
    raise AmbiguousRepairError(
        f"queue {topic}/{queue_id} [{first}, {end}): the entries around it hold"
        f" {len(rows)} records for {end - first} slots"
    )


def rebuild_tail(
    sm: BrokerStateMachine, cq: ConsumeQueue, topic: str, queue_id: int, want: int
) -> str:
    """Give ``cq`` its records up to ``want`` (the snapshot's max offset) again from the
    commitlog, after open cut them; "" when done, else why it cannot (then the whole state
    is rebuilt). The last records kept may be the wrong ones (a record changed to a later
    message of its queue kept the cut out of order): up to :data:`MAX_WIDEN` of them are
    given up when the count does not fit."""
    keep = cq.max_offset
    rows: list[CqRow] = []
    for _ in range(MAX_WIDEN + 1):
        low = cq.get(keep - 1)[0] + cq.get(keep - 1)[1] if keep > cq.min_offset else 0
        low = max(low, first_body_position(sm))
        try:
            rows = expected_rows(sm, topic, queue_id, low, sm.dispatch_end)
        except AmbiguousRepairError as exc:
            return f"queue {topic}/{queue_id} lost records {keep}..{want}: {exc}"
        if len(rows) == want - keep:
            dropped = cq.max_offset - keep
            cq.truncate_after_position(low)
            cq.append_many(rows)
            sm.derived.wrong(STORE_CQ, "open", len(rows))
            sm.derived.rebuilt += len(rows)
            logger.warning(
                "derived state: consumequeue tail lost where=open queue=%s/%d file=%s"
                " offset=%d records=%d (%d of them given up as out of order) rebuilt=[%d, %d)"
                " from the commitlog",
                topic,
                queue_id,
                cq.file_of(keep),
                keep,
                want - keep,
                dropped,
                keep,
                want,
            )
            return ""
        if keep <= cq.min_offset:
            break
        keep -= 1
    return (
        f"queue {topic}/{queue_id} holds {cq.max_offset} records, snapshot says {want}, and"
        f" the commitlog holds {len(rows)} for the {want - keep} missing"
    )


def check_queue(
    sm: BrokerStateMachine,
    cq: ConsumeQueue,
    topic: str,
    queue_id: int,
    start: int,
    count: int,
    where: str,
) -> int:
    """Check records ``[start, start + count)`` of a queue and rebuild the wrong ones; the
    number checked. :class:`AmbiguousRepairError` when a run cannot be rebuilt in place."""
    counters = sm.derived
    first_position = first_body_position(sm)
    low = max(start, cq.min_offset)
    records = cq.read(low, max(0, start + count - low))
    previous = cq.get(low - 1) if low > cq.min_offset else None
    previous_end = previous[0] + previous[1] if previous else first_position
    runs, _ = bad_runs(sm, topic, queue_id, low, list(records), previous_end)
    counters.checked[STORE_CQ] += len(records)
    for first, end, why in runs:
        counters.wrong(STORE_CQ, where, end - first)
        a, b = repair_run(sm, cq, topic, queue_id, first, end)
        counters.rebuilt += b - a
        logger.warning(
            "derived state: consumequeue record wrong where=%s queue=%s/%d file=%s offset=%d"
            " records=%d problem=%r rebuilt=[%d, %d) from the commitlog",
            where,
            topic,
            queue_id,
            cq.file_of(first),
            first,
            end - first,
            why,
            a,
            b,
        )
    return len(records)


def check_all_queues(sm: BrokerStateMachine) -> str:
    """The open-time check: the ConsumeQueue records (message heads only) and key index records
    against the commitlog, all of them up to :data:`OPEN_CHECK_MAX_RECORDS` and
    :data:`OPEN_CHECK_MAX_INDEX_RECORDS`, else the newest that many (each queue its share);
    the scrubber covers the rest. Wrong ConsumeQueue runs are rebuilt in place. A reason to
    rebuild everything from the log, or "" when what was checked is right now."""
    started = time.monotonic()
    queues = [(t, q, cq) for t, q in sm.cqs.queue_ids() if (cq := sm.cqs.find(t, q)) is not None]
    total = sum(cq.max_offset - cq.min_offset for _t, _q, cq in queues)
    checked = 0
    for topic, queue_id, cq in queues:
        held = cq.max_offset - cq.min_offset
        share = held if total <= OPEN_CHECK_MAX_RECORDS else held * OPEN_CHECK_MAX_RECORDS // total
        at = cq.max_offset - share
        while at < cq.max_offset:
            n = min(cq.max_offset - at, 65_536)
            try:
                checked += check_queue(sm, cq, topic, queue_id, at, n, "open")
            except AmbiguousRepairError as exc:
                return f"consumequeue {topic}/{queue_id} damaged: {exc}"
            at += n
    cursor = _newest_index_records(sm, OPEN_CHECK_MAX_INDEX_RECORDS)
    before = sm.derived.checked[STORE_INDEX]
    why = check_index(sm, "open", None, cursor)[1]
    logger.info(
        "derived state checked at open records=%d of %d index_records=%d ms=%.0f",
        checked,
        total,
        sm.derived.checked[STORE_INDEX] - before,
        (time.monotonic() - started) * 1000,
    )
    return f"key index damaged: {why}" if why else ""


def _newest_index_records(sm: BrokerStateMachine, records: int) -> tuple[int, int]:
    """The cursor of :func:`check_index` from which the newest ``records`` records follow."""
    files = sm.index.index_files()
    for file_no in range(len(files) - 1, -1, -1):
        held = files[file_no].count - 1
        if held >= records:
            return file_no, files[file_no].count - records
        records -= held
    return 0, 1


def index_problem(sm: BrokerStateMachine, hash_value: int, position: int) -> str:
    """Why an index record ``(hash, position)`` is wrong, or "" when the message there has a
    key (or uniq id) of that hash."""
    if not 0 <= position < sm.dispatch_end:
        return f"index record points at {position}, outside the applied log"
    try:
        head = sm.log.read_at(position, _HEAD.size)
        total = _HEAD.unpack_from(head)[0]
        if not _HEAD.size <= total <= sm.dispatch_end - position:
            return f"no message at {position}"
        # The fields up to the keys, not the body (the scrubber checks every record).
        raw = sm.log.read_at(position, min(total, INDEX_CHECK_READ_BYTES))
        need = dispatch_head_size(raw)
        if need is not None and len(raw) < need:
            raw = sm.log.read_at(position, min(total, need))
        info = read_dispatch_head(raw)
    except (DLedgerError, BrokerError, ValueError, struct.error) as exc:
        return f"no message at {position}: {exc}"
    for key in (*info.keys, info.uniq_id):
        if key_hash(build_key(info.topic, key)) == hash_value:
            return ""
    return f"the message at {position} has no key of hash {hash_value}"


def check_index(
    sm: BrokerStateMachine, where: str, max_records: int | None, cursor: tuple[int, int] = (0, 1)
) -> tuple[tuple[int, int], str]:
    """Check key index records from ``cursor`` (file number, record number) on, at most
    ``max_records`` (None: all); the next cursor ((0, 1) after the last file) and the first
    problem found ("" when none)."""
    files = sm.index.index_files()
    first_position = first_body_position(sm)
    file_no, record = cursor
    done = 0
    while file_no < len(files):
        f = files[file_no]
        while record < f.count:
            if max_records is not None and done >= max_records:
                return (file_no, record), ""
            hash_value, position, _diff, _prev = f.record(record)
            record += 1
            done += 1
            sm.derived.checked[STORE_INDEX] += 1
            if position < first_position:
                continue  # its entry was deleted by retention: nothing to check against
            why = index_problem(sm, hash_value, position)
            if why:
                sm.derived.wrong(STORE_INDEX, where)
                logger.warning(
                    "derived state: key index record wrong where=%s file=%s record=%d problem=%r",
                    where,
                    f.path.name,
                    record - 1,
                    why,
                )
                return (file_no, record), f"{f.path.name} record {record - 1}: {why}"
        file_no, record = file_no + 1, 1
    return (0, 1), ""


# ------------------------------------------------------------------------- check on read


class RecordMismatchError(BrokerError):
    """A record read for an answer does not match the commitlog (raised inside a read, caught
    by :func:`read_repaired`, never answered)."""

    code = E.RECORD_MISMATCH

    def __init__(self, offset: int, why: str) -> None:
        super().__init__(why)
        self.offset = offset
        self.why = why


def raw_problem(raw: bytes, topic: str, queue_id: int, row: CqRow) -> str:
    """:func:`row_problem`'s message checks on bytes already read (a pull's answer): "" when
    ``raw`` is the message of the record ``row`` of queue ``(topic, queue_id)``."""
    if len(raw) < _HEAD.size:
        return f"size {row[1]} is below a message's head"
    total, magic, version, qid, store_ts, t_hash, _uniq, topic_len = _HEAD.unpack_from(raw)
    if magic != MESSAGE_MAGIC or version != MESSAGE_VERSION:
        return f"no message starts at {row[0]}"
    if total != row[1]:
        return f"message at {row[0]} is {total} bytes, the record says {row[1]}"
    name = raw[_HEAD.size : _HEAD.size + topic_len]
    if qid != queue_id or name != topic.encode():
        return f"message at {row[0]} is of {name[:127]!r}/{qid}"
    want = store_ts if topic in (SCHEDULE_TOPIC, TIMER_TOPIC) else t_hash
    if want != row[2]:
        return f"message at {row[0]} has tag {want}, the record says {row[2]}"
    return ""


# Where a message's queue id, store time, tag hash and topic field lie (docs/FORMAT.md,
# "Broker: Message"): what a read compares against its record.
_QUEUE_ID_AT = 16
_STORE_TS_AT = 40
_TAGS_HASH_AT = 48
_TOPIC_AT = MESSAGE_FIXED_SIZE


# A message's total size, magic, CRC and queue id, then the 8 bytes a ConsumeQueue record's tag
# holds: the tag hash, or the store time in the schedule and timer topics.
_RUN_HEAD_TAGS = struct.Struct(f">III4xi{_TAGS_HASH_AT - _QUEUE_ID_AT - 4}xq")
_RUN_HEAD_STORE_TS = struct.Struct(f">III4xi{_STORE_TS_AT - _QUEUE_ID_AT - 4}xq")
assert _RUN_HEAD_TAGS.size == _TAGS_HASH_AT + 8 < MIN_MESSAGE_SIZE
assert _RUN_HEAD_STORE_TS.size == _STORE_TS_AT + 8 < MIN_MESSAGE_SIZE


class RowMatcher:
    """Compares the messages a read serves with their records, in a few slice compares per
    message (the read checked the head, size and CRC already): made once per read."""

    __slots__ = ("queue_b", "queue_id", "run_head", "tag_at", "topic", "topic_field")

    def __init__(self, topic: str, queue_id: int) -> None:
        self.topic = topic
        self.queue_id = queue_id
        self.queue_b = queue_id.to_bytes(4, "big", signed=True)
        name = topic.encode()
        self.topic_field = bytes((len(name),)) + name
        timed = topic in (SCHEDULE_TOPIC, TIMER_TOPIC)
        self.tag_at = _STORE_TS_AT if timed else _TAGS_HASH_AT
        self.run_head = _RUN_HEAD_STORE_TS if timed else _RUN_HEAD_TAGS

    def run_matches(
        self, run: bytes, sizes: Sequence[int], tags: Sequence[int], lo: int, hi: int
    ) -> bool:
        """Whether ``run``, messages read back to back in one read, holds exactly one sound
        message of this queue per record ``sizes[i]``, ``tags[i]`` (``lo <= i < hi``): every
        check a read of one message makes (:func:`msgcodec.check_message`'s head, size and CRC, then
        :meth:`matches`), none laxer. False says nothing about which message is wrong: the
        caller reads them one by one to find out and answer as before."""
        mv = memoryview(run)
        unpack = self.run_head.unpack_from
        queue_id, topic_field = self.queue_id, self.topic_field
        field_end = _TOPIC_AT + len(topic_field)
        at = 0
        for i in range(lo, hi):
            size = sizes[i]
            end = at + size
            if size < MIN_MESSAGE_SIZE or end > len(run) or field_end > size:
                return False
            total, magic, crc, qid, stored_tag = unpack(run, at)
            if (
                total != size
                or magic != MESSAGE_MAGIC
                or qid != queue_id
                or stored_tag != tags[i]
                or run[at + _TOPIC_AT : at + field_end] != topic_field
                or crc32c(mv[at + MESSAGE_CRC_END : end]) != crc
            ):
                return False
            at = end
        return at == len(run)

    def matches(self, raw: bytes, tag: int) -> bool:
        at = self.tag_at
        return (
            raw[_QUEUE_ID_AT : _QUEUE_ID_AT + 4] == self.queue_b
            and raw[_TOPIC_AT : _TOPIC_AT + len(self.topic_field)] == self.topic_field
            and raw[at : at + 8] == tag.to_bytes(8, "big", signed=True)
        )


def checked_raw(
    sm: BrokerStateMachine,
    read: Callable[[int, int], bytes],
    matcher: RowMatcher,
    offset: int,
    row: CqRow,
) -> bytes:
    """``read(position, size)`` of a record's message (head, size and CRC checked by
    ``read``), checked against the record: :class:`RecordMismatchError` when the record is
    wrong; the read's own error (DATA_LOSS) when the record is right and the commitlog's
    message is damaged."""
    try:
        raw = read(row[0], row[1])
    except (CorruptMessageError, MessageNotFoundError):
        why = row_problem(sm, matcher.topic, matcher.queue_id, row)
        if not why:
            raise  # the record is right: the commitlog's message is damaged
        raise RecordMismatchError(offset, why) from None
    if not matcher.matches(raw, row[2]):
        why = raw_problem(raw, matcher.topic, matcher.queue_id, row) or "record mismatch"
        raise RecordMismatchError(offset, why)
    return raw


def read_repaired(
    sm: BrokerStateMachine, topic: str, queue_id: int, count: int, read: Callable[[], _T]
) -> _T:
    """``read()`` (a pull or a POP scan of ``count`` records of the queue); when it meets a
    wrong record, the records from there are rebuilt from the commitlog and it reads again.
    :class:`DerivedStateError` when they cannot be rebuilt in place (the node rebuilds at its
    next start; the reader retries, on another member or later)."""
    try:
        return read()
    except RecordMismatchError as exc:
        first = exc
    cq = sm.cqs.find(topic, queue_id)
    if cq is None:
        raise DerivedStateError(f"queue {topic}/{queue_id} vanished during a repair")
    sm.derived.read_repairs += 1
    try:
        check_queue(sm, cq, topic, queue_id, first.offset, max(count, 1), "read")
    except AmbiguousRepairError as exc:
        sm.request_rebuild(f"queue {topic}/{queue_id} offset {first.offset}: {exc}")
        raise DerivedStateError(
            f"queue {topic}/{queue_id} offset {first.offset}: {first.why}; rebuilding at the"
            " next start, read from another member"
        ) from None
    try:
        return read()
    except RecordMismatchError as exc:
        sm.request_rebuild(f"queue {topic}/{queue_id} offset {exc.offset}: {exc.why}")
        raise DerivedStateError(f"queue {topic}/{queue_id}: {exc.why}") from None
