"""The store keeps each entry's chained checksum with its index record (format 2) and the
chain at its base in the checkpoint; a store written by the previous release (format 1) is
migrated on open, a later format is refused (issue 31, item 1)."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from dledger.chain import CHAIN_ORIGIN, CHAIN_UNKNOWN, next_chain
from dledger.log import CorruptLogError, Entry, FormatTooNewError
from dledger.storage import codec
from dledger.storage.store import SegmentedLogStore, StoreConfig

CFG = StoreConfig(segment_size_bytes=64 * 1024, index_segment_size_bytes=64 * 1024)
N = 1500  # entries: several data and index segments


def _entries(n: int = N) -> list[Entry]:
    return [Entry(1 + i // 500, i, b"body-%d" % i * (4 + i % 7), i % 3) for i in range(1, n + 1)]


def _chains(entries: list[Entry]) -> list[int]:
    out = [CHAIN_ORIGIN]
    for e in entries:
        out.append(next_chain(out[-1], e.index, e.term, e.type, e.body))
    return out


def _store(root: Path, entries: list[Entry]) -> SegmentedLogStore:
    s = SegmentedLogStore(root, CFG)
    for k in range(0, len(entries), 100):  # batches crossing segment and index files
        s.append(entries[k : k + 100])
    s.flush()
    return s


def test_chain_at_matches_the_function_and_survives_reopen_and_crash_recovery(
    tmp_path: Path,
) -> None:
    entries = _entries()
    want = _chains(entries)
    s = _store(tmp_path / "s", entries)
    assert [s.chain_at(i) for i in range(N + 1)] == want
    s.close()
    s = SegmentedLogStore(tmp_path / "s", CFG)
    assert [s.chain_at(i) for i in range(N + 1)] == want
    s.close()
    # A crash: the checkpoint lags, recovery rescans the last segment and rebuilds records.
    (tmp_path / "s" / "abort").touch()
    s = SegmentedLogStore(tmp_path / "s", CFG)
    assert s.recovered_from_crash
    assert s.chain_at(N) == want[N] and s.chain_at(N // 2) == want[N // 2]
    s.close()


def test_truncate_and_delete_prefix_keep_the_chain(tmp_path: Path) -> None:
    entries = _entries()
    want = _chains(entries)
    s = _store(tmp_path / "s", entries)
    s.truncate_suffix(1000)
    assert s.chain_at(999) == want[999]
    other = Entry(entries[999].term, 1000, b"another body")
    s.append([other])
    assert s.chain_at(1000) == next_chain(want[999], 1000, other.term, other.type, other.body)
    first = s.delete_prefix(s.segment_infos()[1].last_index)
    assert first > 1
    assert s.chain_at(first - 1) == want[first - 1]  # the base keeps its chain
    s.close()
    s = SegmentedLogStore(tmp_path / "s", CFG)
    assert s.chain_at(first - 1) == want[first - 1] and s.chain_at(999) == want[999]
    assert s.read_checkpoint().base_chain == want[first - 1]
    s.close()


def _write_format_1(root: Path) -> None:
    """Turn a closed store of this release into one the previous release wrote: 32-byte
    IDX1 index records without chains, a 68-byte checkpoint of version 1."""
    ckpt = codec.decode_checkpoint((root / "checkpoint").read_bytes())
    head = codec.CHECKPOINT_NO_CRC_V1.pack(
        codec.CHECKPOINT_MAGIC,
        1,
        0,
        ckpt.flushed_position,
        ckpt.flushed_index,
        ckpt.commit_index,
        ckpt.applied_index,
        ckpt.base_index,
        ckpt.base_term,
        ckpt.truncate_pending_position,
    )
    (root / "checkpoint").write_bytes(head + codec.U32.pack(codec.crc32c(head)))
    v1 = struct.Struct(">IIQQB3x")
    for f in (root / "index").iterdir():
        data = bytearray(f.stat().st_size)
        old = f.read_bytes()
        for k in range(len(old) // codec.INDEX_RECORD_SIZE):
            rec = old[k * 64 : k * 64 + 64]
            if rec[:4] != b"IDX2":
                continue
            r = codec.decode_index_record(rec, 0)
            h = v1.pack(codec.INDEX_MAGIC_V1, r.size, r.position, r.term, r.type)
            data[k * 32 : k * 32 + 32] = h + codec.U32.pack(codec.crc32c(h))
        f.write_bytes(bytes(data))


def test_a_store_of_the_previous_format_opens_and_gets_its_chains(tmp_path: Path) -> None:
    entries = _entries()
    want = _chains(entries)
    _store(tmp_path / "s", entries).close()
    _write_format_1(tmp_path / "s")
    s = SegmentedLogStore(tmp_path / "s", CFG)
    assert [s.chain_at(i) for i in range(N + 1)] == want
    assert [e.body for e in s.read_range(1, 1 << 30)] == [e.body for e in entries]
    assert s.read_checkpoint().version == codec.CHECKPOINT_VERSION_V2  # level 1's format
    s.close()


def test_a_migrated_store_whose_prefix_was_deleted_has_an_unknown_chain(tmp_path: Path) -> None:
    entries = _entries()
    s = _store(tmp_path / "s", entries)
    first = s.delete_prefix(s.segment_infos()[1].last_index)
    assert first > 1
    s.close()
    _write_format_1(tmp_path / "s")
    s = SegmentedLogStore(tmp_path / "s", CFG)
    # The chain below the deleted prefix cannot be rebuilt: unknown, never a wrong value.
    assert s.chain_at(first - 1) == CHAIN_UNKNOWN and s.chain_at(N) == CHAIN_UNKNOWN
    s.append([Entry(entries[-1].term, N + 1, b"next")])
    assert s.chain_at(N + 1) == CHAIN_UNKNOWN
    assert s.read(N).body == entries[-1].body
    s.close()


def test_a_checkpoint_of_a_newer_format_is_refused_naming_both_versions(tmp_path: Path) -> None:
    _store(tmp_path / "s", _entries(10)).close()
    path = tmp_path / "s" / "checkpoint"
    data = bytearray(path.read_bytes())
    data[4:6] = (4).to_bytes(2, "big")
    # A whole file, as a newer release would write it: its CRC matches.
    data[-4:] = codec.crc32c(bytes(data[:-4])).to_bytes(4, "big")
    path.write_bytes(bytes(data))
    with pytest.raises(FormatTooNewError) as info:
        SegmentedLogStore(tmp_path / "s", CFG)
    assert info.value.code == "FORMAT_TOO_NEW" and not isinstance(info.value, CorruptLogError)
    assert "format version 4 is newer than 3" in str(info.value)
