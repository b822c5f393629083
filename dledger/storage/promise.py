"""The promise file: what a member vouched for, kept apart from its log store.

A member acknowledges log entries as durable (a follower's append answer, a leader counting
its own copy towards a commit) and casts votes. If its store is later rolled back, truncated
or replaced (a lying write cache, a restored volume snapshot, a new disk under the same id),
the log alone cannot tell: the member would vote and count as if it never had the entries it
acknowledged. The promise file remembers, outside the store directory:

* ``promised_index``: the highest log index this member acknowledged as durable to anyone;
* ``durable_index``: every index up to it was durable in the store when this promise was
  written (a promise written ahead, beside the log's flush, may run ahead of the log: a log
  that ends between the two was cut short by a crash, and holds every entry whose
  acknowledgement left);
* a copy of the hard state (term, vote), so that a lost or damaged ``meta`` file is never
  read as "term 0, no vote";
* the group and member it belongs to, so that a file moved to another member is refused.

Format (docs/FORMAT.md, "Promise file"): two fixed-size slots, each with a sequence number
and a CRC. The last slot written with ``fdatasync`` is the *anchor*; every write goes to the
other slot (no rename, no directory sync: the file never changes size after its creation),
so a write torn by a crash leaves the anchor intact. :class:`PromiseWriter` makes a promise
durable ahead of the acknowledgements (``write_ahead``) and records the exact one in the
page cache meanwhile (``refresh``; docs/RAFT.md section 11). The reader takes the valid slot
with the highest sequence number.

The functions ``encode_slot``, ``decode_slot``, ``decode_promise`` and ``promise_path`` are
pure (stdlib + ``crc32c``); ``read_promise`` reads a file and :class:`PromiseWriter` writes
one durably.
"""

from __future__ import annotations

import errno
import os
import struct
from dataclasses import dataclass
from pathlib import Path

import crc32c as _crc32c

from dledger.log import DLedgerError, HardState
from mqerrors import codes as E

PROMISE_MAGIC = 0x50524D53  # b"PRMS"
PROMISE_VERSION = 1
# magic, version, reserved, sequence, promised_index, durable_index, term, group_len,
# node_len, voted_len, reserved
SLOT_HEAD = struct.Struct(">IHHQQQQHHHH")
CRC = struct.Struct(">I")
NO_VOTE = 0xFFFF
# Group names and member ids are short (member ids match MEMBER_ID_RE: at most 64 chars);
# 255 bytes each bounds a slot and rejects garbage early.
MAX_NAME_BYTES = 255
# One slot holds the head, three names of at most MAX_NAME_BYTES and the CRC (817 bytes), so
# 1 KiB fits any valid record; slots are zero padded. Two slots: the file is 2 KiB for good.
SLOT_BYTES = 1024
SLOT_COUNT = 2
FILE_BYTES = SLOT_BYTES * SLOT_COUNT
MAX_U64 = (1 << 64) - 1
# Suffix of the default promise file: a sibling of the store directory ``dledger-{id}``.
PROMISE_SUFFIX = ".promise"

crc32c = _crc32c.crc32c


class PromiseError(DLedgerError):
    """The promise file is damaged, of another member, or cannot be read."""

    code = E.PROMISE_INVALID

    def __init__(self, message: str, *, path: str = "") -> None:
        super().__init__(message)
        self.path = path


class PromiseDamagedError(PromiseError):
    """No slot of the promise file holds a valid promise (both damaged, or the file has the
    wrong size): what it promised is unknown. The node starts repairing with its vote counted
    as lost (docs/RAFT.md section 11); the file is rewritten at its next promise."""

    code = E.PROMISE_DAMAGED


class PromiseVersionError(PromiseError):
    """The promise file was written by a newer format version than this code reads."""

    code = E.PROMISE_VERSION


