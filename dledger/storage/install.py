"""Replace a closed store's log by the one a snapshot brought (docs/STORAGE.md, "Snapshots").

A snapshot transfer ships the leader's data segments from its first one up to the end of the
snapshot's last entry, byte for byte (:meth:`SegmentedLogStore.snapshot_extent`), so that the
receiver holds the same entries at the same data positions as every other replica: the
broker's ConsumeQueues address messages by position. :func:`install_log` swaps them in for
the store's own files. It works on a closed store (the caller holds no
:class:`SegmentedLogStore` on the directory) and is idempotent: after a crash part way the
same call finishes the job (the hard state, ``meta``, is never touched).
"""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path

from dledger.log import CorruptLogError, DLedgerError
from dledger.storage import codec
from dledger.storage.files import atomic_write, fsync_dir, segment_name
from mqrelease import BASELINE_LEVEL

logger = logging.getLogger(__name__)

# The store's layout (dledger.storage.store): data segments, index segments, checkpoint.
DATA_DIR = "commitlog"
INDEX_DIR = "index"
CHECKPOINT_FILE = "checkpoint"


def check_segments(source: Path, start_position: int, segment_size_bytes: int) -> list[Path]:
    """The staged data segments, contiguous from ``start_position``; DLedgerError when a name
    is not a segment's, one is missing or larger than a segment."""
    files = sorted(source.iterdir()) if source.is_dir() else []
    expected = start_position
    for p in files:
        if p.name != segment_name(expected) or p.stat().st_size > segment_size_bytes:
            raise DLedgerError(
                f"snapshot segment {p.name!r} is not the one expected at {expected} "
                f"(or larger than {segment_size_bytes} bytes)"
            )
        expected += segment_size_bytes
    if not files:
        raise DLedgerError("a snapshot brings at least one data segment")
    return files


def verify_staged_log(
    source: Path,
    *,
    start_position: int,
    segment_size_bytes: int,
    base_index: int,
    last_index: int,
) -> int:
    """Check every entry of the staged segments before they are installed: header and body
    CRCs, each at its position, indexes consecutive from ``base_index + 1`` to exactly
    ``last_index``, and every segment but the last closed by a blank record (or padding).
    Returns how many entries were checked; CorruptLogError names the first bad record (the
    snapshot's own checksum only proves the bytes are the ones the leader sent, not that
    the leader's copy was good)."""
    files = check_segments(source, start_position, segment_size_bytes)
    expected = base_index + 1
    for k, path in enumerate(files):
        data = path.read_bytes()
        base = int(path.name)
        last_file = k == len(files) - 1
        terminal: codec.ScanItem | None = None
        for item in codec.iter_segment(data, base):
            if item.kind is not codec.ItemKind.ENTRY:
                terminal = item
                break
            assert item.header is not None
            if item.header.index != expected:
                terminal = item
                break
            expected += 1
        assert terminal is not None
        ends_well = terminal.kind in (codec.ItemKind.BLANK, codec.ItemKind.PADDING) or (
            last_file and terminal.kind is codec.ItemKind.END
        )
        if not ends_well:
            why = terminal.reason or f"{terminal.kind.value} where entry {expected} belongs"
            raise CorruptLogError(
                f"snapshot segment {path.name} offset {terminal.offset}: {why}",
                path=str(path),
                offset=terminal.offset,
                index=expected,
            )
    if expected - 1 != last_index:
        raise CorruptLogError(
            f"snapshot segments hold entries up to {expected - 1}, not {last_index}",
            path=str(files[-1]),
            index=expected,
        )
    return last_index - base_index


def install_log(
    root: Path,
    source: Path,
    *,
    base_index: int,
    base_term: int,
    start_position: int,
    segment_size_bytes: int,
    base_chain: int,
    feature_level: int = BASELINE_LEVEL,
) -> None:
    """Make ``root`` (a closed store) hold the segments staged in ``source`` instead of its own
    log: entries ``base_index + 1`` on, the first at ``start_position``. The index and the
    rest of the checkpoint are rebuilt when the store opens (it scans the new segments, and
    rebuilds every entry's chain from ``base_chain``)."""
    if source.is_dir():
        check_segments(source, start_position, segment_size_bytes)
        for name in (DATA_DIR, INDEX_DIR):
            shutil.rmtree(root / name, ignore_errors=True)
        (root / INDEX_DIR).mkdir()
        os.rename(source, root / DATA_DIR)
        fsync_dir(root)
    elif not (root / DATA_DIR).is_dir():
        raise DLedgerError(f"snapshot install: neither {source} nor {root / DATA_DIR} exists")
    ckpt = codec.Checkpoint(
        flushed_position=start_position,
        flushed_index=base_index,
        commit_index=base_index,
        applied_index=base_index,
        base_index=base_index,
        base_term=base_term,
        base_chain=base_chain,
        feature_level=feature_level,
    )
    atomic_write(root / CHECKPOINT_FILE, codec.encode_checkpoint(ckpt))
    logger.info(
        "snapshot log installed root=%s base_index=%d start_position=%d",
        root,
        base_index,
        start_position,
    )
