"""The broker's replicated state machine: what every member builds from committed entries.

``dledger`` hands committed entries to :meth:`BrokerStateMachine.apply` in log order, exactly
once per process lifetime, on every member. Everything here is a pure function of those entries
(and of the commitlog positions ``dledger`` gives their bodies), so every member that applied
the same prefix holds the same ConsumeQueues, key index, topics, consumer offsets and dedup
window. Nothing here reads a clock: store timestamps are in the messages (the leader set them
before proposing).

The records it applies, their type numbers, codecs and rules are :mod:`broker.state.records` (docs/
FORMAT.md, "Broker: control records"). :meth:`BrokerStateMachine.apply` dispatches each entry
through :data:`APPLY_HANDLERS`, one handler per record type of
:data:`broker.state.records.RECORD_TYPES` (checked at import); the POP, transaction, subscription
group and user tables apply their own records (:mod:`broker.state.popstate`,
:mod:`broker.state.transactions`, :mod:`broker.state.subgroups`, :mod:`broker.state.auth.table`).

Restart: a snapshot of the small state (topics, offsets, dedup window, applied index, dispatch
position, each queue's max offset) is written atomically to ``{root}/config/snapshot.json``
about every second (less often when writing it takes long) and on close, after the
ConsumeQueues and the index are flushed. On open the ConsumeQueues and the index are truncated
back to the snapshot's dispatch position and :meth:`applied_index` returns its applied index,
so only later entries are applied again. When
the stores do not match the snapshot (``consumequeue/`` or ``index/`` deleted, a torn delete,
no snapshot) they are wiped and rebuilt from the whole log (:meth:`applied_index` returns 0).
"""

from __future__ import annotations

import base64
import concurrent.futures
import contextlib
import json
import logging
import os
import shutil
import struct
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from broker.state import brokerconf, derived, indexfile, snapshotting, statecheck
from broker.state.auth.table import AuthTable
from broker.state.consumequeue import DEFAULT_RECORDS_PER_FILE, ConsumeQueueStore
from broker.state.dedupwindow import DedupCapture, DedupWindow, decode_dedup, encode_dedup
from broker.state.dedupwindow import SendResult as SendResult  # where the front ends import it
from broker.state.delayrules import SCHEDULE_HEADER, decode_schedule_header
from broker.state.errors import (
    BrokerError,
    ConfigError,
    CorruptStoreError,
    FormatTooNewError,
    PositionOrderError,
    QueueStoreClosedError,
)
from broker.state.indexfile import DEFAULT_HASH_SLOTS, DEFAULT_MAX_RECORDS, IndexStore
from broker.state.message import DispatchRow, batch_count, scan_dispatch
from broker.state.names import (
    SCHEDULE_TOPIC,
    TIMER_TOPIC,
    is_valid_topic_name,
)
from broker.state.popstate import PopState
from broker.state.records import (
    DEFAULT_TOPIC_MESSAGE_TYPE,
    ENTRY_AUTH,
    ENTRY_BROKER_CONFIG,
    ENTRY_MESSAGES,
    ENTRY_OFFSETS,
    ENTRY_POP,
    ENTRY_SCHEDULE,
    ENTRY_SUBGROUP,
    ENTRY_TIMER,
    ENTRY_TOPIC,
    ENTRY_TXN,
    I64_MAX,
    MAX_OFFSET_GROUPS,
    MAX_STORE_TIMESTAMP_MS,
    MAX_TOPIC_OWNER_BYTES,
    RECORD_TYPES,
    TOPIC_CREATE_IF_ABSENT,
    TOPIC_DELETE,
    TOPIC_UPSERT,
    InvalidRecordError,
    OffsetKey,
    TopicConfig,
    check_offsets,
    check_queue,
    check_topic_record,
    decode_offsets_record_owned,
    decode_topic_record,
    shown_name,
)
from broker.state.subgroups import SubGroupTable
from broker.state.timerrules import (
    HOP_RECORD_SIZE,
    MAX_TIMER_LEVELS,
    TIMER_HEADER,
    decode_hop,
    decode_timer_header,
)
from broker.state.transactions import TxnState
from dledger.appsnapshot import AppSnapshot
from dledger.core import Role
from dledger.log import APPLICATION_TYPE_MIN, DLedgerError, Entry
from dledger.rewind import RewindOutcome
from dledger.storage.files import atomic_write
from mqrelease import BASELINE_LEVEL, too_new_message

logger = logging.getLogger(__name__)


# A rejected record costs one log line; a flood of them (anyone who can append) at most this
# many lines per SKIP_LOG_WINDOW_S, then one line saying how many were not logged.
SKIP_LOG_LINES_PER_WINDOW = 20
SKIP_LOG_WINDOW_S = 10.0
# Idempotent sends: a uniq id seen within this much store time (and among the last
# DEDUP_MAX_IDS ids) is a duplicate. 10 minutes covers any client's retry schedule.
DEFAULT_DEDUP_WINDOW_MS = 10 * 60 * 1000
# Bounds memory (broker.state.dedupwindow: about 185 bytes per id) and the snapshot (44 + topic
# bytes per id).
DEFAULT_DEDUP_MAX_IDS = 100_000
# The leader's send handlers collect results of the entries they proposed from here; a
# handler runs within a few entries of its own, so 1024 entries is far more than enough.
RESULTS_KEPT = 1024
# How often the snapshot is rewritten while entries are applied (it is a few ms to write).
SNAPSHOT_INTERVAL_MS = 1000
# A snapshot holds the dedup window (up to 100,000 ids): capturing and writing it costs up to
# ~90 ms of CPU, most of it holding the GIL, so sends slow down while it runs (with a full
# window and snapshots every second, a send's p99 at 256 in flight doubled: 20-40 -> 60-100 ms
# in the 200 ms windows after each snapshot). The interval stretches to this many times the
# last capture and write (at most ~1% of a core), and to at most MAX_SNAPSHOT_INTERVAL_S (what
# a restart replays is bounded by it).
SNAPSHOT_COST_FACTOR = 100
MAX_SNAPSHOT_INTERVAL_S = 30.0
SNAPSHOT_FILE = "snapshot.json"
# 2: the dedup window in columns (1: a record per id; still read).
SNAPSHOT_VERSION = 2


_DEDUP_ITEM = struct.Struct(">16sqiqqB")  # uniq id, store ts, queue id, offset, position, tlen


@dataclass(frozen=True, slots=True)
class _Captured:
    """The small state at one applied index, for a snapshot written in the background."""

    applied: int
    dispatch_end: int
    index_max_position: int
    latest_store_ts: int
    queues: dict[str, int]
    topics: dict[str, TopicConfig]
    offsets: dict[OffsetKey, int]
    offset_owners: dict[str, str]  # the groups with an owner only
    dedup: DedupCapture
    schedule: dict[int, int]
    timer: dict[int, int]
    auth: dict[str, Any]
    pop: list[list[Any]]
    txn: dict[str, Any]
    subgroups: list[list[Any]]
    config: dict[str, str]


