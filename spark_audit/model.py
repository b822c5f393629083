"""Values shared by the driver and the tasks: the plan of an audit, findings, output rows."""

from __future__ import annotations

import enum
import struct
from dataclasses import dataclass

from dledger.storage.codec import INDEX_RECORD_SIZE, crc32c
from mqrelease import BASELINE_LEVEL
from spark_audit.merkle import LEAF_ENTRIES

U64_MASK = (1 << 64) - 1
# Entry identity compared across replicas: term, type, body size and body CRC (positions are
# left out: they depend on the segment size, which replicas may not share).
CONTENT_KEY = struct.Struct(">QBII")
# What the order-dependent checksum runs over, per entry in index order: index, term, type,
# body size, body CRC (25 bytes).
ORDERED_KEY = struct.Struct(">QQBII")
ORDERED_KEY_BYTES = ORDERED_KEY.size


def entry_digest(term: int, type_: int, body_size: int, body_crc: int) -> int:
    """64-bit digest of an entry's content: CRC32C of its content key, then its body CRC."""
    return (crc32c(CONTENT_KEY.pack(term, type_, body_size, body_crc)) << 32) | body_crc


def to_i64(value: int) -> int:
    """A u64 as the signed 64-bit integer Spark and Parquet store (two's complement)."""
    value &= U64_MASK
    return value - (1 << 64) if value >= 1 << 63 else value


def to_u64(value: int) -> int:
    return value & U64_MASK


class Severity(enum.Enum):
    ERROR = "error"  # exit code 1
    INFO = "info"  # reported, not a failure


class What(enum.Enum):
    """Kinds of findings. Errors make the audit fail (exit 1); the rest are information."""

    CORRUPT_ENTRY = "corrupt_entry"  # a committed record fails a check (header, CRC, sequence)
    MISSING_ENTRIES = "missing_entries"  # committed indexes the replica claims but lacks
    INDEX_MISMATCH = "index_mismatch"  # the index file disagrees with the data file
    DIVERGENT_ENTRY = "divergent_entry"  # a committed entry differs from the other replicas
    SHORT_SEGMENT = "short_segment"  # a data segment file is shorter than the segment size
    MISSING_SEGMENT = "missing_segment"  # a data segment file is missing between two others
    BAD_CHECKPOINT = "bad_checkpoint"  # the checkpoint file fails its checks
    BEHIND = "behind"  # info: indexes above the replica's own commit index not there yet
    TAIL_CORRUPT = "tail_corrupt"  # info: a torn/corrupt record above the audited index
    TAIL_INDEX_MISMATCH = "tail_index_mismatch"  # info: index disagreement above it
    UNCOMMITTED_TAIL = "uncommitted_tail"  # info: replicas differ above the audited index
    UNEXPECTED_FILE = "unexpected_file"  # info: a file the store would not write
    DAMAGED_RANGE = "damaged_range"  # a leaf range where the replica disagrees with the majority
    ROLLED_BACK = "rolled_back"  # the log ends below the index the node promised (acknowledged)
    CQ_MISMATCH = "cq_mismatch"  # a ConsumeQueue record that does not match the commitlog
    KEY_INDEX_MISMATCH = "key_index_mismatch"  # a key index record or header that does not
    BAD_PROMISE = "bad_promise"  # the promise file beside the store fails its checks
    NOT_A_MEMBER = "not_a_member"  # info: a store of an id the group no longer has: not audited
    # info: a member whose release supports less than the group's feature level (the leader
    # sends it no entries), or, offline, whose store has not reached that level
    BELOW_FEATURE_LEVEL = "below_feature_level"


ERRORS = frozenset(
    {
        What.CORRUPT_ENTRY,
        What.MISSING_ENTRIES,
        What.INDEX_MISMATCH,
        What.DIVERGENT_ENTRY,
        What.SHORT_SEGMENT,
        What.MISSING_SEGMENT,
        What.BAD_CHECKPOINT,
        What.DAMAGED_RANGE,
        What.ROLLED_BACK,
        What.CQ_MISMATCH,
        What.KEY_INDEX_MISMATCH,
        What.BAD_PROMISE,
    }
)


def severity_of(what: What) -> Severity:
    return Severity.ERROR if what in ERRORS else Severity.INFO


