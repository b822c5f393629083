"""The broker's derived state of one replica checked against its commitlog: every
ConsumeQueue record and every key index record must point at a message the replica's log
holds, in an entry at or below its commit index, that is what the record says it is.

A broker keeps its ConsumeQueues in ``{storePathRootDir}/consumequeue/{topic}/{queueId}/``
and its key index in ``{storePathRootDir}/index/``, beside its log store
``{storePathRootDir}/dledger-{id}`` (docs/FORMAT.md, "Broker formats"). A replica audited
from a bare log store has neither: nothing is checked then.

Checked, per ConsumeQueue record (queue offset ``n`` of ``topic``/``queueId``):

- the record is not empty below the last record, positions increase and do not overlap;
- its position lies inside the body of an entry of the replica's log (found through the
  log's index file, then the entry's header and body CRC are checked) whose index is at or
  below the commit index the audit trusts for that replica;
- a message starts there (its magic, size and CRC check out) with that topic and queue id,
  the record's size, and the record's tag hash (the store time for the schedule and timer
  topics, as the broker writes them); a timer hop record (21 bytes in the timer topic) is
  checked for its place only.

Per key index file: the header (magic, version, CRC, sizes), every slot below the record
count and naming a record of its hash, and every record: its previous-record link points
below it, its position holds a message one of whose keys (``topic#uniqId``, ``topic#key``)
has the record's hash, and its time difference is that message's store time.

Each finding names the file (relative to ``storePathRootDir``) and the byte offset in it.
"""

from __future__ import annotations

import bisect
import struct
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from dledger.storage import codec
from dledger.storage.codec import ENTRY_HEADER_SIZE, INDEX_MAGIC, RecordError
from msgcodec.decode import DispatchInfo, read_dispatch
from msgcodec.errors import CodecError
from spark_audit import fs
from spark_audit.batch import INDEX_DTYPE
from spark_audit.model import Finding, GroupPlan, ReplicaPlan, TaskSpec, What
from spark_audit.scan import FileCache, TaskResult

# The broker's names and formats (broker/state/consumequeue.py, broker/state/indexfile.py,
# broker/state/names.py, broker/state/timerrules.py), repeated here because the executors run
# without the broker package; tests/audit/test_audit_units.py holds them equal.
CQ_DIR = "consumequeue"
KEY_INDEX_DIR = "index"
CQ_RECORD_BYTES = 20
CQ_DTYPE = np.dtype(
    {"names": ["position", "size", "tag"], "formats": [">u8", ">u4", ">i8"],
     "offsets": [0, 8, 12], "itemsize": CQ_RECORD_BYTES}
)  # fmt: skip
CQ_FILE_NAME_DIGITS = 20
SCHEDULE_TOPIC = "SCHEDULE_TOPIC_XXXX"
TIMER_TOPIC = "rmq_sys_wheel_timer"
HOP_RECORD_BYTES = 21
KEY_INDEX_MAGIC = 0x52495831  # "RIX1"
KEY_INDEX_VERSION = 1
KEY_INDEX_HEADER = struct.Struct(">IHHqqqqqIII")
KEY_INDEX_HEADER_BYTES = 64
KEY_INDEX_CRC_AT = 60
KEY_INDEX_NAME_DIGITS = 17
KEY_INDEX_MAX_RECORDS = (1 << 32) - 2
KEY_RECORD_BYTES = 20
KEY_RECORD_DTYPE = np.dtype(
    {"names": ["hash", "position", "diff", "prev"], "formats": [">i4", ">i8", ">i4", ">u4"],
     "offsets": [0, 4, 12, 16], "itemsize": KEY_RECORD_BYTES}
)  # fmt: skip
KEY_SEPARATOR = "#"
MS_PER_S = 1000

# Findings of one kind one replica reports one by one; the rest are counted in the last.
MAX_DERIVED_FINDINGS = 1000
# Messages kept decoded per task (a key index record often names a message a ConsumeQueue
# record named already); beyond it the cache starts over (memory stays bounded).
MAX_CACHED_MESSAGES = 1 << 20
# ConsumeQueue directories (topic/queue pairs) one replica may hold before the audit refuses
# to walk them (a damaged tree of millions of directories would not end).
MAX_QUEUES = 1 << 20


