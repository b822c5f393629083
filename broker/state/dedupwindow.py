"""The idempotent-send window in columns (docs/BROKER.md, docs/FORMAT.md "Broker: state snapshot").

Every member keeps the uniq ids of the messages it stored within the last ``dedupWindowSeconds``
of store time (at most ``dedupWindowMaxIds``), and answers a send of one of them with where the
first copy is. An ``OrderedDict`` of ``str`` -> :class:`SendResult` held about 376 bytes of
Python objects per id (37.6 MB per node at the 100,000-id default); this window holds the same
answers in the same order in columns:

- one row per id, oldest first, in ``array`` columns (store time, queue id, queue offset,
  position, the id's hash) and a ``bytearray`` of the 16-byte ids; the topic as a reference
  to one shared ``str`` per name. A row's *sequence number* never changes; its column index is
  the sequence number minus :attr:`DedupWindow._base`, which moves when the evicted head of the
  columns is cut off (:data:`COMPACT_MIN_ROWS`);
- an index from ``hash(id)`` to the sequence number. ``str`` hashes are keyed per process
  (SipHash), so a sender cannot choose ids that collide (an ``int`` of the id's 128 bits would
  be: ``hash(int)`` is the value modulo 2**61 - 1). A hash that two live ids share, and any id
  that is not 32 uppercase hex digits (apply only makes those, from the stored 16 bytes; other
  callers may ask for anything), go to a plain ``str`` -> sequence number dict: the same
  answers, the old cost per id.

Everything observable is the ``OrderedDict``'s: :meth:`get`, insertion order, eviction oldest
first, :meth:`pop` anywhere, and the snapshot's bytes (:func:`encode_dedup`):
tests/unit/test_dedup_window.py runs random operation sequences against the ``OrderedDict``.
"""

from __future__ import annotations

import array
import base64
import sys
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

__all__ = [
    "COMPACT_MIN_ROWS",
    "DedupCapture",
    "DedupWindow",
    "SendResult",
    "decode_dedup",
    "encode_dedup",
]


class SendResult(NamedTuple):
    """Where one message of a send is stored; ``duplicate``: an earlier send stored it.
    (A tuple: every member makes one per message it applies.)"""

    uniq_id: str
    topic: str
    queue_id: int
    queue_offset: int
    position: int
    store_timestamp_ms: int
    duplicate: bool = False


# The id form apply makes (the message format's 16 bytes as 32 uppercase hex digits) is kept
# as the 16 bytes.
ID_BYTES = 16
# The evicted rows at the head of the columns are cut off once they are at least this many
# and at least as many as the live rows: the columns hold at most twice the live rows (plus
# this), and each row is moved at most once per halving (a memmove, about 1 ms per 100,000
# rows), never one by one.
COMPACT_MIN_ROWS = 4096
# The shared topic names are rebuilt from the live rows when they reach twice as many as the
# last rebuild left (and at least this many): names of evicted rows do not pile up, and the
# rebuild's cost (a pass over the live rows' topics) is spread over as many inserts.
NAMES_REBUILD_MIN = 1024


@dataclass(frozen=True, slots=True)
class DedupCapture:
    """The live rows at one applied index, oldest first (copies: written in the background)."""

    uids: list[str] | None  # every id as a str when some id is not canonical, else None
    ids: bytes  # 16 bytes per row (zeros where ``uids`` holds a non-canonical id)
    topics: list[str]
    stamps: array.array[int]
    queue_ids: array.array[int]
    offsets: array.array[int]
    positions: array.array[int]

    def __len__(self) -> int:
        return len(self.topics)