@dataclass(frozen=True, slots=True)
class Finding:
    what: What
    group: str
    replica: str
    file: str = ""  # segment or index file name (20 digits), or another file of the store
    path: str = ""  # full path or URI of that file
    index: int = 0  # first Raft index concerned (0: none)
    index_end: int = 0  # last Raft index concerned, inclusive (-1: open-ended)
    offset: int = -1  # byte offset inside ``file`` (-1: not applicable)
    detail: str = ""
    peer: str = ""  # the replica compared with, for divergences
    count: int = 0  # entries concerned

    @property
    def severity(self) -> Severity:
        return severity_of(self.what)


@dataclass(frozen=True, slots=True)
class SegmentFile:
    name: str
    uri: str
    start: int  # absolute data position of its first byte (from the name)
    size_bytes: int  # size of the file on disk
    first_index: int  # index of its first entry, 0 when it has none or it is unreadable


@dataclass(frozen=True, slots=True)
class IndexFile:
    name: str
    uri: str
    start: int  # byte of the index space where it starts
    size_bytes: int


@dataclass(frozen=True, slots=True)
class ReplicaPlan:
    group: str
    replica: str
    root: str
    segment_size_bytes: int
    index_segment_size_bytes: int
    segments: tuple[SegmentFile, ...]
    index_files: tuple[IndexFile, ...]
    first_index: int  # base_index + 1 from the checkpoint
    commit_index: int  # the commit index this replica claims (checkpoint or Metadata RPC)
    commit_known: bool  # False when its checkpoint could not be read
    est_last_index: int  # last index per the index files (an estimate for planning)
    est_end_position: int  # data position after it
    derived: bool = False  # a broker's ConsumeQueues or key index lie beside the store
    promised_index: int = 0  # the highest index the node acknowledged (its promise file)
    promise_uri: str = ""  # the promise file read ("": none beside the store)
    # The group feature level this store reached (its checkpoint's and its saved committed
    # configuration's, the higher; docs/RAFT.md section 14), and the highest its node's release
    # supports, from a running node's Metadata (0: not known, the store does not record it).
    feature_level: int = BASELINE_LEVEL
    supported_feature_level: int = 0
    release: str = ""  # the release a running node reported ("": not asked)

    def segment_at(self, position: int) -> int:
        """Position in ``segments`` of the file holding data ``position``, or -1."""
        start = position - position % self.segment_size_bytes
        lo, hi = 0, len(self.segments)
        while lo < hi:
            mid = (lo + hi) // 2
            if self.segments[mid].start < start:
                lo = mid + 1
            else:
                hi = mid
        if lo < len(self.segments) and self.segments[lo].start == start:
            return lo
        return -1

    def index_file_for(self, index: int) -> IndexFile | None:
        byte = index * INDEX_RECORD_SIZE
        start = byte - byte % self.index_segment_size_bytes
        for f in self.index_files:
            if f.start == start:
                return f
        return None


@dataclass(frozen=True, slots=True)
class GroupPlan:
    group: str
    replicas: tuple[ReplicaPlan, ...]
    audited_index: int  # the audited commit index: entries up to it must agree
    audited_from: str  # where it came from: "checkpoints", "metadata" or "--upto"
    first_index: int  # lowest first index over the replicas
    findings: tuple[Finding, ...] = ()
    leaf_entries: int = LEAF_ENTRIES  # Raft indexes per leaf of the range digests
    feature_level: int = BASELINE_LEVEL  # the highest any member's store reached


# What a task does: scan an index range of every replica, or check one replica's derived
# state (ConsumeQueues, key index) against its log.
TASK_LOG = "log"
TASK_DERIVED = "derived"


@dataclass(frozen=True, slots=True)
class TaskSpec:
    task_id: int
    group: str
    lo: int  # first index of the range
    hi: int  # one past the last index of the range; 0: open-ended (to the end of every log)
    est_bytes: int = 0
    kind: str = TASK_LOG
    replica: str = ""  # the replica of a TASK_DERIVED task


@dataclass(slots=True)
class PartStats:
    """Checksums of the entries of one segment that one task scanned (a piece of a segment)."""

    replica: str
    file: str
    first_index: int = 0
    last_index: int = 0
    count: int = 0
    bytes: int = 0
    min_term: int = 0
    max_term: int = 0
    unordered: int = 0  # sum of entry digests mod 2^64 (order-independent)
    ordered: int = 0  # CRC32C over the ORDERED_KEY of each entry in index order
    committed: bool = True  # False for a piece above the audited index (uncommitted tail)