QueueKey = tuple[str, int]
CqRow = tuple[int, int, int]  # a ConsumeQueue row: position, size, tag hash (or a time)
KeyRow = tuple[str, Sequence[str], str, int, int]  # topic, keys, id, position, store time
# The queues an apply gave messages -> their tag hashes (what the dispatch listeners get).
Touched = dict[QueueKey, set[int]]
# Called at the end of each apply with the queues that got messages and their tag hashes.
DispatchListener = Callable[[Mapping[QueueKey, set[int]]], None]


def _refuse_newer(path: Path, data: object) -> None:
    """FormatTooNewError when the snapshot document ``data`` (read from ``path``) says a
    version above SNAPSHOT_VERSION: a newer release wrote it, so it is not a "bad snapshot" to
    rebuild from the log (that would delete the derived stores, and lose whatever the log no
    longer holds). Checked before any store is opened: the node stops with nothing changed."""
    version = data.get("version") if isinstance(data, dict) else None
    if isinstance(version, int) and version > SNAPSHOT_VERSION:
        raise FormatTooNewError(too_new_message("broker snapshot", path, version, SNAPSHOT_VERSION))


class CommitLog(Protocol):
    """What the state machine needs of ``dledger``'s store."""

    def body_position(self, index: int) -> int: ...
    def first_index(self) -> int: ...
    def last_index(self) -> int: ...
    def read(self, index: int) -> Entry: ...
    def read_at(self, position: int, size: int) -> bytes: ...


def _topic_row(t: TopicConfig) -> list[int | str]:
    """A topic in the snapshot: ``[read, write, perm]``, then the message type unless MIXED
    and there is no owner, then the owner if any."""
    row: list[int | str] = [t.read_queue_nums, t.write_queue_nums, t.perm]
    if t.owner:
        return [*row, t.message_type, t.owner]
    return row if t.message_type == DEFAULT_TOPIC_MESSAGE_TYPE else [*row, t.message_type]


def _topic_of_row(name: str, row: Sequence[Any]) -> TopicConfig:
    if not 3 <= len(row) <= 5:
        raise ValueError(f"topic row of {len(row)} items")
    kind = str(row[3]) if len(row) >= 4 else DEFAULT_TOPIC_MESSAGE_TYPE
    owner = str(row[4]) if len(row) == 5 else ""
    if len(row) == 5 and not owner:
        raise ValueError("topic row with an empty owner")
    return TopicConfig(name, int(row[0]), int(row[1]), int(row[2]), kind, owner)


def _load_offset_owners(offsets: Mapping[OffsetKey, int], rows: Any) -> dict[str, str]:
    """A snapshot's groups with offsets -> owner: every group of ``offsets``, with the owner
    its ``offset_owners`` row names when that is a string of at most MAX_TOPIC_OWNER_BYTES
    (an invalid row: reported, the group kept without an owner)."""
    rows = rows if isinstance(rows, dict) else {}
    groups: dict[str, str] = {}
    bad: list[str] = []
    for group in sorted({g for g, _, _ in offsets}):
        owner = rows.get(group, "")
        size = len(owner.encode("utf-8", "replace")) if isinstance(owner, str) else -1
        if not 0 <= size <= MAX_TOPIC_OWNER_BYTES:
            bad.append(group)
            owner = ""
        groups[group] = owner
    _report_dropped("consumer group owners", bad)
    return groups


class _SkipLog:
    """One ERROR line per skipped record, at most :data:`SKIP_LOG_LINES_PER_WINDOW` per
    :data:`SKIP_LOG_WINDOW_S` (then one line with the number left out). Logging only: what is
    skipped never depends on it."""

    def __init__(self) -> None:
        self._window_start_s = -SKIP_LOG_WINDOW_S
        self._lines = 0
        self._suppressed = 0
        self.skipped = 0  # records skipped since start (for tests and status)

    def skip(self, index: int, entry_type: int, exc: BaseException) -> None:
        self.skipped += 1
        now = time.monotonic()
        if now - self._window_start_s >= SKIP_LOG_WINDOW_S:
            if self._suppressed:
                logger.error(
                    "skipped %d more invalid records in the last %.0f s (not logged one by one)",
                    self._suppressed,
                    SKIP_LOG_WINDOW_S,
                )
            self._window_start_s, self._lines, self._suppressed = now, 0, 0
        if self._lines >= SKIP_LOG_LINES_PER_WINDOW:
            self._suppressed += 1
            return
        self._lines += 1
        code = getattr(exc, "code", type(exc).__name__)
        # Details are bounded where they are made; cut again, never a whole record.
        logger.error(
            "skip invalid record index=%d type=%d code=%s: %.300s", index, entry_type, code, exc
        )


# ------------------------------------------------------------------------- state machine


