"""Byte formats of the DLedger log store: entries, blank records, index records, checkpoint
and hard state.

Everything is big-endian. ``docs/FORMAT.md`` documents every byte; this module is the
reference implementation and is usable standalone (stdlib + ``crc32c`` only, plus the
``HardState`` value type): a reader of segment files needs nothing else.

The functions here are pure: they never touch files. Errors are :class:`RecordError`
(a ``ValueError`` carrying the byte offset of the bad record); the store turns them into
:class:`dledger.log.CorruptLogError` with the file path.
"""

from __future__ import annotations

import enum
import struct
from collections.abc import Iterator
from dataclasses import dataclass

import crc32c as _crc32c

from dledger import features
from dledger.chain import CHAIN_ORIGIN, CHAIN_UNKNOWN
from dledger.log import ENTRY_TYPE_MAX, DLedgerError, Entry, FormatTooNewError, HardState
from mqerrors import codes as E
from mqrelease import BASELINE_LEVEL, too_new_message

crc32c = _crc32c.crc32c

# ---------------------------------------------------------------------------------------
# Entry record: 48-byte header, then the body.
# ---------------------------------------------------------------------------------------

ENTRY_MAGIC = 0x444C4531  # b"DLE1"
ENTRY_MAGIC_BYTES = struct.pack(">I", ENTRY_MAGIC)
FORMAT_VERSION = 1
ENTRY_HEADER_SIZE = 48
# magic, total_size, index, term, position, type, version, reserved, body_size, body_crc
HEADER_NO_CRC = struct.Struct(">IIQQQBBHII")
HEADER_CRC_OFFSET = 44
U32 = struct.Struct(">I")
HEADER = struct.Struct(">IIQQQBBHIII")
assert HEADER_NO_CRC.size == HEADER_CRC_OFFSET
assert HEADER.size == ENTRY_HEADER_SIZE

# Largest body one entry may carry. 64 MiB is far above any batch the broker builds (its
# maxMessageSize is 4 MiB) and keeps one entry well below the default 1 GiB segment; the
# store lowers it further to fit a small segment (an entry never straddles two files).
MAX_ENTRY_BODY_BYTES = 64 * 1024 * 1024

# ---------------------------------------------------------------------------------------
# Blank record: fills the end of a segment that cannot hold the next entry.
# ---------------------------------------------------------------------------------------

BLANK_MAGIC = 0x424C4E4B  # b"BLNK"
BLANK_MAGIC_BYTES = struct.pack(">I", BLANK_MAGIC)
BLANK_SIZE = 20
# magic, length (bytes from the blank's first byte to the end of the segment), position
BLANK_NO_CRC = struct.Struct(">IIQ")
BLANK = struct.Struct(">IIQI")
assert BLANK.size == BLANK_SIZE

# ---------------------------------------------------------------------------------------
# Index record: entry i lives at byte i * INDEX_RECORD_SIZE of the (segmented) index space.
# ---------------------------------------------------------------------------------------

# Format 2 (this release): 64 bytes, with the entry's chained checksum (dledger.chain). A
# power of two, so that any index segment size that is a multiple of the page size holds
# whole records; the 27 reserved bytes keep room for what a later format adds per entry.
INDEX_MAGIC = 0x49445832  # b"IDX2"
# Format 1 (the release before chains): 32-byte records with magic b"IDX1". The index is
# derived data: a store of format 1 has its index rebuilt from the data segments on open.
INDEX_MAGIC_V1 = 0x49445831  # b"IDX1"
INDEX_RECORD_SIZE = 64
# magic, total entry size, position, term, chain, type, 27 zero bytes
INDEX_NO_CRC = struct.Struct(">IIQQQB27x")
INDEX_CRC_OFFSET = 60
INDEX_RECORD = struct.Struct(">IIQQQB27xI")
assert INDEX_NO_CRC.size == INDEX_CRC_OFFSET
assert INDEX_RECORD.size == INDEX_RECORD_SIZE

# ---------------------------------------------------------------------------------------
# Checkpoint and hard state files.
# ---------------------------------------------------------------------------------------

