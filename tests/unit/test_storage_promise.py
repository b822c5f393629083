"""The promise file (dledger/storage/promise.py, docs/FORMAT.md "Promise file")."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from dledger.log import HardState
from dledger.storage.promise import (
    FILE_BYTES,
    PROMISE_MAGIC,
    SLOT_BYTES,
    Promise,
    PromiseError,
    PromiseVersionError,
    PromiseWriter,
    decode_promise,
    decode_slot,
    encode_slot,
    promise_path,
    promise_path_for_store,
    read_promise,
)


def _p(index: int = 7, term: int = 3, vote: str | None = "n1", seq: int = 1) -> Promise:
    return Promise("g0", "n0", index, HardState(term, vote), seq)


def test_paths_are_siblings_of_the_store_directory(tmp_path: Path) -> None:
    assert promise_path(tmp_path, "n0") == tmp_path / "dledger-n0.promise"
    assert promise_path_for_store(tmp_path / "dledger-n0") == promise_path(tmp_path, "n0")


@pytest.mark.parametrize("vote", [None, "n1", "x" * 255])
def test_slot_round_trip(vote: str | None) -> None:
    p = _p(vote=vote, index=(1 << 64) - 1, term=(1 << 63) - 1, seq=42)
    raw = encode_slot(p)
    assert len(raw) == SLOT_BYTES
    assert struct.unpack(">I", raw[:4])[0] == PROMISE_MAGIC
    assert decode_slot(raw) == p


def test_empty_slot_is_none_and_bad_fields_refused() -> None:
    assert decode_slot(bytes(SLOT_BYTES)) is None
    with pytest.raises(ValueError):
        encode_slot(Promise("", "n0", 1, HardState()))
    with pytest.raises(ValueError):
        encode_slot(Promise("g", "n0", -1, HardState()))
    with pytest.raises(ValueError):
        encode_slot(Promise("g", "n" * 256, 1, HardState()))


@pytest.mark.parametrize("offset", [0, 5, 9, 20, 33, 40, 44, 60, SLOT_BYTES - 1])
def test_any_flipped_byte_is_detected(offset: int) -> None:
    raw = bytearray(encode_slot(_p()))
    raw[offset] ^= 0x40
    with pytest.raises(PromiseError):
        decode_slot(bytes(raw))


def test_newer_version_is_refused_naming_both_versions() -> None:
    raw = bytearray(encode_slot(_p()))
    raw[4:6] = (2).to_bytes(2, "big")
    with pytest.raises(PromiseVersionError, match=r"version 2 .* version 1"):
        decode_slot(bytes(raw))
    # Also when the other slot is valid: a newer writer was here.
    with pytest.raises(PromiseVersionError):
        decode_promise(bytes(raw) + encode_slot(_p(seq=2)))


def test_the_newest_valid_slot_wins_and_a_torn_slot_is_skipped() -> None:
    old, new = encode_slot(_p(index=5, seq=4)), encode_slot(_p(index=9, seq=5))
    assert decode_promise(old + new).promised_index == 9
    assert decode_promise(new + old).promised_index == 9
    torn = bytearray(new)
    torn[30] ^= 1
    assert decode_promise(old + bytes(torn)).promised_index == 5
    with pytest.raises(PromiseError, match="no valid slot"):
        decode_promise(bytes(torn) + bytes(torn))
    with pytest.raises(PromiseError, match="bytes, expected"):
        decode_promise(old)


def test_writer_creates_then_alternates_slots_and_skips_what_does_not_grow(
    tmp_path: Path,
) -> None:
    path = promise_path(tmp_path, "n0")
    assert read_promise(path) is None
    w = PromiseWriter(path, "g0", "n0", None)
    assert w.write(10, HardState(2, "n1"))
    assert path.stat().st_size == FILE_BYTES
    assert not w.write(10, HardState(2, "n1"))  # nothing new: no write, no fsync
    assert not w.write(4, HardState(2, "n1"))  # the promise never goes down
    assert w.write(12, HardState(2, "n1"))
    assert w.write(12, HardState(3, None))  # a hard state change alone is written
    assert w.writes == 3
    got = read_promise(path)
    assert got == Promise("g0", "n0", 12, HardState(3, None), 3)
    w.close()
    # A new writer continues the sequence; both slots are in use.
    w2 = PromiseWriter(path, "g0", "n0", got)
    assert w2.write(13, HardState(3, None))
    data = path.read_bytes()
    seqs = sorted(
        p.sequence for p in (decode_slot(data[:SLOT_BYTES]), decode_slot(data[SLOT_BYTES:])) if p
    )
    assert seqs == [3, 4]
    w2.close()


def test_writer_refuses_another_members_file(tmp_path: Path) -> None:
    path = promise_path(tmp_path, "n0")
    PromiseWriter(path, "g0", "n0", None).write(1, HardState())
    other = read_promise(path)
    with pytest.raises(PromiseError, match="belongs to group 'g0' member 'n0'"):
        PromiseWriter(path, "g0", "n1", other)


def test_read_promise_names_the_file_when_damaged(tmp_path: Path) -> None:
    path = tmp_path / "p.promise"
    path.write_bytes(b"garbage")
    with pytest.raises(PromiseError, match=str(path)):
        read_promise(path)