class BrokerStateMachine:
    """dledger's ``StateMachine`` for the broker. Call :meth:`attach` before the node starts,
    :meth:`close` after it stopped."""

    # The group's committed feature level (on_feature_level; broker/state/features.py).
    feature_level: int = BASELINE_LEVEL

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        dedup_window_ms: int = DEFAULT_DEDUP_WINDOW_MS,
        dedup_max_ids: int = DEFAULT_DEDUP_MAX_IDS,
        hash_slots: int = DEFAULT_HASH_SLOTS,
        max_index_records: int = DEFAULT_MAX_RECORDS,
        cq_records_per_file: int = DEFAULT_RECORDS_PER_FILE,
        snapshot_interval_ms: int = SNAPSHOT_INTERVAL_MS,
    ) -> None:
        if dedup_window_ms < 0 or dedup_max_ids < 1:
            raise ConfigError("dedup_window_ms must be >= 0 and dedup_max_ids >= 1")
        self.root = Path(root)
        self.config_dir = self.root / "config"
        snapshotting.clear_pins(self.root)  # of transfers a previous process did not finish
        self.dedup_window_ms = dedup_window_ms
        self.dedup_max_ids = dedup_max_ids
        self._hash_slots = hash_slots
        self._max_index_records = max_index_records
        self._cq_records_per_file = cq_records_per_file
        self._snapshot_interval_s = snapshot_interval_ms / 1000
        self._log: CommitLog | None = None
        self.cqs: ConsumeQueueStore
        self.index: IndexStore
        self.topics: dict[str, TopicConfig] = {}
        self.offsets: dict[OffsetKey, int] = {}
        # Every consumer group with offsets in :attr:`offsets` -> the user whose commit first
        # gave it offsets ("": nobody, or from before owners were recorded).
        self.offset_groups: dict[str, str] = {}
        self.dedup = DedupWindow()
        # Delay level -> offset in SCHEDULE_TOPIC_XXXX's queue (level - 1) delivered so far.
        self.schedule_offsets: dict[int, int] = {}
        # Timer level -> offset in TIMER_TOPIC's queue (level) moved on so far
        # (broker.state.timerrules).
        self.timer_offsets: dict[int, int] = {}
        # Users and ACL rules (ENTRY_AUTH records): what every node's call guard checks.
        self.auth = AuthTable()
        self.pop = PopState()
        self.txn = TxnState()
        self.subgroups = SubGroupTable()
        # Live broker.conf overrides (ENTRY_BROKER_CONFIG records, broker.state.brokerconf):
        # key -> value. Replaced, never changed in place, so readers can tell a change by
        # identity (broker.components.applied.NodeContext).
        self.config_overrides: dict[str, str] = {}
        self._latest_store_ts = 0
        self._applied = 0
        # The last applied index whose entry may have changed this state (a broker record
        # type, not skipped): rewind() can roll back only the entries above it.
        self._effect_index = 0
        self._dispatch_end = 0  # end of the last dispatched entry body (commitlog position)
        self._trimmed_first = 1  # the commitlog's first index when derived files were trimmed
        self._results: OrderedDict[int, list[SendResult]] = OrderedDict()
        self._listeners: list[DispatchListener] = []
        self._init_snapshots()
        self._opened = False
        self.role: Role = Role.FOLLOWER
        self.term = 0
        self.leader_id: str | None = None
        self._change_listeners: list[Callable[[], None]] = []
        self.skip_log = _SkipLog()
        # Messages the dedup window answered as duplicates (metrics), on every member alike.
        self.dedup_hits = 0
        # Applies that deleted ConsumeQueue or key index files (a topic's deletion,
        # retention's trim): a snapshot's capture lists its files in a thread after the
        # capture point, and fails when this moved meanwhile (broker.state.snapshotting).
        self.files_deleted = 0
        # What the derived-state checks found and rebuilt (broker.state.derived, raftmq_scrub_*).
        self.derived = derived.DerivedCounters()

    def _init_snapshots(self) -> None:
        """The state of the snapshot writer (config/snapshot.json), and the hook of the live
        override table (the snapshot loads the table)."""
        # Called with the table each time it changes (broker.liveconfig.LiveSettings.apply).
        self._config_hook: Callable[[Mapping[str, str]], None] | None = None
        self._last_snapshot_s = 0.0
        self._last_persist_s = 0.0  # how long the last snapshot write took (its thread sets it)
        self._last_capture_s = 0.0  # how long the last capture held the event loop
        self._snapshot_applied = -1
        self._durable_applied = 0  # the state on disk's applied index (durable_index())
        self._snapshot_pool = concurrent.futures.ThreadPoolExecutor(1, "broker-snapshot")
        self._snapshot_future: concurrent.futures.Future[None] | None = None

    def derived_mismatches(self) -> dict[str, int]:
        """Records the derived-state checks found wrong since start, by store (the node's
        Metadata answers them: mqadmin replicaStatus, dledger.server.health)."""
        return {store: self.derived.total_wrong(store) for store in derived.STORES}

    # ------------------------------------------------------------------ wiring

    def attach(self, log: CommitLog) -> None:
        """The commitlog whose committed entries this applies (a getter's result is fine:
        the store only has to be open by the time :meth:`applied_index` is called)."""
        self._log = log

    def add_listener(self, listener: DispatchListener) -> None:
        self._listeners.append(listener)

    def add_change_listener(self, listener: Callable[[], None]) -> None:
        """Called (in the applying thread) after a role/term/leader change and after a topic
        was created, updated or deleted: what the NameServers must hear about at once."""
        self._change_listeners.append(listener)

    def _changed(self) -> None:
        for listener in self._change_listeners:
            listener()

    @property
    def log(self) -> CommitLog:
        assert self._log is not None, "attach() the commitlog first"
        return self._log

    @property
    def last_applied(self) -> int:
        return self._applied

    @property
    def dispatch_end(self) -> int:
        """Commitlog positions below this belong to applied entries (visible to readers)."""
        return self._dispatch_end

    # ------------------------------------------------------------------ StateMachine

    def check_formats(self) -> None:
        """FormatTooNewError when ``config/snapshot.json`` or a key index file was written by
        a newer release (the node calls this at start, before anything is opened: reads only).
        The ConsumeQueues have no header; their format is the snapshot's."""
        path = self.config_dir / SNAPSHOT_FILE
        with contextlib.suppress(FileNotFoundError, ValueError):
            _refuse_newer(path, json.loads(path.read_bytes()))
        indexfile.check_formats(self.root / "index")

    def durable_index(self) -> int:
        """The applied index of the state on disk: a restart opens the state there and applies
        the log from the next entry, so dledger's retention must keep every entry above it
        (the applied index in memory can be far ahead on a broker that has been idle since
        its last snapshot was taken)."""
        return self._durable_applied

    def applied_index(self) -> int:
        """Open the stores (recovering or rebuilding them); the index already applied."""
        if not self._opened:
            self._open()
        return self._applied

    def rewind(self, index: int) -> RewindOutcome:
        """The node replaced the entries applied above ``index``: this member's copy differed
        by content from its leader's (docs/RAFT.md section 13). Entries that changed nothing
        here (dledger's own, or records skipped by rule) are rolled back in place. Otherwise
        the state holds what the replaced copy made (messages, offsets, topics) and nothing
        tells how to undo it: the state is marked durably for a rebuild by a replay of the
        repaired log at the next open (``config/rebuild-derived``), or, when retention
        deleted the log's first entries (a replay would lose what they made), the node is
        asked to take a snapshot from its leader instead. Either way the node restarts."""
        if index >= self._effect_index:
            self._applied = min(self._applied, index)
            self._durable_applied = min(self._durable_applied, index)
            # The saved state may claim the replaced entries: save again at the next apply.
            self._snapshot_applied = -1
            self._last_snapshot_s = float("-inf")
            return RewindOutcome.ROLLED_BACK
        first = self.log.first_index()
        if first > 1:
            logger.warning(
                "broker state cannot roll back to index %d (entries up to %d changed it) nor "
                "be replayed (the log starts at index %d): a snapshot from the leader replaces it",
                index,
                self._effect_index,
                first,
            )
            return RewindOutcome.NEEDS_SNAPSHOT
        why = (
            f"{statecheck.MARKER_PREFIX}entries {index + 1}..{self._applied} were replaced by "
            f"the leader's (a content repair, docs/RAFT.md section 13); entries up to "
            f"{self._effect_index} had changed this state"
        )
        self.config_dir.mkdir(parents=True, exist_ok=True)
        atomic_write(
            self.config_dir / derived.REBUILD_MARKER, why.encode()[: derived.MAX_MARKER_BYTES]
        )
        logger.warning("broker state marked for a replay of the log at the next open: %s", why)
        return RewindOutcome.REPLAY_AT_START

    def on_feature_level(self, level: int, index: int) -> None:
        """The group's committed feature level (at start, and when a CONFIG entry at
        ``index`` raises it): what broker/state/features.py gates proposals and file formats
        on. Apply never depends on it."""
        self.feature_level = level
        logger.info("group feature level %d (CONFIG entry %d)", level, index)

    def on_role_change(self, role: Role, term: int, leader_id: str | None) -> None:
        self.role = role
        self.term = term
        self.leader_id = leader_id
        self._changed()

    def apply(self, entries: Sequence[Entry]) -> None:
        assert self._opened, "applied_index() opens the state machine first"
        touched: Touched = {}
        for entry in entries:
            assert entry.index == self._applied + 1, (
                f"entries out of order: got {entry.index} after {self._applied}"
            )
            try:
                handler = APPLY_HANDLERS.get(entry.type)
                if handler is not None:
                    handler(self, entry, touched)
                if entry.type >= APPLICATION_TYPE_MIN:
                    self._effect_index = entry.index
            except (CorruptStoreError, QueueStoreClosedError, PositionOrderError):
                # This member's disk, not the record: skipping here alone would make the
                # members differ. The node's apply task fails, and with it the process.
                raise
            except (BrokerError, ValueError, OverflowError) as exc:
                # The record breaks a rule (checked before anything changed): the same bytes
                # and the same replicated state on every member, so every member skips it.
                self.skip_log.skip(entry.index, entry.type, exc)
            self._applied = entry.index
        if touched:
            for listener in self._listeners:
                listener(touched)
        self._trim_derived()
        self._maybe_snapshot()

    # ------------------------------------------------------------------ apply
    # One handler per record type (APPLY_HANDLERS, below the class), each called with the
    # entry and the queues that got messages (for the dispatch listeners).

    def _apply_auth(self, entry: Entry, touched: Touched) -> None:
        self.auth.apply(entry.index, entry.body)

    def _apply_pop(self, entry: Entry, touched: Touched) -> None:
        self.pop.apply(entry.index, entry.body)

    def _apply_subgroup(self, entry: Entry, touched: Touched) -> None:
        self.subgroups.apply(entry.body)

    def _apply_broker_config(self, entry: Entry, touched: Touched) -> None:
        self.config_overrides = brokerconf.applied(self.config_overrides, entry.body)
        self._config_changed()

    def set_config_hook(self, hook: Callable[[Mapping[str, str]], None]) -> None:
        """Call ``hook`` with the live override table now and each time it changes: as a
        broker config record is applied, a snapshot loaded, the state reset."""
        self._config_hook = hook
        hook(self.config_overrides)

    def _config_changed(self) -> None:
        if self._config_hook is not None:
            self._config_hook(self.config_overrides)

    def set_dedup_window(self, window_ms: int, max_ids: int) -> None:
        """The idempotent-send window from now on (a live change, applied by every member at
        the same index): ids older than ``window_ms`` before the latest stored message, or
        beyond the newest ``max_ids``, are forgotten at once."""
        if window_ms < 0 or max_ids < 1:
            raise ConfigError("dedup_window_ms must be >= 0 and dedup_max_ids >= 1")
        self.dedup_window_ms, self.dedup_max_ids = window_ms, max_ids
        self._evict_dedup()

    def _apply_offsets(self, entry: Entry, touched: Touched) -> None:
        """Apply an offsets record: a group new here is recorded with its owner, and while
        :data:`MAX_OFFSET_GROUPS` groups are held a new group's offsets are skipped (the
        others of the record still apply: they take no room)."""
        offsets, owners = decode_offsets_record_owned(entry.body)
        check_offsets(offsets)
        groups = self.offset_groups
        refused: set[str] = set()
        for group in sorted({g for g, _, _ in offsets}):
            if group in groups:
                continue
            if len(groups) >= MAX_OFFSET_GROUPS:
                refused.add(group)
                continue
            groups[group] = owners.get(group, "")
        if refused:
            self.skip_log.skip(
                entry.index,
                entry.type,
                InvalidRecordError(
                    f"offsets of {len(refused)} new consumer groups, e.g."
                    f" {shown_name(min(refused))}: the broker holds {MAX_OFFSET_GROUPS} groups"
                ),
            )
            offsets = {k: v for k, v in offsets.items() if k[0] not in refused}
        self.offsets.update(offsets)

    def _drop_offsets_of_topic(self, topic: str) -> None:
        """Forget every offset of ``topic``, and the groups left without offsets."""
        for key in [k for k in self.offsets if k[1] == topic]:
            del self.offsets[key]
        left = {g for g, _, _ in self.offsets}
        self.offset_groups = {g: o for g, o in self.offset_groups.items() if g in left}

    def offset_groups_of(self, user: str) -> int:
        """Consumer groups with offsets that ``user``'s commits created. A scan of at most
        MAX_OFFSET_GROUPS (well under a ms): the leader runs it once per new group only."""
        return sum(1 for owner in self.offset_groups.values() if owner == user)

    def _apply_schedule(self, entry: Entry, touched: Touched) -> None:
        level, from_offset, to_offset = decode_schedule_header(entry.body)
        current = self.schedule_offsets.get(level, 0)
        # The leader proposes an entry for offsets it read from this level's queue, after
        # applying the messages there: every member holds them when it applies the entry. An
        # entry reaching further (a forged header) would move the level past messages not yet
        # stored, and the level would deliver nothing until its queue caught up.
        cq = self.cqs.find(SCHEDULE_TOPIC, level - 1)
        held = 0 if cq is None else cq.max_offset
        if to_offset > held:
            raise InvalidRecordError(
                f"schedule record level={level} [{from_offset}, {to_offset}) reaches past the"
                f" {held} messages of its queue"
            )
        copies = 0
        if len(entry.body) > SCHEDULE_HEADER.size:  # else only skipped messages: no copies
            copies = batch_count(memoryview(entry.body)[SCHEDULE_HEADER.size :])
        if copies > to_offset - from_offset:
            raise InvalidRecordError(
                f"schedule record level={level} [{from_offset}, {to_offset}) carries {copies}"
                " copies, more than it delivers"
            )
        if current != from_offset:
            # Proposed twice (a leader re-scanned before its first proposal applied, or a
            # deposed leader's entry): the first one delivered these; skip the copy whole.
            logger.info(
                "skip stale schedule entry index=%d level=%d from=%d current=%d",
                entry.index,
                level,
                from_offset,
                current,
            )
            return
        if len(entry.body) > SCHEDULE_HEADER.size:  # only skipped messages: no copies
            self._apply_messages(entry, touched, SCHEDULE_HEADER.size, check_dedup=False)
        self.schedule_offsets[level] = to_offset

    def _apply_timer(self, entry: Entry, touched: Touched) -> None:
        """A move of a timer level's head (:mod:`broker.state.timerrules`): every check first, then
        the copies, the hop records for lower levels and the level's new offset, all or none."""
        body = entry.body
        level, from_offset, to_offset, now_ms, hops = decode_timer_header(body)
        cq = self.cqs.find(TIMER_TOPIC, level)
        held = 0 if cq is None else cq.max_offset
        if to_offset > held:
            raise InvalidRecordError(
                f"timer record level={level} [{from_offset}, {to_offset}) reaches past the"
                f" {held} records of its queue"
            )
        copies_at = TIMER_HEADER.size + hops * HOP_RECORD_SIZE
        copies = memoryview(body)[copies_at:]
        if copies and any(row[2] == TIMER_TOPIC for row in scan_dispatch(copies)):
            raise InvalidRecordError("timer record delivers a copy into the timer topic")
        if hops + (batch_count(copies) if copies else 0) > to_offset - from_offset:
            raise InvalidRecordError(
                f"timer record level={level} [{from_offset}, {to_offset}) files {hops} hops"
                " and copies, more than it moves"
            )
        base = self.log.body_position(entry.index)
        rows: dict[int, list[tuple[int, int, int]]] = {}
        for at in range(TIMER_HEADER.size, copies_at, HOP_RECORD_SIZE):
            target, position, _size, _deliver_ms = decode_hop(body, at)
            if position >= base:
                raise InvalidRecordError(f"timer hop points at {position}, not before its entry")
            # The CQ row of a hop: its own position and size, and when it was filed.
            rows.setdefault(target, []).append((base + at, HOP_RECORD_SIZE, now_ms))
        if self.timer_offsets.get(level, 0) != from_offset:
            logger.info(
                "skip stale timer entry index=%d level=%d from=%d current=%d",
                entry.index,
                level,
                from_offset,
                self.timer_offsets.get(level, 0),
            )
            return
        if copies:
            self._apply_messages(entry, touched, copies_at, check_dedup=False)
        for target, records in rows.items():
            self.cqs.queue(TIMER_TOPIC, target).append_many(records)
        self._dispatch_end = base + len(body)
        self.timer_offsets[level] = to_offset

    def _apply_messages(
        self,
        entry: Entry,
        touched: Touched,
        body_offset: int = 0,
        check_dedup: bool = True,
    ) -> list[SendResult]:
        """Apply the message batch at ``body_offset`` of ``entry``: place every message in
        its queue (or answer a retried id from the dedup table), then store the ConsumeQueue
        rows and the key index rows; all or nothing (an error stores nothing)."""
        base = self.log.body_position(entry.index) + body_offset
        body = memoryview(entry.body)[body_offset:] if body_offset else entry.body
        # The whole batch is checked (entry CRC covered it already; each message's CRC is
        # checked again when it is read): a corrupt batch is skipped as a whole.
        rows = scan_dispatch(body)
        results, per_queue, to_index = self._place_batch(
            rows, base, self.dedup if check_dedup else None
        )
        for key, records in per_queue.items():
            self.cqs.queue(*key).append_many(records)
            touched.setdefault(key, set()).update(r[2] for r in records)
        self.index.put_messages(to_index)
        self._dispatch_end = base + len(body)
        self._evict_dedup()
        if self.role is Role.LEADER:  # only a leader has send handlers waiting for them
            self._results[entry.index] = results
            while len(self._results) > RESULTS_KEPT:
                self._results.popitem(last=False)
        return results

    def _place_batch(
        self,
        rows: Sequence[DispatchRow],
        base: int,
        dedup: DedupWindow | None,
    ) -> tuple[list[SendResult], dict[QueueKey, list[CqRow]], list[KeyRow]]:
        """Check every message of a batch and give it its queue offset; nothing is stored
        yet. Returns the send results (duplicates answered from ``dedup``, new ids added to
        it), the ConsumeQueue rows per queue and the key index rows. On any error the ids
        this batch added to ``dedup`` are taken out again. One call per batch: the loop is
        the apply path's per-message cost, so it stays in one frame."""
        results: list[SendResult] = []
        per_queue: dict[QueueKey, list[CqRow]] = {}
        next_offset: dict[QueueKey, int] = {}
        to_index: list[KeyRow] = []
        latest = self._latest_store_ts
        try:
            for offset_in, size, topic, queue_id, t_hash, keys, uniq_id, store_ts in rows:
                if not 0 <= store_ts <= MAX_STORE_TIMESTAMP_MS:
                    raise InvalidRecordError(
                        f"message {uniq_id} store timestamp {store_ts} is outside"
                        f" [0, {MAX_STORE_TIMESTAMP_MS}]"
                    )
                if dedup is not None:
                    original = dedup.get(uniq_id)
                    if original is not None:
                        results.append(original._replace(duplicate=True))
                        self.dedup_hits += 1
                        continue
                key = (topic, queue_id)
                offset = next_offset.get(key)
                if offset is None:
                    # First message of the batch for this queue: the name and the queue id
                    # are checked (as a send is) before any path is built from them, and
                    # nothing is created until the whole batch passed.
                    check_queue(topic, queue_id)
                    cq = self.cqs.find(topic, queue_id)
                    offset = 0 if cq is None else cq.max_offset
                    per_queue[key] = []
                next_offset[key] = offset + 1
                position = base + offset_in
                # The schedule topic's records carry the store time where others carry the
                # tag hash (RocketMQ does the same): the scheduler finds due heads unread.
                # So do the timer topic's: a record's filing time (broker.state.timerrules).
                tag = store_ts if topic in (SCHEDULE_TOPIC, TIMER_TOPIC) else t_hash
                per_queue[key].append((position, size, tag))
                to_index.append((topic, keys, uniq_id, position, store_ts))
                result = SendResult(uniq_id, topic, queue_id, offset, position, store_ts)
                if dedup is not None:
                    dedup.add_new(uniq_id, result)  # its get() above missed
                results.append(result)
                if store_ts > latest:
                    latest = store_ts
        except BaseException:
            if dedup is not None:
                _forget_new_ids(dedup, results)
            raise
        self._latest_store_ts = latest
        return results, per_queue, to_index

    def _apply_txn(self, entry: Entry, touched: Touched) -> None:
        """A transaction record; its message batch (a half, or a commit's visible copy) is
        applied as a message entry's (the half deduplicated by its id, the copy not: the
        transaction's state lets it through once)."""

        def store(at: int, dedup: bool) -> list[SendResult]:
            return self._apply_messages(entry, touched, at, check_dedup=dedup)

        self.txn.apply(entry.index, entry.body, store)

    def on_prefix_deleted(self, first_index: int) -> None:
        """dledger's retention deleted the log below ``first_index``."""
        if self._opened:
            self._trim_derived()

    def _trim_derived(self) -> None:
        """After the commitlog's retention deleted a prefix, delete the ConsumeQueue and key
        index files that only point into it and move every queue's min offset past it
        (RocketMQ's CleanConsumeQueueService). Also run after every apply (cheap: one compare)
        so that a restart with a deleted prefix trims at the first apply."""
        log = self.log
        first = log.first_index()
        if first <= self._trimmed_first or first > log.last_index():
            return
        self._trimmed_first = first
        position = log.body_position(first)
        self.files_deleted += 1  # before: a capture listing meanwhile must not miss it
        cq_files = self.cqs.delete_files_before(position)
        index_files = self.index.delete_files_before(position)
        if cq_files or index_files:
            logger.info(
                "retention: consumequeue files=%d index files=%d below position=%d index=%d",
                cq_files,
                index_files,
                position,
                first,
            )

    def _evict_dedup(self) -> None:
        self.dedup.evict(self._latest_store_ts - self.dedup_window_ms, self.dedup_max_ids)

    def _apply_topic(self, entry: Entry, touched: Touched) -> None:
        op, topic = decode_topic_record(entry.body)
        check_topic_record(op, topic, self.topics)
        if op == TOPIC_UPSERT or (op == TOPIC_CREATE_IF_ABSENT and topic.name not in self.topics):
            changed = self.topics.get(topic.name) != topic
            self.topics[topic.name] = topic
            logger.info("topic set topic=%s config=%s index=%d", topic.name, topic, entry.index)
            if changed:
                self._changed()
        elif op == TOPIC_DELETE and topic.name in self.topics:
            # The queues first: a store that refuses (PATH_OUTSIDE_STORE) changes nothing.
            self.files_deleted += 1
            self.cqs.drop_topic(topic.name)
            del self.topics[topic.name]
            self._drop_offsets_of_topic(topic.name)
            self.pop.drop_topic(topic.name)
            self.txn.drop_topic(topic.name)
            logger.info("topic deleted topic=%s index=%d", topic.name, entry.index)
            # The queues' files are gone: a snapshot from before the delete no longer matches
            # the disk, so write one now (a crash in between is caught by the queue check).
            self._write_snapshot()
            self._changed()

    # ------------------------------------------------------------------ queries

    def take_results(self, index: int) -> list[SendResult] | None:
        """The per-message results of message entry ``index`` (once), None when unknown."""
        return self._results.pop(index, None)

    def find_uniq(self, uniq_id: str) -> SendResult | None:
        return self.dedup.get(uniq_id)

    def queue_offsets(self, topic: str, queue_id: int) -> tuple[int, int]:
        cq = self.cqs.find(topic, queue_id)
        return (0, 0) if cq is None else (cq.min_offset, cq.max_offset)

    # ------------------------------------------------------------------ persistence

    def _maybe_snapshot(self) -> None:
        now = time.monotonic()
        interval_s = min(
            max(
                self._snapshot_interval_s,
                SNAPSHOT_COST_FACTOR * (self._last_persist_s + self._last_capture_s),
            ),
            MAX_SNAPSHOT_INTERVAL_S,
        )
        if now - self._last_snapshot_s >= interval_s:
            self.save_state(now)

    def save_state(self, now: float | None = None) -> None:
        """Start writing the state at the applied index when the snapshot is behind it and
        none is being written (between two applies). After each apply at most every snapshot
        interval; dledger's retention also asks (``durable_index()`` holds it back), so that
        an idle broker's state on disk catches up with what it applied."""
        if not self._opened:
            return
        if now is None:
            now = time.monotonic()
        if self._applied != self._snapshot_applied and (
            self._snapshot_future is None or self._snapshot_future.done()
        ):
            self._check_snapshot_future()
            # Captured here, between two applies (consistent); flushed and written in a
            # thread so that msync and fsync never stall the event loop.
            captured = self._capture()
            self._last_capture_s = time.monotonic() - now
            self._last_snapshot_s = now
            self._snapshot_applied = self._applied
            self._snapshot_future = self._snapshot_pool.submit(self._persist, captured)

    def _check_snapshot_future(self) -> None:
        f = self._snapshot_future
        if f is not None and f.done() and f.exception() is not None:
            logger.error("snapshot write failed: %s", f.exception())

    def wait_snapshot(self) -> None:
        """Wait for a snapshot being written in the background (if any)."""
        if self._snapshot_future is not None:
            self._snapshot_future.result()

    def _capture(self) -> _Captured:
        queues = {}
        for topic, queue_id in self.cqs.queue_ids():
            cq = self.cqs.find(topic, queue_id)
            if cq is not None and cq.max_offset:
                queues[f"{topic}/{queue_id}"] = cq.max_offset
        return _Captured(
            applied=self._applied,
            dispatch_end=self._dispatch_end,
            index_max_position=self.index.max_position(),
            latest_store_ts=self._latest_store_ts,
            queues=queues,
            topics=dict(self.topics),
            offsets=dict(self.offsets),
            offset_owners={g: o for g, o in self.offset_groups.items() if o},
            dedup=self.dedup.capture(),
            schedule=dict(self.schedule_offsets),
            timer=dict(self.timer_offsets),
            auth=self.auth.to_snapshot(),
            pop=self.pop.capture(),
            txn=self.txn.capture(),
            subgroups=self.subgroups.capture(),
            config=brokerconf.capture(self.config_overrides),
        )

    def _persist(self, c: _Captured) -> None:
        """Flush the stores (they hold at least what ``c`` describes: what was applied since
        is cut off again on open), then write the snapshot atomically."""
        started = time.monotonic()
        self.cqs.flush()
        self.index.flush()
        raw = _snapshot_document(c)
        self.config_dir.mkdir(parents=True, exist_ok=True)
        atomic_write(self.config_dir / SNAPSHOT_FILE, raw)
        self._durable_applied = c.applied
        self._last_persist_s = time.monotonic() - started
        logger.debug(
            "snapshot applied=%d bytes=%d ms=%.1f",
            c.applied,
            len(raw),
            self._last_persist_s * 1000,
        )

    def capture_snapshot(self) -> AppSnapshot:
        """A Raft snapshot of the state at the applied index, for a follower that needs one
        (broker.state.snapshotting): called by the node between two applies."""
        return snapshotting.capture(self, _snapshot_document(self._capture()))

    def install_snapshot(self, app_dir: Path, index: int) -> None:
        """dledger installed a snapshot's log; take its files. The next applied_index()
        opens the state at ``index`` (the node checks it)."""
        if self._opened:
            self.wait_snapshot()
            self.cqs.close()
            self.index.close()
            self._opened = False
        snapshotting.install(self, app_dir)
        # The leader's state replaces whatever a check or a content repair doubted here.
        (self.config_dir / derived.REBUILD_MARKER).unlink(missing_ok=True)
        self._results.clear()
        self._trimmed_first = 1
        logger.info("snapshot install index=%d root=%s", index, self.root)

    def _write_snapshot(self) -> None:
        """Write a snapshot now, in this thread (after any one in flight)."""
        self.wait_snapshot()
        self._persist(self._capture())
        self._last_snapshot_s = time.monotonic()
        self._snapshot_applied = self._applied

    def _load_snapshot(self, data: Mapping[str, Any]) -> None:
        if data.get("version") not in (1, SNAPSHOT_VERSION):
            raise ValueError(f"snapshot version {data.get('version')}")
        self._applied = int(data["applied_index"])
        self._effect_index = self._applied  # (what is saved may come from any of them)
        self._dispatch_end = int(data["dispatch_position"])
        self._latest_store_ts = int(data["latest_store_timestamp_ms"])
        # The file is as hostile as a record: what the API would refuse is left out, with one
        # line per kind (a table that lists a bad name must not cut the broker off from the
        # NameServer, nor stop it from starting).
        self.topics = {}
        bad_topics: list[str] = []
        for name, row in data["topics"].items():
            try:
                topic = _topic_of_row(str(name), row)
                check_topic_record(TOPIC_UPSERT, topic, self.topics)
            except (BrokerError, TypeError, ValueError):
                bad_topics.append(str(name))
                continue
            self.topics[topic.name] = topic
        _report_dropped("topics", bad_topics)
        offsets = {
            (str(group), str(topic), int(q)): int(o)
            for group, topics in data["offsets"].items()
            for topic, queues in topics.items()
            for q, o in queues.items()
        }
        self.offsets = {}
        bad_offsets: list[str] = []
        for key, offset in offsets.items():
            try:
                check_offsets({key: offset})
            except InvalidRecordError:
                bad_offsets.append("/".join(map(str, key)))
                continue
            self.offsets[key] = offset
        _report_dropped("consumer offsets", bad_offsets)
        self.offset_groups = _load_offset_owners(self.offsets, data.get("offset_owners", {}))
        self.schedule_offsets = {}
        bad_levels: list[str] = []
        for level, offset in data.get("schedule", {}).items():
            lv, off = int(level), int(offset)
            if 1 <= lv <= 255 and 0 <= off <= I64_MAX:
                self.schedule_offsets[lv] = off
            else:
                bad_levels.append(f"{lv}={off}")
        _report_dropped("schedule levels", bad_levels)
        self.timer_offsets, bad_timer = _load_levels(data.get("timer", {}), 0, MAX_TIMER_LEVELS - 1)
        _report_dropped("timer levels", bad_timer)
        _report_dropped("users and acls", self.auth.load_snapshot(data.get("auth", {})))
        _report_dropped("POP queues", self.pop.load(data.get("pop", ())))
        _report_dropped("transactions", self.txn.load(data.get("txn", {})))
        _report_dropped("subscription groups", self.subgroups.load(data.get("subgroups", ())))
        self.config_overrides, bad_config = brokerconf.load(data.get("config", {}))
        _report_dropped("broker config overrides", bad_config)
        self._config_changed()
        if data.get("version") == 1:
            dedup = _decode_dedup_v1(data["dedup"])
        else:
            dedup = decode_dedup(data["dedup"])
        # A window of 100,000 ids names a few topics: each is checked once.
        invalid = {t for t in dedup.topic_names() if not is_valid_topic_name(t)}
        bad_ids = [uid for uid, r in dedup.items() if r.topic in invalid] if invalid else []
        for uid in bad_ids:
            del dedup[uid]
        _report_dropped("deduplication ids", bad_ids)
        self.dedup = dedup

    def _open_stores(self) -> None:
        self.cqs = ConsumeQueueStore(self.root, records_per_file=self._cq_records_per_file)
        self.index = IndexStore(
            self.root, hash_slots=self._hash_slots, max_records=self._max_index_records
        )

    def _open(self) -> None:
        path = self.config_dir / SNAPSHOT_FILE
        had_stores = (self.root / "consumequeue").is_dir() and (self.root / "index").is_dir()
        problem = ""
        data: dict[str, Any] | None = None
        if path.exists():
            try:
                data = json.loads(path.read_bytes())
            except ValueError as exc:
                problem = f"unreadable snapshot: {exc}"
        elif had_stores:
            problem = "no snapshot"
        if not had_stores and data is not None:
            problem = "consumequeue/ or index/ missing"
        _refuse_newer(path, data)
        self._open_stores()
        if data is not None and not problem:
            try:
                self._load_snapshot(data)
                problem = self._recover_to_snapshot(data)
            except (KeyError, ValueError, TypeError, struct.error) as exc:
                problem = f"bad snapshot: {exc}"
        if not problem:
            problem = self._check_derived()
        if problem:
            self._rebuild(problem)
        self._opened = True
        self._snapshot_applied = self._applied
        # A rebuild deleted the snapshot: nothing of the state is on disk until the next one.
        self._durable_applied = 0 if problem else self._applied
        logger.info(
            "broker state opened applied=%d topics=%d offsets=%d dedup=%d",
            self._applied,
            len(self.topics),
            len(self.offsets),
            len(self.dedup),
        )

    def _check_derived(self) -> str:
        """The open-time check of the ConsumeQueues and the key index against the commitlog
        (broker.state.derived): wrong records are rebuilt in place; a reason to rebuild everything
        when they cannot be, or when a run-time check asked for it."""
        marker = self.config_dir / derived.REBUILD_MARKER
        if marker.exists():
            why = marker.read_bytes()[: derived.MAX_MARKER_BYTES].decode("utf-8", "replace")
            return f"a run-time check could not rebuild in place: {why}"
        try:
            problem = derived.check_all_queues(self)
        except DLedgerError as exc:
            # The commitlog's own damage: the log's checks and repair deal with it; the
            # derived stores are left as they are.
            logger.error("derived state: open-time check stopped, commitlog unreadable: %s", exc)
            return ""
        # POP, level and transaction rows against the (now right) queues and the log.
        return problem or statecheck.check_at_open(self)

    def request_rebuild(self, why: str) -> None:
        """A run-time check found derived damage it could not rebuild in place: the next
        start rebuilds every derived store from the log (config/rebuild-derived)."""
        self.derived.unrepaired += 1
        if self.derived.unrepaired > 1:
            logger.info("derived state: also cannot rebuild in place: %.300s", why)
            return  # the marker holds the first reason; the next start rebuilds it all
        logger.error("derived state: cannot rebuild in place, rebuilding at next start: %s", why)
        self.config_dir.mkdir(parents=True, exist_ok=True)
        atomic_write(
            self.config_dir / derived.REBUILD_MARKER,
            why.encode()[: derived.MAX_MARKER_BYTES],
        )

    def _recover_to_snapshot(self, data: Mapping[str, Any]) -> str:
        """Cut the stores back to the snapshot; a reason to rebuild, or empty when they match."""
        log = self.log
        if not log.first_index() - 1 <= self._applied <= log.last_index():
            return (
                f"snapshot applied index {self._applied} outside the log"
                f" [{log.first_index()}, {log.last_index()}]"
            )
        self.cqs.truncate_after_position(self._dispatch_end)
        self.index.truncate_after_position(self._dispatch_end)
        expected = {str(k): int(v) for k, v in data["queues"].items()}
        for topic, queue_id in self.cqs.queue_ids():
            cq = self.cqs.find(topic, queue_id)
            have = 0 if cq is None else cq.max_offset
            want = expected.pop(f"{topic}/{queue_id}", 0)
            if have > want or (have < want and cq is None):
                return f"queue {topic}/{queue_id} holds {have} records, snapshot says {want}"
            if have < want and cq is not None:
                # Records the snapshot says were durable are gone (cut at open as a torn
                # tail: a record changed out of order): the tail comes from the commitlog.
                problem = derived.rebuild_tail(self, cq, topic, queue_id, want)
                if problem:
                    return problem
        if expected:
            return f"queues missing: {sorted(expected)[:3]}"
        if self.index.max_position() != int(data["index_max_position"]):
            return (
                f"index ends at {self.index.max_position()},"
                f" snapshot says {data['index_max_position']}"
            )
        return ""

    def _rebuild(self, why: str) -> None:
        """Forget everything derived from the log and apply it again from the start; a
        StartError instead when the log no longer starts at entry 1 (what the deleted entries
        made would be lost: statecheck.refuse_inexact_rebuild)."""
        statecheck.refuse_inexact_rebuild(self, why)
        first = self.log.first_index()
        logger.warning(
            "rebuilding broker state from the commitlog reason=%r first_index=%d", why, first
        )
        self.cqs.close()
        self.index.close()
        shutil.rmtree(self.root / "consumequeue", ignore_errors=True)
        shutil.rmtree(self.root / "index", ignore_errors=True)
        (self.config_dir / SNAPSHOT_FILE).unlink(missing_ok=True)
        (self.config_dir / derived.REBUILD_MARKER).unlink(missing_ok=True)
        self._open_stores()
        self.topics, self.offsets, self.dedup = {}, {}, DedupWindow()
        self.offset_groups = {}
        self.schedule_offsets = {}
        self.timer_offsets = {}
        self.auth = AuthTable()
        self.pop.reset()
        self.txn.reset()
        self.subgroups.reset()
        self.config_overrides = {}
        self._config_changed()
        self._latest_store_ts = 0
        self._applied = first - 1
        self._effect_index = self._applied
        self._dispatch_end = 0

    def close(self) -> None:
        """Write a final snapshot and close the stores (after the node stopped applying)."""
        if not self._opened:
            return
        self._write_snapshot()
        self._snapshot_pool.shutdown(wait=True)
        self.cqs.close()
        self.index.close()
        self._opened = False