CHECKPOINT_MAGIC = 0x434B5054  # b"CKPT"
# The checkpoint's version is the store's format (docs/FORMAT.md "Checkpoint"):
# - format 3 (80 bytes) adds feature_level, the group's feature level this store was written
#   at. It is written only once that level is 2 or more (dledger.features), so a release
#   before feature levels (0.2.0 reads formats 1 and 2) refuses a store of a raised group;
# - format 2 (76 bytes) adds base_chain (the chain value at base_index) and marks a store whose
#   index records carry chains; it is what a group at level 1 writes, as 0.2.0 did;
# - format 1 (68 bytes, 0.1.0) is read and migrated on open (the index is rebuilt).
# A later format is refused (FormatTooNewError).
CHECKPOINT_VERSION = 3
CHECKPOINT_VERSION_V2 = 2
CHECKPOINT_VERSION_V1 = 1
CHECKPOINT_HEAD = struct.Struct(">IH")  # magic, version: read first to pick the layout
# magic, version, reserved, flushed_position, flushed_index, commit_index, applied_index,
# base_index, base_term, truncate_pending_position, base_chain, feature_level
CHECKPOINT_NO_CRC = struct.Struct(">IHHQQQQQQQQI")
CHECKPOINT_SIZE = CHECKPOINT_NO_CRC.size + 4
# Format 2: the same without feature_level.
CHECKPOINT_NO_CRC_V2 = struct.Struct(">IHHQQQQQQQQ")
CHECKPOINT_SIZE_V2 = CHECKPOINT_NO_CRC_V2.size + 4
# Format 1: the same without base_chain.
CHECKPOINT_NO_CRC_V1 = struct.Struct(">IHHQQQQQQQ")
CHECKPOINT_SIZE_V1 = CHECKPOINT_NO_CRC_V1.size + 4
NO_TRUNCATE_PENDING = 0xFFFF_FFFF_FFFF_FFFF
assert CHECKPOINT_SIZE == 80 and CHECKPOINT_SIZE_V2 == 76 and CHECKPOINT_SIZE_V1 == 68
_CHECKPOINT_LAYOUTS = {
    CHECKPOINT_VERSION: (CHECKPOINT_NO_CRC, CHECKPOINT_SIZE),
    CHECKPOINT_VERSION_V2: (CHECKPOINT_NO_CRC_V2, CHECKPOINT_SIZE_V2),
    CHECKPOINT_VERSION_V1: (CHECKPOINT_NO_CRC_V1, CHECKPOINT_SIZE_V1),
}

HARD_STATE_MAGIC = 0x48415244  # b"HARD"
# magic, version, voted_for length (0xFFFF = no vote), term
HARD_STATE_HEAD = struct.Struct(">IHHQ")
NO_VOTE = 0xFFFF
# A member id is a short name ("n0"); 1 KiB bounds the file and rejects garbage early.
MAX_VOTED_FOR_BYTES = 1024


class RecordError(DLedgerError, ValueError):
    """A record fails a check. ``offset`` is relative to the buffer given to the decoder.
    (Also a ValueError, as it was before the hierarchy: decoders' callers catch that.)"""

    code = E.BAD_RECORD

    def __init__(self, reason: str, offset: int) -> None:
        super().__init__(f"{reason} at offset {offset}")
        self.reason = reason
        self.offset = offset


@dataclass(frozen=True, slots=True)
class EntryHeader:
    total_size: int
    index: int
    term: int
    position: int
    type: int
    version: int
    body_size: int
    body_crc: int
    header_crc: int


@dataclass(frozen=True, slots=True)
class IndexRecord:
    size: int
    position: int
    term: int
    type: int
    chain: int  # dledger.chain value at this index


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """Durable progress markers of one store (see docs/FORMAT.md, "Checkpoint")."""

    flushed_position: int = 0  # every entry ending at or below this position is durable
    flushed_index: int = 0  # the last entry ending at or below ``flushed_position``
    commit_index: int = 0  # written by the server; the store never interprets it
    applied_index: int = 0  # written by the server; the store never interprets it
    base_index: int = 0  # last index deleted by delete_prefix (0: nothing deleted)
    base_term: int = 0  # term of ``base_index``
    truncate_pending_position: int = NO_TRUNCATE_PENDING  # set while truncate_suffix runs
    # dledger.chain value at ``base_index`` (CHAIN_ORIGIN for 0; CHAIN_UNKNOWN when a store
    # of format 1 had already deleted a prefix: that value cannot be rebuilt)
    base_chain: int = CHAIN_ORIGIN
    # the group's feature level the store was written at (written as format 3 from level 2;
    # formats 1 and 2 read as BASELINE_LEVEL)
    feature_level: int = BASELINE_LEVEL
    # the format the checkpoint was read in (CHECKPOINT_VERSION_V1: migrate the store)
    version: int = CHECKPOINT_VERSION_V2