class DedupWindow:
    """A mapping of uniq id -> :class:`SendResult` in insertion order, as ``OrderedDict``
    would keep it, in columns (module docstring)."""

    __slots__ = (
        "_base",
        "_dead",
        "_hashes",
        "_head",
        "_ids",
        "_index",
        "_live",
        "_names",
        "_names_rebuilt",
        "_odd",
        "_odd_ids",
        "_offsets",
        "_positions",
        "_queue_ids",
        "_stamps",
        "_topics",
    )

    def __init__(self) -> None:
        self._index: dict[int, int] = {}  # hash(id) -> sequence number (canonical ids)
        self._odd: dict[str, int] = {}  # id -> sequence number (the rest, module docstring)
        self._odd_ids: dict[int, str] = {}  # sequence number -> id, of the rows in _odd
        self._dead: set[int] = set()  # sequence numbers popped out of the middle
        self._ids = bytearray()
        self._hashes = array.array("q")
        self._stamps = array.array("q")
        self._queue_ids = array.array("q")
        self._offsets = array.array("q")
        self._positions = array.array("q")
        self._topics: list[str] = []
        self._names: dict[str, str] = {}
        self._names_rebuilt = 0
        self._base = 0  # sequence number of column index 0
        self._head = 0  # column index of the oldest row not yet evicted (live or dead)
        self._live = 0

    # ------------------------------------------------------------------ lookups

    def __len__(self) -> int:
        return self._live

    def _seq_of(self, uid: str) -> int | None:
        seq = self._index.get(hash(uid))
        if seq is not None:
            at = (seq - self._base) * ID_BYTES
            if self._ids[at : at + ID_BYTES].hex().upper() == uid:
                return seq
        return self._odd.get(uid) if self._odd else None

    def __contains__(self, uid: object) -> bool:
        return isinstance(uid, str) and self._seq_of(uid) is not None

    def get(self, uid: str, default: SendResult | None = None) -> SendResult | None:
        seq = self._seq_of(uid)
        return default if seq is None else self._result(uid, seq - self._base)

    def __getitem__(self, uid: str) -> SendResult:
        seq = self._seq_of(uid)
        if seq is None:
            raise KeyError(uid)
        return self._result(uid, seq - self._base)

    def _result(self, uid: str, row: int) -> SendResult:
        return SendResult(
            uid,
            self._topics[row],
            self._queue_ids[row],
            self._offsets[row],
            self._positions[row],
            self._stamps[row],
        )

    def _uid_at(self, row: int) -> str:
        uid = self._odd_ids.get(row + self._base) if self._odd_ids else None
        if uid is None:
            return self._ids[row * ID_BYTES : (row + 1) * ID_BYTES].hex().upper()
        return uid

    def _live_rows(self) -> Iterator[int]:
        dead, base = self._dead, self._base
        for row in range(self._head, len(self._stamps)):
            if not dead or row + base not in dead:
                yield row

    def __iter__(self) -> Iterator[str]:
        return (self._uid_at(row) for row in self._live_rows())

    def keys(self) -> Iterator[str]:
        return iter(self)

    def values(self) -> Iterator[SendResult]:
        return (self._result(self._uid_at(row), row) for row in self._live_rows())

    def items(self) -> Iterator[tuple[str, SendResult]]:
        return ((r.uniq_id, r) for r in self.values())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, DedupWindow | Mapping):
            return len(self) == len(other) and list(self.items()) == list(other.items())
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # mutable, like a dict

    def __repr__(self) -> str:
        return f"DedupWindow({len(self)} ids)"

    # ------------------------------------------------------------------ changes

    def __setitem__(self, uid: str, r: SendResult) -> None:
        """Add ``uid`` as the newest row; an id already held keeps its place and takes the
        new values (as ``OrderedDict`` does)."""
        seq = self._seq_of(uid)
        if seq is None:
            self.add_new(uid, r)
        else:
            self._overwrite(seq - self._base, r)

    def add_new(self, uid: str, r: SendResult) -> None:
        """Add ``uid``, which the caller has just looked up and not found, as the newest row
        (apply's path: the lookup is not made twice)."""
        seq = self._base + len(self._stamps)
        h = hash(uid)
        try:
            raw = bytes.fromhex(uid)
        except ValueError:
            raw = b""
        # 32 hex digits (16 bytes from 32 characters: no spaces), none a lowercase letter.
        canonical = len(raw) == ID_BYTES and len(uid) == 2 * ID_BYTES
        if canonical and (uid.isupper() or uid.isdigit()) and h not in self._index:
            self._index[h] = seq
            self._ids += raw
        else:  # not the canonical form, or a hash another live id has
            self._odd[uid] = seq
            self._odd_ids[seq] = uid
            self._ids += bytes(ID_BYTES)
        self._hashes.append(h)
        topic = self._names.get(r.topic)
        self._topics.append(self._share_name(r.topic) if topic is None else topic)
        self._queue_ids.append(r.queue_id)
        self._offsets.append(r.queue_offset)
        self._positions.append(r.position)
        self._stamps.append(r.store_timestamp_ms)
        self._live += 1

    def _share_name(self, name: str) -> str:
        if len(self._names) >= max(NAMES_REBUILD_MIN, 2 * self._names_rebuilt):
            live = self._topics[self._head :]
            self._names = {t: t for t in live}
            self._names_rebuilt = len(self._names)
        return self._names.setdefault(name, name)

    def _overwrite(self, row: int, r: SendResult) -> None:
        self._topics[row] = self._names.get(r.topic) or self._share_name(r.topic)
        self._queue_ids[row] = r.queue_id
        self._offsets[row] = r.queue_offset
        self._positions[row] = r.position
        self._stamps[row] = r.store_timestamp_ms

    def pop(self, uid: str, default: SendResult | None = None) -> SendResult | None:
        seq = self._seq_of(uid)
        if seq is None:
            return default
        row = seq - self._base
        result = self._result(uid, row)
        self._unindex(seq, row)
        self._live -= 1
        if row == len(self._stamps) - 1:
            self._cut_tail(row)
        else:
            self._dead.add(seq)
        if not self._live:
            self.clear()
        return result

    def __delitem__(self, uid: str) -> None:
        if self.pop(uid) is None:
            raise KeyError(uid)

    def _unindex(self, seq: int, row: int) -> None:
        uid = self._odd_ids.pop(seq, None) if self._odd_ids else None
        if uid is not None:
            del self._odd[uid]
        else:
            del self._index[self._hashes[row]]

    def _cut_tail(self, row: int) -> None:
        """Drop the rows from ``row`` on (the newest; popped), and dead rows before them."""
        base = self._base
        while row > self._head and row - 1 + base in self._dead:
            row -= 1
            self._dead.discard(row + base)
        del self._ids[row * ID_BYTES :]
        for col in (self._hashes, self._stamps, self._queue_ids, self._offsets, self._positions):
            del col[row:]
        del self._topics[row:]

    def evict(self, cutoff_ms: int, max_ids: int) -> None:
        """Forget the oldest ids while more than ``max_ids`` are held or the oldest was stored
        before ``cutoff_ms``."""
        stamps, dead, base, head, live = (
            self._stamps,
            self._dead,
            self._base,
            self._head,
            self._live,
        )
        index, hashes, odd_ids = self._index, self._hashes, self._odd_ids
        while live:  # at most one pass over the rows: head only moves on
            seq = head + base
            if dead and seq in dead:
                dead.discard(seq)
            elif live <= max_ids and stamps[head] >= cutoff_ms:
                break
            else:  # _unindex, inline: this loop runs once per stored message
                if odd_ids and seq in odd_ids:
                    del self._odd[odd_ids.pop(seq)]
                else:
                    del index[hashes[head]]
                live -= 1
            head += 1
        self._head, self._live = head, live
        if not live:
            if stamps:
                self.clear()
        elif head >= COMPACT_MIN_ROWS and head >= len(stamps) - head:
            self._compact()

    def _compact(self) -> None:
        head = self._head
        del self._ids[: head * ID_BYTES]
        for col in (self._hashes, self._stamps, self._queue_ids, self._offsets, self._positions):
            del col[:head]
        del self._topics[:head]
        self._base += head
        self._head = 0

    def clear(self) -> None:
        """Forget every id (sequence numbers go on: none is ever reused)."""
        self._base += len(self._stamps)
        self._head = self._live = 0
        self._index.clear()
        self._odd.clear()
        self._odd_ids.clear()
        self._dead.clear()
        self._ids = bytearray()
        for name in ("_hashes", "_stamps", "_queue_ids", "_offsets", "_positions"):
            setattr(self, name, array.array("q"))
        self._topics = []
        self._names = {}
        self._names_rebuilt = 0

    # ------------------------------------------------------------------ snapshots

    def capture(self) -> DedupCapture:
        """Copies of the live rows (C-level slices when no row was popped out of the middle)."""
        head = self._head
        rows: Sequence[int]
        if self._dead:
            rows = list(self._live_rows())
            ids = b"".join(self._ids[r * ID_BYTES : (r + 1) * ID_BYTES] for r in rows)
            cols = [
                array.array("q", (col[r] for r in rows))
                for col in (self._stamps, self._queue_ids, self._offsets, self._positions)
            ]
            topics = [self._topics[r] for r in rows]
        else:
            rows = range(head, len(self._stamps))
            ids = bytes(self._ids[head * ID_BYTES :])
            cols = [
                col[head:]
                for col in (self._stamps, self._queue_ids, self._offsets, self._positions)
            ]
            topics = self._topics[head:]
        uids = [self._uid_at(r) for r in rows] if self._odd_ids else None
        return DedupCapture(uids, ids, topics, *cols)

    def _load(
        self,
        ids: bytes,
        hashes: array.array[int],
        index: dict[int, int],
        topics: list[str],
        *columns: array.array[int],
    ) -> None:
        """Take whole columns (an empty window's; rows numbered from 0, every id canonical
        and its hash unshared: decode_dedup checked)."""
        assert not self._live and not self._base and len(index) == len(topics)
        self._ids, self._hashes, self._index, self._topics = bytearray(ids), hashes, index, topics
        self._stamps, self._queue_ids, self._offsets, self._positions = columns
        self._names = {t: t for t in topics}
        self._names_rebuilt = len(self._names)
        self._live = len(topics)

    def topic_names(self) -> set[str]:
        return set(self._topics[self._head :])

    def footprint_rows(self) -> int:
        """Rows the columns hold, evicted and popped ones included (tests, memory figures)."""
        return len(self._stamps)