# How a record type is applied: a method of BrokerStateMachine (entry, touched queues); what
# it returns is not used.
ApplyHandler = Callable[[BrokerStateMachine, Entry, Touched], object]


def _handler_table(pairs: Sequence[tuple[int, ApplyHandler]]) -> dict[int, ApplyHandler]:
    """The handler table of ``pairs``; raise unless every record type of
    :data:`broker.state.records.RECORD_TYPES` has exactly one handler and no other type has one."""
    table: dict[int, ApplyHandler] = {}
    for entry_type, handler in pairs:
        if entry_type in table:
            raise AssertionError(f"record type {entry_type} has two apply handlers")
        table[entry_type] = handler
    if table.keys() != RECORD_TYPES.keys():
        missing = sorted(RECORD_TYPES.keys() - table.keys())
        extra = sorted(table.keys() - RECORD_TYPES.keys())
        raise AssertionError(f"apply handlers: record types {missing} without one, {extra} unknown")
    return table


# Record type -> its handler. A type not here is not the broker's (dledger's own entries, or
# a newer broker's record type): apply passes over it.
APPLY_HANDLERS: Mapping[int, ApplyHandler] = _handler_table(
    [
        (ENTRY_MESSAGES, BrokerStateMachine._apply_messages),
        (ENTRY_OFFSETS, BrokerStateMachine._apply_offsets),
        (ENTRY_TOPIC, BrokerStateMachine._apply_topic),
        (ENTRY_SCHEDULE, BrokerStateMachine._apply_schedule),
        (ENTRY_AUTH, BrokerStateMachine._apply_auth),
        (ENTRY_POP, BrokerStateMachine._apply_pop),
        (ENTRY_SUBGROUP, BrokerStateMachine._apply_subgroup),
        (ENTRY_TIMER, BrokerStateMachine._apply_timer),
        (ENTRY_TXN, BrokerStateMachine._apply_txn),
        (ENTRY_BROKER_CONFIG, BrokerStateMachine._apply_broker_config),
    ]
)