def _check_u(value: int, bits: int, name: str) -> None:
    if not 0 <= value < (1 << bits):
        raise ValueError(f"{name}={value} does not fit in u{bits}")


# ---------------------------------------------------------------------------------------
# Entries
# ---------------------------------------------------------------------------------------


def encoded_size(body_len: int) -> int:
    return ENTRY_HEADER_SIZE + body_len


def encode_entry_into(
    buf: bytearray | memoryview | object,
    offset: int,
    *,
    index: int,
    term: int,
    position: int,
    body: bytes | bytearray | memoryview,
    type: int = 0,
) -> int:
    """Write one entry at ``buf[offset:]`` (body first, header last) and return its size."""
    n = len(body)
    if n > MAX_ENTRY_BODY_BYTES:
        raise ValueError(f"body of {n} bytes exceeds MAX_ENTRY_BODY_BYTES")
    _check_u(index, 64, "index")
    _check_u(term, 64, "term")
    _check_u(position, 64, "position")
    if not 0 <= type <= ENTRY_TYPE_MAX:
        raise ValueError(f"type={type} out of range 0..{ENTRY_TYPE_MAX}")
    total = ENTRY_HEADER_SIZE + n
    mv = memoryview(buf)  # type: ignore[arg-type]
    mv[offset + ENTRY_HEADER_SIZE : offset + total] = body
    head = HEADER_NO_CRC.pack(
        ENTRY_MAGIC, total, index, term, position, type, FORMAT_VERSION, 0, n, crc32c(body)
    )
    mv[offset : offset + HEADER_CRC_OFFSET] = head
    U32.pack_into(mv, offset + HEADER_CRC_OFFSET, crc32c(head))
    return total


def encode_entry(*, index: int, term: int, position: int, body: bytes, type: int = 0) -> bytes:
    """One encoded entry (header + body) as bytes."""
    out = bytearray(ENTRY_HEADER_SIZE + len(body))
    encode_entry_into(out, 0, index=index, term=term, position=position, body=body, type=type)
    return bytes(out)


def decode_header(buf: bytes | bytearray | memoryview | object, offset: int = 0) -> EntryHeader:
    """Decode and check one entry header (magic, header CRC, sizes). The body is not read."""
    mv = memoryview(buf)  # type: ignore[arg-type]
    if len(mv) - offset < ENTRY_HEADER_SIZE:
        raise RecordError("truncated entry header", offset)
    (magic, total, index, term, position, typ, version, _res, body_size, body_crc, hcrc) = (
        HEADER.unpack_from(mv, offset)
    )
    if magic != ENTRY_MAGIC:
        raise RecordError(f"bad entry magic 0x{magic:08x}", offset)
    if crc32c(mv[offset : offset + HEADER_CRC_OFFSET]) != hcrc:
        raise RecordError("entry header CRC mismatch", offset)
    if version != FORMAT_VERSION:
        raise RecordError(f"unknown entry format version {version}", offset)
    if total != ENTRY_HEADER_SIZE + body_size or body_size > MAX_ENTRY_BODY_BYTES:
        raise RecordError(f"inconsistent entry sizes total={total} body={body_size}", offset)
    return EntryHeader(total, index, term, position, typ, version, body_size, body_crc, hcrc)


def verify_entry(
    buf: bytes | bytearray | memoryview | object,
    offset: int = 0,
    *,
    expected_position: int | None = None,
) -> EntryHeader:
    """Check a whole entry (header and body CRC); return its header or raise RecordError."""
    mv = memoryview(buf)  # type: ignore[arg-type]
    h = decode_header(mv, offset)
    if expected_position is not None and h.position != expected_position:
        raise RecordError(
            f"entry position field {h.position} != actual position {expected_position}", offset
        )
    end = offset + h.total_size
    if end > len(mv):
        raise RecordError("entry body runs past the end of the buffer", offset)
    if crc32c(mv[offset + ENTRY_HEADER_SIZE : end]) != h.body_crc:
        raise RecordError("entry body CRC mismatch", offset)
    return h


# ---------------------------------------------------------------------------------------
# Blank records
# ---------------------------------------------------------------------------------------