@dataclass(frozen=True, slots=True)
class Promise:
    """One slot's content. ``sequence`` grows by one with every write; ``durable_index``
    (at most ``promised_index``; -1 when built without one: the same as ``promised_index``)
    was durable in the store when it was written."""

    group: str
    node_id: str
    promised_index: int
    hard_state: HardState
    sequence: int = 1
    durable_index: int = -1

    @property
    def durable(self) -> int:
        return self.promised_index if self.durable_index < 0 else self.durable_index


def promise_path(store_root_dir: str | os.PathLike[str], node_id: str) -> Path:
    """The default promise file of member ``node_id`` whose store is
    ``{store_root_dir}/dledger-{node_id}``: ``{store_root_dir}/dledger-{node_id}.promise``
    (a sibling, so that removing or replacing the store directory leaves it)."""
    return Path(store_root_dir) / f"dledger-{node_id}{PROMISE_SUFFIX}"


def promise_path_for_store(store_dir: str | os.PathLike[str]) -> Path:
    """The default promise file of the store at ``store_dir``: ``{store_dir}.promise``."""
    p = Path(store_dir)
    return p.with_name(p.name + PROMISE_SUFFIX)


def _name_bytes(value: str, what: str) -> bytes:
    raw = value.encode("utf-8")
    if not 0 < len(raw) <= MAX_NAME_BYTES:
        raise ValueError(f"{what} must be 1 to {MAX_NAME_BYTES} bytes, got {len(raw)}")
    return raw


def encode_slot(p: Promise) -> bytes:
    """One slot, ``SLOT_BYTES`` long (zero padded). ValueError for out-of-range fields."""
    fields = (
        (p.sequence, "sequence"),
        (p.promised_index, "promised_index"),
        (p.durable, "durable"),
    )
    for v, what in fields:
        if not 0 <= v <= MAX_U64:
            raise ValueError(f"{what} {v} is outside [0, 2^64-1]")
    if not 0 <= p.hard_state.term <= MAX_U64:
        raise ValueError(f"term {p.hard_state.term} is outside [0, 2^64-1]")
    if p.durable > p.promised_index:
        raise ValueError(f"durable_index {p.durable} above promised_index {p.promised_index}")
    group = _name_bytes(p.group, "group")
    node = _name_bytes(p.node_id, "node id")
    vote = b"" if p.hard_state.voted_for is None else _name_bytes(p.hard_state.voted_for, "vote")
    head = SLOT_HEAD.pack(
        PROMISE_MAGIC,
        PROMISE_VERSION,
        0,
        p.sequence,
        p.promised_index,
        p.durable,
        p.hard_state.term,
        len(group),
        len(node),
        NO_VOTE if p.hard_state.voted_for is None else len(vote),
        0,
    )
    body = head + group + node + vote
    record = body + CRC.pack(crc32c(body))
    assert len(record) <= SLOT_BYTES
    return record + bytes(SLOT_BYTES - len(record))


