"""Open-time recovery of a store (docs/STORAGE.md "Recovery", "Damage and repair"): scan the
data segments from where the checkpoint says the log was durable, rebuild the index records
of what the scan reads, tell a torn tail (cut quietly) from damage inside the durable log
(reported, then cut), finish a truncation a crash interrupted, and drop what lies beyond the
log's end. :class:`Recovery` works on the store's :class:`SegmentSet` and :class:`IndexFiles`
and returns what it found (:class:`Recovered`); the store takes its state from that."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from dledger.chain import link
from dledger.log import CorruptLogError
from dledger.storage import codec, damage
from dledger.storage.codec import NO_TRUNCATE_PENDING, Checkpoint, ItemKind
from dledger.storage.files import fsync_dir
from dledger.storage.index import IndexFiles
from dledger.storage.segments import SegmentSet, peek_first_index

log = logging.getLogger(__name__)


def next_link(prev: int, h: codec.EntryHeader) -> int:
    """The chain at the entry of header ``h`` (``prev``: the chain before it; unknown stays
    unknown)."""
    return link(prev, h.index, h.term, h.type, h.body_size, h.body_crc) if prev else prev


@dataclass(frozen=True, slots=True)
class Recovered:
    """The log as recovery left it: it ends at data ``end_position`` with entry
    ``last_index`` (of ``last_term``, chain ``last_chain``), everything up to there durable;
    index records up to ``index_synced`` were synced before (the rest were rewritten).
    ``damage``: the damage found and cut, None if none."""

    end_position: int
    last_index: int
    last_term: int
    last_chain: int
    index_synced: int
    damage: damage.DamageReport | None


@dataclass(slots=True)
class _Scan:
    """Where the scan of the segments stopped."""

    end_pos: int  # write position after the last valid (kept) record
    scan_stop: int  # first position not covered by a valid record (stale included)
    bad_reason: str  # why the last record read is not valid ("" if it is a clean end)


class Recovery:
    """One recovery of the store in ``root`` whose checkpoint is ``ckpt`` and whose log
    starts after ``base`` (index, term, chain). ``before_damage_cut``: see
    :class:`dledger.storage.store.SegmentedLogStore`."""

    def __init__(
        self,
        root: Path,
        segments: SegmentSet,
        index: IndexFiles,
        ckpt: Checkpoint,
        base: tuple[int, int, int],
        before_damage_cut: Callable[[damage.DamageReport], None] | None,
    ) -> None:
        self.root = root
        self._segs = segments
        self._index = index
        self._ckpt = ckpt
        self._base_index, self._base_term, self._base_chain = base
        self._before_damage_cut = before_damage_cut
        # the last entry kept so far (the scan moves it)
        self._last_index = self._base_index
        self._last_term = self._base_term
        self._last_chain = self._base_chain
        self._damage: damage.DamageReport | None = None

    def run(self, *, full: bool, rebuild: bool) -> Recovered:
        """Recover; ``full`` scans every segment (else from the checkpoint's flushed
        position), ``rebuild`` too, for an index that was dropped (an older format)."""
        pending = self._ckpt.truncate_pending_position
        k0, expected, prev_term, chain = self._scan_origin(
            self._ckpt.flushed_position, full or rebuild
        )
        self._last_index, self._last_term, self._last_chain = expected - 1, prev_term, chain
        index_synced = expected - 1  # records below the scan are not rewritten
        scan = self._scan(k0, expected, pending)
        if pending != NO_TRUNCATE_PENDING:
            log.warning("completing an interrupted truncation position=%d", pending)
            self._segs.zero_data(max(pending, scan.end_pos), scan.scan_stop)
            scan.scan_stop = scan.end_pos if scan.scan_stop >= pending else scan.scan_stop
        self._cut_bad_end(scan)
        self._finish(scan.end_pos)
        return Recovered(
            end_position=scan.end_pos,
            last_index=self._last_index,
            last_term=self._last_term,
            last_chain=self._last_chain,
            index_synced=index_synced,
            damage=self._damage,
        )

    def _scan_origin(self, ckpt_pos: int, full: bool) -> tuple[int, int, int, int]:
        """Where recovery starts scanning: the segment (from the one holding the checkpoint's
        flushed position, or the first with ``full``), the index of its first entry and the
        term and chain before it. A segment whose first entry (or the index record before it)
        is unreadable moves the start one segment back, so that the scan meets the damage."""
        segs = self._segs
        origin = (0, self._base_index + 1, self._base_term, self._base_chain)
        if full or ckpt_pos <= segs[0].start:
            return origin
        # the last segment holding flushed bytes (ckpt_pos may be the start of an empty one)
        k0 = max(k for k, s in enumerate(segs) if s.start < ckpt_pos)
        while k0 > 0:
            first = peek_first_index(segs[k0])
            if first > self._base_index + 1:
                try:
                    rec = self._index.record(first - 1)
                    return k0, first, rec.term, rec.chain
                except CorruptLogError:
                    pass
            k0 -= 1
        return origin

    def _scan(self, k0: int, expected: int, pending: int) -> _Scan:
        """Read the entries from segment ``k0`` on (the first expected: ``expected``), keep
        those below ``pending`` and rewrite their index records, until the log ends."""
        segs = self._segs
        scan = _Scan(end_pos=segs[k0].start, scan_stop=segs[k0].start, bad_reason="")
        for k in range(k0, len(segs)):
            seg = segs[k]
            terminal: codec.ScanItem | None = None
            for item in codec.iter_segment(seg.mm, seg.start):
                if item.kind is not ItemKind.ENTRY:
                    terminal = item
                    break
                h = item.header
                assert h is not None
                if h.index != expected or h.term < self._last_term:
                    terminal = item
                    scan.bad_reason = (
                        f"entry index={h.index} term={h.term} does not follow "
                        f"index={expected - 1} term={self._last_term}"
                    )
                    break
                expected += 1
                scan.scan_stop = item.position + item.size
                if item.position >= pending:
                    continue  # an entry an interrupted truncate_suffix was removing
                self._keep(h)
                scan.end_pos = scan.scan_stop
            assert terminal is not None
            if terminal.kind in (ItemKind.BLANK, ItemKind.PADDING):
                scan.scan_stop = seg.end
                if terminal.position < pending:
                    scan.end_pos = seg.end
                continue  # the log goes on in the next segment, if there is one
            if terminal.kind is ItemKind.CORRUPT and not scan.bad_reason:
                scan.bad_reason = terminal.reason
            scan.scan_stop = terminal.position
            break
        return scan

    def _keep(self, h: codec.EntryHeader) -> None:
        """Entry ``h`` is in the log: write its index record and make it the last."""
        chain = next_link(self._last_chain, h)
        self._index.write_record(h.index, h.total_size, h.position, h.term, h.type, chain)
        self._last_index = h.index
        self._last_term = h.term
        self._last_chain = chain

    def _cut_bad_end(self, scan: _Scan) -> None:
        """Torn tail or damage? Damage: the valid log ends below what the checkpoint says is
        durable, or a valid entry follows its end (the middle of the log is bad)."""
        end_pos, ckpt_pos, bad_reason = scan.end_pos, self._ckpt.flushed_position, scan.bad_reason
        problem = ""
        if end_pos < ckpt_pos:
            problem = (
                f"{bad_reason or 'entry missing'}; the checkpoint says the log is durable up "
                f"to position {ckpt_pos}"
            )
        else:
            after = self._segs.valid_entry_after(scan.scan_stop)
            if after:
                problem = f"{bad_reason or 'entry missing'}, but a valid entry follows at {after}"
        if problem:
            self._cut_damage(end_pos, problem)
        elif bad_reason or self._segs.has_nonzero_header(end_pos):
            seg = self._segs.segment_at(end_pos)
            log.warning(
                "truncating torn tail path=%s offset=%d reason=%s",
                seg.path,
                end_pos - seg.start,
                bad_reason or "partial entry",
            )
            self._segs.zero_torn_tail(end_pos)

    def _cut_damage(self, end_pos: int, problem: str) -> None:
        """Damage at ``end_pos`` (inside what was durable): report it, then cut the log
        there: zero the written bytes from ``end_pos`` to the end of its segment's data (the
        later segments go in :meth:`_finish`). A crash part way leaves the checkpoint as it
        was, so the next open finds and cuts the same damage again."""
        seg = self._segs.segment_at(end_pos)
        first = self._last_index + 1
        old_last = max(self._ckpt.flushed_index, self._index.highest_valid(first), first)
        report = damage.DamageReport(
            path=str(seg.path),
            offset=end_pos - seg.start,
            first_index=first,
            last_index=old_last,
            reason=problem,
            found_by="open",
        )
        log.error(
            "DAMAGE in the log: cutting it at the first damaged entry (the leader sends "
            "everything after again) root=%s %s",
            self.root,
            report.describe(),
        )
        if self._before_damage_cut is not None:
            self._before_damage_cut(report)
        end_off = max(end_pos - seg.start, self._segs.search_end(seg, end_pos - seg.start))
        self._segs.zero_data(end_pos, seg.start + end_off)
        self._damage = report

    def _finish(self, end_pos: int) -> None:
        """The log ends at ``end_pos``: drop what lies beyond (segments, index records) and
        sync what survived."""
        segs = self._segs
        # Drop empty segments beyond the write position (pre-allocated, or emptied above).
        if segs.drop_beyond(end_pos) or segs.created_first:
            fsync_dir(segs.directory)
        assert self._last_index >= self._base_index
        assert segs[0].start <= end_pos <= segs[-1].end
        segs.fill_first_indices(end_pos)
        if self._index.clean_after(self._last_index) | self._index.clean_before(
            self._base_index + 1
        ):
            fsync_dir(self._index.directory)
        # What survived is in the page cache; make it durable before calling it flushed.
        start = min(self._ckpt.flushed_position, end_pos)
        segs.sync_data(segs.floor(start), end_pos)


def checkpoint_is_current(ckpt: Checkpoint, got: Recovered, *, exists: bool, rebuilt: bool) -> bool:
    """Whether the checkpoint ``ckpt`` read at open still describes the log ``got`` (else the
    open writes it again, in this version's format when the index was ``rebuilt``)."""
    return (
        exists
        and not rebuilt
        and (ckpt.flushed_position, ckpt.flushed_index, ckpt.truncate_pending_position)
        == (got.end_position, got.last_index, NO_TRUNCATE_PENDING)
    )