def encode_blank(*, position: int, length: int) -> bytes:
    """A blank record that fills ``length`` bytes (>= BLANK_SIZE) up to the segment end."""
    if length < BLANK_SIZE:
        raise ValueError(f"blank length {length} < BLANK_SIZE")
    head = BLANK_NO_CRC.pack(BLANK_MAGIC, length, position)
    return head + U32.pack(crc32c(head))


def decode_blank(buf: bytes | bytearray | memoryview | object, offset: int = 0) -> tuple[int, int]:
    """Check a blank record; return ``(length, position)``."""
    mv = memoryview(buf)  # type: ignore[arg-type]
    if len(mv) - offset < BLANK_SIZE:
        raise RecordError("truncated blank record", offset)
    magic, length, position, crc = BLANK.unpack_from(mv, offset)
    if magic != BLANK_MAGIC:
        raise RecordError(f"bad blank magic 0x{magic:08x}", offset)
    if crc32c(mv[offset : offset + BLANK_SIZE - 4]) != crc:
        raise RecordError("blank record CRC mismatch", offset)
    return length, position


# ---------------------------------------------------------------------------------------
# Segment scanning
# ---------------------------------------------------------------------------------------


class ItemKind(enum.Enum):
    ENTRY = "entry"  # a valid entry
    BLANK = "blank"  # a valid blank record; the segment ends here
    PADDING = "padding"  # fewer than BLANK_SIZE bytes remain; the segment ends here
    END = "end"  # zero magic: no more data in this segment
    CORRUPT = "corrupt"  # a record fails a check; iteration stops


@dataclass(frozen=True, slots=True)
class ScanItem:
    kind: ItemKind
    position: int  # absolute data position of the item
    offset: int  # byte offset inside the segment buffer
    size: int  # bytes the item occupies (0 for END / CORRUPT)
    header: EntryHeader | None = None
    reason: str = ""


def iter_segment(
    buf: bytes | bytearray | memoryview | object,
    base_position: int,
    *,
    start_offset: int = 0,
    verify_body: bool = True,
) -> Iterator[ScanItem]:
    """Walk the records of one segment file whose first byte is at ``base_position``.

    Yields ENTRY items, then exactly one terminal item (BLANK, PADDING, END or CORRUPT).
    A segment file ``buf`` is the whole file (its length is the segment capacity).
    """
    mv = memoryview(buf)  # type: ignore[arg-type]
    size = len(mv)
    off = start_offset
    while True:
        remaining = size - off
        if remaining < BLANK_SIZE:
            yield ScanItem(ItemKind.PADDING, base_position + off, off, remaining)
            return
        (magic,) = U32.unpack_from(mv, off)
        if magic == 0:
            yield ScanItem(ItemKind.END, base_position + off, off, 0)
            return
        if magic == BLANK_MAGIC:
            try:
                length, position = decode_blank(mv, off)
            except RecordError as e:
                yield ScanItem(ItemKind.CORRUPT, base_position + off, off, 0, reason=e.reason)
                return
            if length != remaining or position != base_position + off:
                yield ScanItem(
                    ItemKind.CORRUPT,
                    base_position + off,
                    off,
                    0,
                    reason=f"blank record length={length} position={position} do not match "
                    f"its place (remaining={remaining})",
                )
                return
            yield ScanItem(ItemKind.BLANK, base_position + off, off, remaining)
            return
        try:
            if verify_body:
                h = verify_entry(mv, off, expected_position=base_position + off)
            else:
                h = decode_header(mv, off)
                if h.position != base_position + off or off + h.total_size > size:
                    raise RecordError("entry position or size does not match its place", off)
        except RecordError as e:
            yield ScanItem(ItemKind.CORRUPT, base_position + off, off, 0, reason=e.reason)
            return
        yield ScanItem(ItemKind.ENTRY, base_position + off, off, h.total_size, header=h)
        off += h.total_size