def decode_slot(data: bytes) -> Promise | None:
    """The promise in one slot; None for a slot never written (all zeros).
    PromiseVersionError for a newer format, PromiseError for anything else wrong."""
    if len(data) != SLOT_BYTES:
        raise PromiseError(f"slot is {len(data)} bytes, expected {SLOT_BYTES}")
    if not any(data):
        return None
    head = SLOT_HEAD.unpack_from(data)
    magic, version, _, seq, promised, durable, term, glen, nlen, vlen, _ = head
    if magic != PROMISE_MAGIC:
        raise PromiseError(f"bad magic 0x{magic:08x}")
    if version > PROMISE_VERSION:
        raise PromiseVersionError(
            f"format version {version} is newer than version {PROMISE_VERSION}, the newest "
            "this raftmq reads: run the raftmq release that wrote it"
        )
    if version < 1:
        raise PromiseError(f"format version {version} is invalid")
    vote_len = 0 if vlen == NO_VOTE else vlen
    if not (0 < glen <= MAX_NAME_BYTES and 0 < nlen <= MAX_NAME_BYTES):
        raise PromiseError(f"name lengths {glen}/{nlen} outside [1, {MAX_NAME_BYTES}]")
    if vlen != NO_VOTE and not 0 < vlen <= MAX_NAME_BYTES:
        raise PromiseError(f"vote length {vlen} outside [1, {MAX_NAME_BYTES}]")
    end = SLOT_HEAD.size + glen + nlen + vote_len
    (crc,) = CRC.unpack_from(data, end)
    if crc32c(data[:end]) != crc:
        raise PromiseError("CRC mismatch")
    if any(data[end + CRC.size :]):
        raise PromiseError("nonzero bytes after the record")
    g_end = SLOT_HEAD.size + glen
    n_end = g_end + nlen
    try:
        group = data[SLOT_HEAD.size : g_end].decode("utf-8")
        node = data[g_end:n_end].decode("utf-8")
        vote = data[n_end:end].decode("utf-8") if vlen != NO_VOTE else None
    except UnicodeDecodeError:
        raise PromiseError("names are not UTF-8") from None
    if durable > promised:
        raise PromiseError(f"durable_index {durable} above promised_index {promised}")
    return Promise(group, node, promised, HardState(term, vote), seq, durable)


def decode_promise(data: bytes) -> Promise:
    """The newest valid slot of a whole promise file. A damaged slot next to a valid one is
    a write a crash tore (the other slot holds the previous promise); a newer format version
    in any slot is refused."""
    if len(data) != FILE_BYTES:
        raise PromiseDamagedError(f"promise file is {len(data)} bytes, expected {FILE_BYTES}")
    found: list[Promise] = []
    errors: list[str] = []
    for i in range(SLOT_COUNT):
        try:
            p = decode_slot(data[i * SLOT_BYTES : (i + 1) * SLOT_BYTES])
        except PromiseVersionError:
            raise
        except PromiseError as e:
            errors.append(f"slot {i}: {e}")
            continue
        if p is not None:
            found.append(p)
    if not found:
        raise PromiseDamagedError("no valid slot (" + ("; ".join(errors) or "both empty") + ")")
    return max(found, key=lambda p: p.sequence)


def read_promise(path: str | os.PathLike[str]) -> Promise | None:
    """The promise stored at ``path``; None when there is no file. PromiseError (with the
    path in its message) when it is unreadable, PromiseDamagedError when no slot is valid,
    PromiseVersionError when newer."""
    p = Path(path)
    try:
        data = p.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as e:
        raise PromiseError(f"promise file {p}: {e}", path=str(p)) from None
    try:
        return decode_promise(data)
    except PromiseVersionError as e:
        raise PromiseVersionError(f"promise file {p}: {e}", path=str(p)) from None
    except PromiseDamagedError as e:
        raise PromiseDamagedError(f"promise file {p}: {e}", path=str(p)) from None
    except PromiseError as e:
        raise PromiseError(f"promise file {p}: {e}", path=str(p)) from None


