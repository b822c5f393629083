"""A snapshot's log (dledger.storage.install): the leader's segments up to the snapshot's
last entry, copied byte for byte, make a store with the same entries at the same positions."""

from __future__ import annotations

from pathlib import Path

import pytest

from dledger.chain import CHAIN_ORIGIN
from dledger.log import DLedgerError, Entry, LogCompactedError
from dledger.storage.files import segment_name
from dledger.storage.install import install_log
from dledger.storage.store import SegmentedLogStore, StoreConfig

CFG = StoreConfig(segment_size_bytes=64 * 1024, index_segment_size_bytes=64 * 1024)


def _stage(src: SegmentedLogStore, index: int, dest: Path) -> None:
    """What a transfer writes: the segments from the first one to the end of ``index``."""
    ext = src.snapshot_extent(index)
    dest.mkdir(parents=True)
    pos = ext.start_position
    while pos < ext.end_position:
        seg = pos - pos % ext.segment_size_bytes
        n = min(ext.end_position, seg + ext.segment_size_bytes) - pos
        with (dest / segment_name(seg)).open("ab") as f:
            f.write(src.read_at(pos, n))
        pos += n


def test_installed_log_matches_the_source_and_continues_at_the_same_positions(
    tmp_path: Path,
) -> None:
    src = SegmentedLogStore(tmp_path / "src", CFG)
    src.append([Entry(1 + i // 300, i, b"r%d" % i * 50) for i in range(1, 1001)])
    src.flush()
    src.delete_prefix(src.segment_infos()[1].last_index)
    first = src.first_index()
    assert first > 1
    snap_index = 900
    ext = src.snapshot_extent(snap_index)
    _stage(src, snap_index, tmp_path / "staged")
    dst_root = tmp_path / "dst"
    SegmentedLogStore(dst_root, CFG).close()  # an empty node's store, with its own files
    install_log(
        dst_root,
        tmp_path / "staged",
        base_index=ext.base_index,
        base_term=ext.base_term,
        start_position=ext.start_position,
        segment_size_bytes=CFG.segment_size_bytes,
        base_chain=ext.base_chain,
    )
    dst = SegmentedLogStore(dst_root, CFG)
    assert (dst.first_index(), dst.last_index()) == (first, snap_index)
    assert dst.term_at(first - 1) == src.term_at(first - 1)
    # The chains are rebuilt from the base's: the same values as the source's.
    for i in (first - 1, first, snap_index):
        assert dst.chain_at(i) == src.chain_at(i)
    with pytest.raises(LogCompactedError):
        dst.read(first - 1)
    for i in (first, (first + snap_index) // 2, snap_index):
        assert dst.read(i) == src.read(i)
        assert dst.body_position(i) == src.body_position(i)
    # Entries appended after the snapshot land where the source has them.
    dst.append(src.read_range(snap_index + 1, 1 << 30))
    for i in (snap_index + 1, 1000):
        assert dst.body_position(i) == src.body_position(i)
    dst.close()
    src.close()


def test_staged_segments_must_be_contiguous(tmp_path: Path) -> None:
    staged = tmp_path / "staged"
    staged.mkdir()
    (staged / segment_name(0)).write_bytes(b"")
    (staged / segment_name(2 * CFG.segment_size_bytes)).write_bytes(b"")  # a hole
    SegmentedLogStore(tmp_path / "dst", CFG).close()
    with pytest.raises(DLedgerError):
        install_log(
            tmp_path / "dst",
            staged,
            base_index=0,
            base_term=0,
            start_position=0,
            segment_size_bytes=CFG.segment_size_bytes,
            base_chain=CHAIN_ORIGIN,
        )