# ---------------------------------------------------------------------------------------
# The window in a snapshot (docs/FORMAT.md, "Broker: state snapshot"): unchanged since
# version 2; the bytes are the ones the OrderedDict window wrote (tests/unit/test_dedup_window.py).
# ---------------------------------------------------------------------------------------


def _column(values: array.array[int]) -> str:
    """Little-endian i64s, base64."""
    if sys.byteorder != "little":
        values = array.array("q", values)
        values.byteswap()
    return base64.b64encode(values.tobytes()).decode("ascii")


def _uncolumn(text: str, count: int, name: str) -> array.array[int]:
    col = array.array("q")
    col.frombytes(base64.b64decode(text, validate=True))
    if sys.byteorder != "little":
        col.byteswap()
    if len(col) != count:
        raise ValueError(f"dedup column {name} holds {len(col)} values, not {count}")
    return col


def encode_dedup(c: DedupCapture) -> dict[str, Any]:
    """The window, oldest first, as columns. Ids that are not 32 hex digits cannot be held by
    the format: ValueError, as the ``OrderedDict`` window's encoder raised (apply never makes
    them)."""
    if not len(c):
        return {
            "count": 0,
            "ids": "",
            "topics": "",
            "store_timestamps_ms": "",
            "queue_ids": "",
            "queue_offsets": "",
            "positions": "",
        }
    ids = c.ids if c.uids is None else bytes.fromhex("".join(c.uids))
    return {
        "count": len(c),
        "ids": base64.b64encode(ids).decode("ascii"),
        "topics": "\n".join(c.topics),
        "store_timestamps_ms": _column(c.stamps),
        "queue_ids": _column(c.queue_ids),
        "queue_offsets": _column(c.offsets),
        "positions": _column(c.positions),
    }


