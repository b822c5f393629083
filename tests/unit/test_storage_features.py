"""The store at a raised group feature level: checkpoint format 3 carries the level, is written
only from level 2 (format 2, 0.2.0's bytes, below it), and a store written at a level above
this node's support is refused before anything changes (docs/FORMAT.md "Checkpoint")."""

from __future__ import annotations

from pathlib import Path

import pytest

from dledger.log import Entry, FeatureLevelError
from dledger.storage import SegmentedLogStore, StoreConfig, codec
from dledger.storage.codec import RecordError
from mqrelease import BASELINE_LEVEL

CFG = StoreConfig(segment_size_bytes=1 << 16, preallocate=False)


def _store(root: Path, n: int = 5) -> SegmentedLogStore:
    s = SegmentedLogStore(root, CFG)
    s.append([Entry(1, i, f"e{i}".encode()) for i in range(1, n + 1)])
    s.flush()
    return s


def _checkpoint(root: Path) -> bytes:
    return (root / "checkpoint").read_bytes()


def test_level_one_writes_format_2_and_a_raise_writes_format_3(tmp_path: Path) -> None:
    s = _store(tmp_path)
    s.write_checkpoint(5, 5)
    raw = _checkpoint(tmp_path)
    assert len(raw) == codec.CHECKPOINT_SIZE_V2
    assert codec.decode_checkpoint(raw).version == codec.CHECKPOINT_VERSION_V2
    assert s.feature_level == BASELINE_LEVEL
    s.set_feature_level(2)
    s.write_checkpoint(5, 5)
    s.set_feature_level(BASELINE_LEVEL)  # never lowered
    assert s.feature_level == 2
    s.close()
    ckpt = codec.decode_checkpoint(_checkpoint(tmp_path))
    assert (ckpt.version, ckpt.feature_level) == (codec.CHECKPOINT_VERSION, 2)
    assert len(_checkpoint(tmp_path)) == codec.CHECKPOINT_SIZE
    s = SegmentedLogStore(tmp_path, CFG)
    try:
        assert s.feature_level == 2 and s.last_index() == 5
        s.write_checkpoint(5, 5)  # stays format 3
    finally:
        s.close()
    assert codec.decode_checkpoint(_checkpoint(tmp_path)).feature_level == 2


def test_a_store_above_the_nodes_support_is_refused_unchanged(tmp_path: Path) -> None:
    s = _store(tmp_path)
    s.set_feature_level(2)
    s.write_checkpoint(5, 5)
    s.close()
    before = _checkpoint(tmp_path)
    with pytest.raises(FeatureLevelError, match=r"feature level 2 .* supports up to 1") as info:
        SegmentedLogStore(tmp_path, CFG, supported_feature_level=BASELINE_LEVEL)
    assert info.value.code == "FEATURE_LEVEL_UNSUPPORTED"
    assert _checkpoint(tmp_path) == before
    with pytest.raises(FeatureLevelError, match="outside"):
        s = SegmentedLogStore(tmp_path, CFG)
        try:
            s.set_feature_level(3)
        finally:
            s.close()


def test_a_format_3_checkpoint_below_level_2_is_damage() -> None:
    raw = bytearray(codec.encode_checkpoint(codec.Checkpoint(feature_level=2)))
    raw[72:76] = (1).to_bytes(4, "big")
    raw[-4:] = codec.crc32c(bytes(raw[:-4])).to_bytes(4, "big")
    with pytest.raises(RecordError, match="feature level 1"):
        codec.decode_checkpoint(bytes(raw))