def broker_root(store_root: str) -> str:
    """``storePathRootDir`` of a log store ``{root}/dledger-{id}``."""
    return fs.dirname(store_root)


def has_derived_state(store_root: str) -> bool:
    root = broker_root(store_root)
    return fs.is_dir(fs.join(root, CQ_DIR)) or fs.is_dir(fs.join(root, KEY_INDEX_DIR))


@dataclass(slots=True)
class DerivedResult:
    findings: list[Finding] = field(default_factory=list)
    cq_records: int = 0  # ConsumeQueue records checked
    cq_files: int = 0
    key_records: int = 0  # key index records checked
    key_files: int = 0
    below_log: int = 0  # records of either kind pointing below the log (retention)


class EntryLocator:
    """Which entry of the replica's log holds a data position (through the index files),
    each entry checked (header, position, body CRC) the first time it is used."""

    def __init__(self, rp: ReplicaPlan, limit_index: int, cache: FileCache) -> None:
        self.rp = rp
        self.limit_index = limit_index
        self.cache = cache
        indexes: list[npt.NDArray[np.int64]] = []
        positions: list[npt.NDArray[np.int64]] = []
        ends: list[npt.NDArray[np.int64]] = []
        for f in rp.index_files:
            buf = cache.buf(f.uri)
            recs = np.frombuffer(buf, dtype=INDEX_DTYPE, count=len(buf) // INDEX_DTYPE.itemsize)
            ok = recs["magic"] == INDEX_MAGIC
            idx = np.flatnonzero(ok).astype(np.int64) + f.start // INDEX_DTYPE.itemsize
            keep = (idx >= rp.first_index) & (idx <= limit_index)
            if not keep.any():
                continue
            indexes.append(idx[keep])
            pos = recs["position"][ok][keep].astype(np.int64)
            positions.append(pos)
            ends.append(pos + recs["size"][ok][keep].astype(np.int64))
        self._files = list(zip(indexes, positions, ends, strict=True))
        self._starts = [int(p[0]) for p in positions]
        self._checked: dict[int, tuple[int, int] | str] = {}

    def below_log(self, position: int) -> bool:
        """Is ``position`` below the log's first entry (deleted by retention)? Records that
        point there stay until their whole file goes (docs/FORMAT.md): not checked."""
        return bool(self._starts) and position < self._starts[0]

    def find(self, position: int) -> tuple[int, int, int] | str:
        """(entry index, body start, body end) as data positions, or why there is none."""
        k = bisect.bisect_right(self._starts, position) - 1
        if k < 0:
            return "no entry of the log holds it (the log is empty below its commit index)"
        indexes, pos, ends = self._files[k]
        i = int(np.searchsorted(pos, position, side="right")) - 1
        if i < 0 or position >= int(ends[i]):
            return "no entry of the log at or below the commit index holds it"
        index = int(indexes[i])
        checked = self._checked.get(index)
        if checked is None:
            checked = self._check(index, int(pos[i]))
            if len(self._checked) >= MAX_CACHED_MESSAGES:
                self._checked.clear()  # bounded: an entry checked again costs one CRC
            self._checked[index] = checked
        if isinstance(checked, str):
            return checked
        body_start, body_end = checked
        if position < body_start:
            return f"it points into the header of entry {index}"
        return index, body_start, body_end

    def _check(self, index: int, position: int) -> tuple[int, int] | str:
        k = self.rp.segment_at(position)
        if k < 0:
            return f"entry {index}'s data segment is missing"
        seg = self.rp.segments[k]
        try:
            h = codec.verify_entry(self.cache.buf(seg.uri), position - seg.start,
                                   expected_position=position)  # fmt: skip
        except RecordError as exc:
            return f"entry {index} at position {position} is unreadable: {exc.reason}"
        if h.index != index:
            return f"the index file names entry {index} at {position}, it holds {h.index}"
        return position + ENTRY_HEADER_SIZE, position + h.total_size

    def buffer(self, position: int) -> tuple[memoryview, int]:
        """The data segment holding ``position`` and the position of its first byte."""
        seg = self.rp.segments[self.rp.segment_at(position)]
        buf = self.cache.buf(seg.uri)
        return (buf if isinstance(buf, memoryview) else memoryview(buf)), seg.start


class MessageReader:
    """The message at a data position, checked against the entry holding it."""

    def __init__(self, locator: EntryLocator) -> None:
        self.locator = locator
        self._cache: dict[int, tuple[int, DispatchInfo] | str] = {}

    def at(self, position: int) -> tuple[int, DispatchInfo] | str:
        """(entry index, the message's dispatch fields), or why there is no message there."""
        got = self._cache.get(position)
        if got is None:
            got = self._read(position)
            if len(self._cache) >= MAX_CACHED_MESSAGES:
                self._cache.clear()
            self._cache[position] = got
        return got

    def _read(self, position: int) -> tuple[int, DispatchInfo] | str:
        where = self.locator.find(position)
        if isinstance(where, str):
            return where
        index, body_start, body_end = where
        buf, seg_start = self.locator.buffer(body_start)
        body = buf[body_start - seg_start : body_end - seg_start]
        try:
            return index, read_dispatch(body, position - body_start)
        except CodecError as exc:
            return f"no message at position {position} of entry {index}: {exc}"


class _Findings:
    """A replica's findings of one kind, bounded."""

    def __init__(self, out: list[Finding], what: What, group: str, replica: str) -> None:
        self.out, self.what, self.group, self.replica = out, what, group, replica
        self.n = 0

    def add(self, file: str, path: str, offset: int, index: int, detail: str) -> None:
        self.n += 1
        if self.n <= MAX_DERIVED_FINDINGS:
            self.out.append(Finding(self.what, self.group, self.replica, file, path, index,
                                    index, offset, detail, count=1))  # fmt: skip
        elif self.n == MAX_DERIVED_FINDINGS + 1:
            self.out.append(
                Finding(
                    self.what,
                    self.group,
                    self.replica,
                    file,
                    path,
                    index,
                    index,
                    offset,
                    "and more: the rest are not listed",
                )
            )


def _numbered(uri: str, digits: int) -> list[str]:
    try:
        entries = fs.list_dir(uri)
    except fs.FsError:
        return []
    return sorted(
        e.name for e in entries if not e.is_dir and len(e.name) == digits and e.name.isdigit()
    )


def _queues(root: str) -> Iterator[tuple[str, int, str]]:
    """(topic, queue id, directory) of every ConsumeQueue of the broker at ``root``."""
    base = fs.join(root, CQ_DIR)
    if not fs.is_dir(base):
        return
    n = 0
    for t in sorted(fs.list_dir(base), key=lambda e: e.name):
        if not t.is_dir:
            continue
        for q in sorted(fs.list_dir(fs.join(base, t.name)), key=lambda e: e.name):
            if q.is_dir and q.name.isdigit():
                n += 1
                if n > MAX_QUEUES:
                    return
                yield t.name, int(q.name), fs.join(base, t.name, q.name)


def _check_cq_record(
    reader: MessageReader, topic: str, queue_id: int, pos: int, size: int, tag: int
) -> tuple[int, str]:
    """(entry index or 0, what is wrong or "")."""
    if topic == TIMER_TOPIC and size == HOP_RECORD_BYTES:  # a timer hop: its place only
        where = reader.locator.find(pos)
        if isinstance(where, str):
            return 0, where
        index, _start, body_end = where
        return index, "" if pos + size <= body_end else f"runs past the end of entry {index}"
    got = reader.at(pos)
    if isinstance(got, str):
        return 0, got
    index, m = got
    want_tag = m.store_timestamp_ms if topic in (SCHEDULE_TOPIC, TIMER_TOPIC) else m.tags_hash
    wrong = []
    if (m.topic, m.queue_id) != (topic, queue_id):
        wrong.append(f"the message there is of {m.topic}/{m.queue_id}")
    if m.size != size:
        wrong.append(f"the message is {m.size} bytes, the record says {size}")
    if want_tag != tag:
        wrong.append(f"the tag hash should be {want_tag}, the record says {tag}")
    return index, "; ".join(wrong)


def _audit_queue(
    reader: MessageReader,
    rel: str,
    directory: str,
    topic: str,
    queue_id: int,
    bad: _Findings,
    out: DerivedResult,
) -> None:
    last_end = -1
    names = _numbered(directory, CQ_FILE_NAME_DIGITS)
    for name in names:
        uri = fs.join(directory, name)
        buf = reader.locator.cache.buf(uri)
        out.cq_files += 1
        recs = np.frombuffer(buf, dtype=CQ_DTYPE, count=len(buf) // CQ_RECORD_BYTES)
        used = np.flatnonzero(recs["size"] != 0)
        file_rel = f"{rel}/{name}"
        top = int(used[-1]) + 1 if len(used) else 0
        for i in np.flatnonzero(recs["size"][:top] == 0).tolist():
            bad.add(file_rel, uri, i * CQ_RECORD_BYTES, 0, "an empty record below the last")
        first_offset = int(name) // CQ_RECORD_BYTES
        for i in used.tolist():
            pos, size, tag = int(recs["position"][i]), int(recs["size"][i]), int(recs["tag"][i])
            if reader.locator.below_log(pos):
                out.below_log += 1
                last_end = max(last_end, pos + size)
                continue
            out.cq_records += 1
            offset = first_offset + i
            index, wrong = _check_cq_record(reader, topic, queue_id, pos, size, tag)
            if pos < last_end:
                wrong = "; ".join(filter(None, [f"position {pos} is below the previous "
                                                f"record's end {last_end}", wrong]))  # fmt: skip
            last_end = max(last_end, pos + size)
            if wrong:
                bad.add(file_rel, uri, i * CQ_RECORD_BYTES, index,
                        f"queue offset {offset} -> position {pos} size {size} tag {tag}: "
                        f"{wrong}")  # fmt: skip


def audit_consume_queues(
    reader: MessageReader, root: str, bad: _Findings, out: DerivedResult
) -> None:
    for topic, queue_id, directory in _queues(root):
        _audit_queue(reader, f"{CQ_DIR}/{topic}/{queue_id}", directory, topic, queue_id, bad, out)


def _key_hash(key: str) -> int:
    return int(codec.crc32c(key.encode("utf-8", "surrogatepass"))) & 0x7FFFFFFF


def _header(raw: bytes, size: int) -> tuple[int, int, int, int, int] | str:
    """(hash slots, max records, record count, base time, flags) or what is wrong."""
    if len(raw) < KEY_INDEX_HEADER_BYTES:
        return "shorter than its header"
    magic, version, flags, _b, _e, _bp, _ep, base_ts, slots, max_records, count = (
        KEY_INDEX_HEADER.unpack_from(raw, 0)
    )
    (crc,) = struct.unpack_from(">I", raw, KEY_INDEX_CRC_AT)
    if magic != KEY_INDEX_MAGIC:
        return f"bad magic {magic:#010x}"
    if crc != codec.crc32c(raw[:KEY_INDEX_CRC_AT]):
        return "header CRC mismatch"
    if version != KEY_INDEX_VERSION:
        return f"unknown version {version}"
    if not (
        slots >= 1 and 1 <= max_records <= KEY_INDEX_MAX_RECORDS and 1 <= count <= max_records + 1
    ):
        return f"header out of range: slots={slots} max_records={max_records} count={count}"
    expected = KEY_INDEX_HEADER_BYTES + 4 * slots + KEY_RECORD_BYTES * (max_records + 1)
    if size != expected:
        return f"the file is {size} bytes, its header says {expected}"
    return slots, max_records, count, base_ts, flags


def _audit_key_file(
    reader: MessageReader, rel: str, uri: str, bad: _Findings, out: DerivedResult
) -> None:
    buf = reader.locator.cache.buf(uri)
    head = bytes(buf[:KEY_INDEX_HEADER_BYTES])
    if head.count(0) == len(head):
        return  # never flushed: the broker deletes it on open
    out.key_files += 1
    h = _header(head, len(buf))
    if isinstance(h, str):
        bad.add(rel, uri, 0, 0, h)
        return
    slots, _max_records, count, base_ts, _flags = h
    slot_vals = np.frombuffer(buf, dtype=">u4", count=slots, offset=KEY_INDEX_HEADER_BYTES)
    rec_at = KEY_INDEX_HEADER_BYTES + 4 * slots
    recs = np.frombuffer(buf, dtype=KEY_RECORD_DTYPE, count=count, offset=rec_at)
    for s in np.flatnonzero(slot_vals >= count).tolist()[:MAX_DERIVED_FINDINGS]:
        bad.add(
            rel,
            uri,
            KEY_INDEX_HEADER_BYTES + 4 * s,
            0,
            f"slot {s} names record {int(slot_vals[s])}, the file holds {count - 1}",
        )
    heads = np.flatnonzero((slot_vals > 0) & (slot_vals < count))
    wrong_slot = heads[(recs["hash"][slot_vals[heads]].astype(np.int64) % slots) != heads]
    for s in wrong_slot.tolist()[:MAX_DERIVED_FINDINGS]:
        bad.add(
            rel,
            uri,
            KEY_INDEX_HEADER_BYTES + 4 * s,
            0,
            f"slot {s} names record {int(slot_vals[s])}, whose hash is of another slot",
        )
    for r in range(1, count):
        khash, pos, diff, prev = (int(recs[f][r]) for f in ("hash", "position", "diff", "prev"))
        if reader.locator.below_log(pos):
            out.below_log += 1
            continue
        out.key_records += 1
        off = rec_at + r * KEY_RECORD_BYTES
        wrong = [] if prev < r else [f"its previous record {prev} is not below it"]
        got = reader.at(pos)
        index = 0
        if isinstance(got, str):
            wrong.append(got)
        else:
            index, m = got
            prefix = m.topic + KEY_SEPARATOR
            keys = [prefix + m.uniq_id] + [prefix + k for k in m.keys if k]
            if khash not in {_key_hash(k) for k in keys}:
                wrong.append(f"no key of the message there ({', '.join(keys)}) has hash {khash}")
            if diff != (m.store_timestamp_ms - base_ts) // MS_PER_S:
                wrong.append(f"time diff {diff} s, the message was stored at "
                             f"{m.store_timestamp_ms} (base {base_ts})")  # fmt: skip
        if wrong:
            bad.add(rel, uri, off, index, f"record {r} -> position {pos}: {'; '.join(wrong)}")


def audit_key_index(reader: MessageReader, root: str, bad: _Findings, out: DerivedResult) -> None:
    directory = fs.join(root, KEY_INDEX_DIR)
    for name in _numbered(directory, KEY_INDEX_NAME_DIGITS):
        _audit_key_file(reader, f"{KEY_INDEX_DIR}/{name}", fs.join(directory, name), bad, out)


def audit_derived(plan: GroupPlan, rp: ReplicaPlan) -> DerivedResult:
    """Check the ConsumeQueues and the key index of replica ``rp`` against its log."""
    out = DerivedResult()
    root = broker_root(rp.root)
    # The replica applied what it knew committed: its own commit index (the checkpoint's),
    # or the audited one when that is higher (the checkpoint is written after the apply).
    limit = max(rp.commit_index if rp.commit_known else 0, plan.audited_index)
    cache = FileCache()
    try:
        reader = MessageReader(EntryLocator(rp, limit, cache))
        cq = _Findings(out.findings, What.CQ_MISMATCH, plan.group, rp.replica)
        audit_consume_queues(reader, root, cq, out)
        keys = _Findings(out.findings, What.KEY_INDEX_MISMATCH, plan.group, rp.replica)
        audit_key_index(reader, root, keys, out)
    finally:
        cache.close()
    return out


def run_derived_task(plan: GroupPlan, task: TaskSpec) -> TaskResult:
    """The work of a TASK_DERIVED task: the derived state of ``task.replica``."""
    rp = next(r for r in plan.replicas if r.replica == task.replica)
    got = audit_derived(plan, rp)
    result = TaskResult(findings=got.findings)
    result.derived.append((rp.replica, "consumequeue", got.cq_files, got.cq_records))
    result.derived.append((rp.replica, "key_index", got.key_files, got.key_records))
    result.derived.append((rp.replica, "below_log", 0, got.below_log))
    return result