def decode_dedup(data: Mapping[str, Any]) -> DedupWindow:
    """A snapshot's window (ValueError, KeyError or TypeError when it is malformed)."""
    count = int(data["count"])
    window = DedupWindow()
    if count == 0:
        return window
    raw = base64.b64decode(data["ids"], validate=True)
    if len(raw) != ID_BYTES * count:
        raise ValueError(f"dedup ids hold {len(raw)} bytes, not {ID_BYTES * count}")
    topics = str(data["topics"]).split("\n")
    if len(topics) != count:
        raise ValueError(f"dedup topics hold {len(topics)} names, not {count}")
    queue_ids, offsets, positions, stamps = (
        _uncolumn(data[name], count, name)
        for name in ("queue_ids", "queue_offsets", "positions", "store_timestamps_ms")
    )
    text = raw.hex().upper()
    uids = [text[at : at + 2 * ID_BYTES] for at in range(0, len(text), 2 * ID_BYTES)]
    hashes = array.array("q", map(hash, uids))
    index = dict(zip(hashes, range(count), strict=True))
    if len(index) == count:  # no id twice, no hash shared: the columns as they are
        names: dict[str, str] = {}
        shared = [names.setdefault(t, t) for t in topics]
        window._load(raw, hashes, index, shared, stamps, queue_ids, offsets, positions)
        return window
    for i, uid in enumerate(uids):  # row by row, as the OrderedDict was built
        window[uid] = SendResult(uid, topics[i], queue_ids[i], offsets[i], positions[i], stamps[i])
    return window