def find_valid_entry(
    buf: bytes | bytearray | memoryview | object,
    base_position: int,
    start_offset: int,
    end_offset: int | None = None,
) -> int:
    """Offset of the first fully valid entry starting in ``[start_offset, end_offset)``,
    found by searching for the entry magic at every byte, or -1. Used by recovery to tell a
    torn tail (nothing valid follows) from corruption in the middle of the log."""
    mv = memoryview(buf)  # type: ignore[arg-type]
    finder = getattr(buf, "find", None)  # bytes, bytearray and mmap search at C speed
    if finder is None:
        finder = bytes(mv).find
    off = start_offset
    stop = len(mv) if end_offset is None else min(len(mv), end_offset + len(ENTRY_MAGIC_BYTES) - 1)
    while True:
        off = finder(ENTRY_MAGIC_BYTES, off, stop)
        if off < 0:
            return -1
        try:
            verify_entry(mv, off, expected_position=base_position + off)
            return off
        except RecordError:
            off += 1


def iter_entries(buf: bytes | bytearray | memoryview) -> Iterator[Entry]:
    """Decode a run of encoded entries (as returned by the store's ``read_raw``), checking
    both CRCs of each. Positions are not checked: the run may come from another member."""
    mv = memoryview(buf)
    off = 0
    while off < len(mv):
        h = verify_entry(mv, off)
        body = bytes(mv[off + ENTRY_HEADER_SIZE : off + h.total_size])
        yield Entry(term=h.term, index=h.index, body=body, type=h.type)
        off += h.total_size


# ---------------------------------------------------------------------------------------
# Index records
# ---------------------------------------------------------------------------------------


def encode_index_record(*, size: int, position: int, term: int, type: int, chain: int) -> bytes:
    head = INDEX_NO_CRC.pack(INDEX_MAGIC, size, position, term, chain, type)
    return head + U32.pack(crc32c(head))


def decode_index_record(buf: bytes | bytearray | memoryview | object, offset: int) -> IndexRecord:
    mv = memoryview(buf)  # type: ignore[arg-type]
    magic, size, position, term, chain, typ, crc = INDEX_RECORD.unpack_from(mv, offset)
    if magic != INDEX_MAGIC:
        raise RecordError(f"bad index record magic 0x{magic:08x}", offset)
    if crc32c(mv[offset : offset + INDEX_CRC_OFFSET]) != crc:
        raise RecordError("index record CRC mismatch", offset)
    return IndexRecord(size, position, term, typ, chain)


# ---------------------------------------------------------------------------------------
# Checkpoint and hard state
# ---------------------------------------------------------------------------------------


def encode_checkpoint(c: Checkpoint) -> bytes:
    """The checkpoint in the format its feature level calls for (dledger.features): format 2,
    byte for byte what 0.2.0 writes, at the baseline level; format 3 from level 2."""
    version = checkpoint_version(c.feature_level)
    fields = (
        c.flushed_position,
        c.flushed_index,
        c.commit_index,
        c.applied_index,
        c.base_index,
        c.base_term,
        c.truncate_pending_position,
        c.base_chain,
    )
    if version == CHECKPOINT_VERSION:
        _check_u(c.feature_level, 32, "feature_level")
        head = CHECKPOINT_NO_CRC.pack(CHECKPOINT_MAGIC, version, 0, *fields, c.feature_level)
    else:
        head = CHECKPOINT_NO_CRC_V2.pack(CHECKPOINT_MAGIC, version, 0, *fields)
    return head + U32.pack(crc32c(head))


def decode_checkpoint(data: bytes, path: str = "checkpoint") -> Checkpoint:
    """A checkpoint of format 3, 2 or 1 (``version`` says which; a format 1 base_chain is
    CHAIN_ORIGIN when nothing was deleted, else CHAIN_UNKNOWN; formats 1 and 2 are at the
    baseline feature level). A later format is refused with FormatTooNewError naming ``path``
    and both versions (the checkpoint's version is the store's format: docs/FORMAT.md);
    version 0 is damage (RecordError), and so is a format 3 feature level below 2 (format 3
    is only written from level 2)."""
    if len(data) < CHECKPOINT_HEAD.size:
        raise RecordError(f"checkpoint is only {len(data)} bytes", 0)
    magic, version = CHECKPOINT_HEAD.unpack_from(data, 0)
    if magic != CHECKPOINT_MAGIC:
        raise RecordError(f"bad checkpoint magic 0x{magic:08x}", 0)
    _refuse_newer("checkpoint", path, version, CHECKPOINT_VERSION, data)
    if version not in _CHECKPOINT_LAYOUTS:
        raise RecordError(f"checkpoint format version {version} does not exist", 4)
    layout, size = _CHECKPOINT_LAYOUTS[version]
    if len(data) != size:
        raise RecordError(f"checkpoint v{version} is {len(data)} bytes, expected {size}", 0)
    (crc,) = U32.unpack_from(data, size - 4)
    if crc32c(data[: size - 4]) != crc:
        raise RecordError("checkpoint CRC mismatch", size - 4)
    f = layout.unpack_from(data, 0)[3:]
    if version == CHECKPOINT_VERSION_V1:
        base_chain = CHAIN_ORIGIN if f[4] == 0 else CHAIN_UNKNOWN
    else:
        base_chain = f[7]
    level = f[8] if version == CHECKPOINT_VERSION else BASELINE_LEVEL
    if checkpoint_version(level) != max(version, CHECKPOINT_VERSION_V2):
        raise RecordError(f"checkpoint v{version} with feature level {level}", size - 8)
    return Checkpoint(
        flushed_position=f[0],
        flushed_index=f[1],
        commit_index=f[2],
        applied_index=f[3],
        base_index=f[4],
        base_term=f[5],
        truncate_pending_position=f[6],
        base_chain=base_chain,
        feature_level=level,
        version=version,
    )