def _snapshot_document(c: _Captured) -> bytes:
    """``config/snapshot.json`` for the state ``c`` captured."""
    offsets: dict[str, dict[str, dict[str, int]]] = {}
    for (group, topic, queue_id), offset in sorted(c.offsets.items()):
        offsets.setdefault(group, {}).setdefault(topic, {})[str(queue_id)] = offset
    data = {
        "version": SNAPSHOT_VERSION,
        "applied_index": c.applied,
        "dispatch_position": c.dispatch_end,
        "index_max_position": c.index_max_position,
        "latest_store_timestamp_ms": c.latest_store_ts,
        "queues": c.queues,
        "topics": {name: _topic_row(t) for name, t in sorted(c.topics.items())},
        "offsets": offsets,
        "offset_owners": dict(sorted(c.offset_owners.items())),
        "dedup": encode_dedup(c.dedup),
        "schedule": {str(level): offset for level, offset in sorted(c.schedule.items())},
        "timer": {str(level): offset for level, offset in sorted(c.timer.items())},
        "auth": c.auth,
        "pop": c.pop,
        "txn": c.txn,
        "subgroups": c.subgroups,
    }
    if c.config:  # only at feature level 2 (no override before): level 1 writes what it did
        data["config"] = c.config
    return json.dumps(data, separators=(",", ":")).encode()