class PromiseWriter:
    """Writes one member's promise file. Not thread-safe: one writer (the persist job's
    thread) at a time.

    Two kinds of write (docs/RAFT.md section 11):

    * ``write`` and ``write_ahead`` are durable (one ``fdatasync``). The slot they fill is the
      *anchor*: its ``promised_index`` (``ceiling``) bounds every acknowledgement until the
      next durable write. ``write_ahead`` promises ``ahead`` entries more than asked, so that
      the acknowledgements of the next rounds are covered already.
    * ``refresh`` records the exact promise (and what the store flushed) in the other slot,
      without ``fdatasync``: the page cache holds it for a restarted process, and a power cut
      leaves either that slot (written back) or, torn or lost, the anchor. It never touches
      the anchor, and only promises what the anchor covers.

    Every write goes to the slot that does not hold the anchor, so a write torn by a crash
    leaves the anchor (the last durable promise) intact. A write that changes nothing is
    skipped."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        group: str,
        node_id: str,
        current: Promise | None,
    ) -> None:
        """``current``: what ``read_promise(path)`` returned (None: no file yet)."""
        if current is not None and (current.group, current.node_id) != (group, node_id):
            raise PromiseError(
                f"promise file {path} belongs to group {current.group!r} member "
                f"{current.node_id!r}, not group {group!r} member {node_id!r}",
                path=str(path),
            )
        _name_bytes(group, "group")
        _name_bytes(node_id, "node id")
        self.path = Path(path)
        self.group = group
        self.node_id = node_id
        self._current = current
        # The highest index actually promised (what refreshes record; never goes down).
        self._exact = 0 if current is None else current.promised_index
        # The anchor: the slot of the last durable write and the index it covers. Unknown
        # until the file is opened (the newest slot, made durable then).
        self._anchor: int | None = None
        self._ceiling = 0
        self._fd: int | None = None
        self._unsynced = False  # a refresh not yet made durable
        self.writes = 0  # writes made, durable or not
        self.syncs = 0  # fdatasync calls made (creations included)

    @property
    def current(self) -> Promise | None:
        return self._current

    @property
    def promised_index(self) -> int:
        return 0 if self._current is None else self._current.promised_index

    @property
    def ceiling(self) -> int:
        """The highest index a durable write covers now (0: none since open)."""
        return self._ceiling if self._anchor is not None else 0

    def restart_from(self, promised_index: int) -> None:
        """At start: the index the node starts from (the file's promise, or the log's end
        when the log ends inside a job the promise was written ahead of); refreshes record
        exact promises from there on."""
        self._exact = promised_index

    def write(
        self, promised_index: int, hard_state: HardState, durable_index: int | None = None
    ) -> bool:
        """Make ``max(promised, promised_index)`` and ``hard_state`` durable; True when a
        write was needed. The promise never goes down. ``durable_index``: what the store
        holds durably now (None: everything promised, the promise follows the flush).
        OSError on an I/O failure (ENOSPC only when the file is created: a slot rewrite
        never allocates)."""
        promised = max(promised_index, self._exact)
        cur = self._current
        if (
            cur is not None
            and cur.promised_index == promised
            and cur.hard_state == hard_state
            and self.ceiling >= promised
        ):
            return False
        durable = promised if durable_index is None else min(durable_index, promised)
        self._durable_write(promised, promised, hard_state, durable)
        return True

    def write_ahead(
        self, promised_index: int, hard_state: HardState, durable_index: int, ahead: int
    ) -> None:
        """Make ``promised_index + ahead`` (at least) and ``hard_state`` durable, recording
        ``durable_index`` (what the store held durably before the job this promise is for):
        acknowledgements up to ``ceiling`` need no durable write after this one."""
        if ahead < 0:
            raise ValueError(f"ahead {ahead} is negative")
        exact = max(promised_index, self._exact)
        self._durable_write(exact, exact + ahead, hard_state, min(durable_index, exact))

    def refresh(self, promised_index: int, hard_state: HardState, durable_index: int) -> bool:
        """Record the exact promise and ``durable_index`` (what the store flushed) without
        ``fdatasync``; True when a write was needed. Only for what ``ceiling`` covers and
        the hard state of the last write (a new hard state goes through ``write``)."""
        exact = max(promised_index, self._exact)
        cur = self._current
        if cur is None or self._anchor is None or exact > self._ceiling:
            raise ValueError(f"refresh of {exact} beyond the durable promise {self.ceiling}")
        if hard_state != cur.hard_state:
            raise ValueError("refresh with a new hard state: it must be written durably")
        durable = max(0, min(durable_index, exact))
        if (cur.promised_index, cur.durable) == (exact, durable):
            return False
        if not self.path.exists():  # removed under us: recreate it, durably
            self._durable_write(exact, exact, hard_state, durable)
            return True
        new = Promise(self.group, self.node_id, exact, hard_state, cur.sequence + 1, durable)
        self._put(encode_slot(new), 1 - self._anchor)
        self._current = new
        self._exact = exact
        self._unsynced = True
        self.writes += 1
        return True

    def sync(self) -> None:
        """Make the last refresh durable (``fdatasync``; nothing when there is none). The
        anchor stays where it is."""
        if self._unsynced and self._fd is not None:
            os.fdatasync(self._fd)
            self.syncs += 1
        self._unsynced = False

    def _durable_write(
        self, exact: int, promised: int, hard_state: HardState, durable: int
    ) -> None:
        """One slot promising ``promised`` (``exact`` is what was asked), durably: it
        becomes the anchor."""
        cur = self._current
        seq = 1 if cur is None else cur.sequence + 1
        new = Promise(self.group, self.node_id, promised, hard_state, seq, max(durable, 0))
        slot = encode_slot(new)
        if cur is None or not self.path.exists():
            self._create(slot, seq)
            at = seq % SLOT_COUNT
        else:
            self._open()
            assert self._anchor is not None
            at = 1 - self._anchor
            self._put(slot, at)
            assert self._fd is not None
            os.fdatasync(self._fd)
        self.syncs += 1
        self._anchor = at
        self._ceiling = promised
        self._current = new
        self._exact = exact
        self._unsynced = False
        self.writes += 1

    def _put(self, slot: bytes, at: int) -> None:
        fd = self._open()
        view = memoryview(slot)
        offset = at * SLOT_BYTES
        while view:
            view = view[os.pwrite(fd, view, offset + SLOT_BYTES - len(view)) :]

    def _open(self) -> int:
        """The open file. Opened by this writer for the first time, the anchor is its newest
        valid slot, made durable here (a restarted process may find its last writes in the
        page cache only); reopened after ``_create``, the anchor is the slot it wrote."""
        if self._fd is None:
            fd = os.open(self.path, os.O_RDWR)
            try:
                if os.fstat(fd).st_size != FILE_BYTES:
                    raise OSError(errno.EIO, f"promise file {self.path} changed size")
                if self._anchor is None:
                    anchor = _newest_slot(os.pread(fd, FILE_BYTES, 0))
                    os.fdatasync(fd)
                    self.syncs += 1
                    self._anchor = anchor
                    self._ceiling = 0 if self._current is None else self._current.promised_index
            except BaseException:
                os.close(fd)
                raise
            self._fd = fd
        return self._fd

    def _create(self, slot: bytes, seq: int) -> None:
        """The first write (or the file vanished): the whole file, this slot at its place
        (``seq % SLOT_COUNT``) and the others empty, atomically: a temporary file, fsync,
        rename and a directory fsync."""
        self.close()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(self.path.name + ".tmp")
        at = (seq % SLOT_COUNT) * SLOT_BYTES
        data = bytes(at) + slot + bytes(FILE_BYTES - at - SLOT_BYTES)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, self.path)
        dfd = os.open(self.path.parent, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)

    def close(self) -> None:
        """Make the last refresh durable and close the file (a later write opens it anew and
        takes its newest slot as the anchor)."""
        if self._fd is not None:
            try:
                self.sync()
            finally:
                os.close(self._fd)
                self._fd = None
        self._anchor = None


def _newest_slot(data: bytes) -> int:
    """The position of the valid slot with the highest sequence (0 when none is valid: the
    first durable write then goes to the other one)."""
    best, best_seq = 0, -1
    for i in range(SLOT_COUNT):
        try:
            p = decode_slot(data[i * SLOT_BYTES : (i + 1) * SLOT_BYTES])
        except PromiseError:
            continue
        if p is not None and p.sequence > best_seq:
            best, best_seq = i, p.sequence
    return best