def checkpoint_version(feature_level: int) -> int:
    """The checkpoint format a store at ``feature_level`` writes (dledger.features)."""
    return (
        CHECKPOINT_VERSION
        if feature_level >= features.CHECKPOINT_V3_LEVEL
        else CHECKPOINT_VERSION_V2
    )


def _refuse_newer(what: str, path: str, found: int, newest: int, data: bytes) -> None:
    """FormatTooNewError when ``found`` is above ``newest``, the newest this release reads,
    and ``data`` is whole: every version of the checkpoint and of ``meta`` ends with the
    CRC32C of all the bytes before it (docs/FORMAT.md, "Format versions"), so a newer
    release's file checks out under any layout, while a flipped bit in the version field
    does not: that is damage (RecordError), repaired as any other, never a reason to stop."""
    if found <= newest:
        return
    if len(data) < 4 or crc32c(data[:-4]) != U32.unpack_from(data, len(data) - 4)[0]:
        raise RecordError(f"{what} version {found} with a CRC mismatch: damage", 4)
    message = too_new_message(what, path, found, newest)
    raise FormatTooNewError(message, path=path, found=found, newest=newest)


def encode_hard_state(s: HardState) -> bytes:
    _check_u(s.term, 64, "term")
    voted = b"" if s.voted_for is None else s.voted_for.encode("utf-8")
    if len(voted) > MAX_VOTED_FOR_BYTES:
        raise ValueError(f"voted_for is {len(voted)} bytes > MAX_VOTED_FOR_BYTES")
    vlen = NO_VOTE if s.voted_for is None else len(voted)
    head = HARD_STATE_HEAD.pack(HARD_STATE_MAGIC, FORMAT_VERSION, vlen, s.term) + voted
    return head + U32.pack(crc32c(head))


def decode_hard_state(data: bytes, path: str = "meta") -> HardState:
    """The hard state in ``data`` (the ``meta`` file at ``path``). A whole file (its last four
    bytes the CRC32C of the rest) of a version above this release's is FormatTooNewError,
    checked before this version's length rule: a newer layout is not damage, so the copy in
    the promise file must not replace it (dledger.server.promises)."""
    if len(data) < HARD_STATE_HEAD.size + 4:
        raise RecordError(f"hard state is only {len(data)} bytes", 0)
    magic, version, vlen, term = HARD_STATE_HEAD.unpack_from(data, 0)
    if magic != HARD_STATE_MAGIC:
        raise RecordError(f"bad hard state magic 0x{magic:08x}", 0)
    _refuse_newer("hard state", path, version, FORMAT_VERSION, data)
    nvoted = 0 if vlen == NO_VOTE else vlen
    if nvoted > MAX_VOTED_FOR_BYTES or len(data) != HARD_STATE_HEAD.size + nvoted + 4:
        raise RecordError("hard state length does not match its voted_for length", 6)
    (crc,) = U32.unpack_from(data, len(data) - 4)
    if crc32c(data[:-4]) != crc:
        raise RecordError("hard state CRC mismatch", len(data) - 4)
    if version != FORMAT_VERSION:
        raise RecordError(f"unknown hard state version {version}", 4)
    start = HARD_STATE_HEAD.size
    voted = None if vlen == NO_VOTE else data[start : start + nvoted].decode("utf-8")
    return HardState(term=term, voted_for=voted)