def _load_levels(rows: Mapping[str, Any], low: int, high: int) -> tuple[dict[int, int], list[str]]:
    """A snapshot's ``{level: offset}`` table: the valid rows, and the invalid ones shown."""
    out: dict[int, int] = {}
    bad: list[str] = []
    for level, offset in rows.items():
        lv, off = int(level), int(offset)
        if low <= lv <= high and 0 <= off <= I64_MAX:
            out[lv] = off
        else:
            bad.append(f"{lv}={off}")
    return out, bad


def _report_dropped(what: str, names: Sequence[str]) -> None:
    """One line for the invalid items a snapshot held (the first few named, cut short)."""
    if names:
        logger.error(
            "snapshot: left out %d invalid %s: %s",
            len(names),
            what,
            ", ".join(shown_name(n) for n in names[:5]),
        )


# ---------------------------------------------------------------------------------------
# The dedup window in a snapshot (docs/FORMAT.md, "Broker: state snapshot")
# ---------------------------------------------------------------------------------------


def _decode_dedup_v1(text: str) -> DedupWindow:
    """A version-1 snapshot's window: one packed record per id."""
    raw = base64.b64decode(text)
    at = 0
    out = DedupWindow()
    while at < len(raw):
        uniq, ts, queue_id, offset, position, tlen = _DEDUP_ITEM.unpack_from(raw, at)
        at += _DEDUP_ITEM.size
        topic = raw[at : at + tlen].decode("ascii")
        at += tlen
        uid = uniq.hex().upper()
        out[uid] = SendResult(uid, topic, queue_id, offset, position, ts)
    return out


def _forget_new_ids(dedup: DedupWindow, results: list[SendResult]) -> None:
    """A batch skipped whole: the ids it put in the dedup window come out again (they were
    added last, so the window is as it was)."""
    for r in results:
        if not r.duplicate:
            dedup.pop(r.uniq_id, None)
