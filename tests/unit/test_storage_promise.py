"""The promise file (dledger/storage/promise.py, docs/FORMAT.md "Promise file")."""

from __future__ import annotations

import struct
from pathlib import Path

import crc32c
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
    return Promise("g0", "n0", index, HardState(term, vote), seq, index)


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


@pytest.mark.parametrize("offset", [0, 5, 9, 20, 28, 33, 41, 48, 52, 70, SLOT_BYTES - 1])
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
    assert got == Promise("g0", "n0", 12, HardState(3, None), 3, 12)
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


def test_slot_layout_is_the_documented_bytes() -> None:
    """docs/FORMAT.md "Promise file": every field at its offset."""
    raw = encode_slot(Promise("grp", "n7", 0x0102030405060708, HardState(9, "n1"), 6, 5))
    assert raw[0:4] == b"PRMS"
    assert struct.unpack(">HH", raw[4:8]) == (1, 0)
    assert struct.unpack(">QQQQ", raw[8:40]) == (6, 0x0102030405060708, 5, 9)
    assert struct.unpack(">HHHH", raw[40:48]) == (3, 2, 2, 0)
    assert raw[48:55] == b"grpn7n1"
    assert struct.unpack(">I", raw[55:59])[0] == crc32c.crc32c(raw[:55])
    assert not any(raw[59:])
    no_vote = encode_slot(Promise("g", "n", 1, HardState(1, None)))
    assert struct.unpack(">QH", no_vote[24:32] + no_vote[44:46]) == (1, 0xFFFF)


def test_the_durable_index_is_written_and_bounded(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="durable_index 9 above"):
        encode_slot(Promise("g", "n", 8, HardState(), 1, 9))
    w = PromiseWriter(tmp_path / "p", "g", "n", None)
    w.write(10, HardState(1), durable_index=7)  # the log's flush runs beside it
    got = read_promise(tmp_path / "p")
    assert got is not None and (got.promised_index, got.durable) == (10, 7)
    w.write(11, HardState(1))  # written after the flush: all of it is durable
    got = read_promise(tmp_path / "p")
    assert got is not None and got.durable == 11
    w.close()


def _slots(path: Path) -> tuple[bytes, bytes]:
    data = path.read_bytes()
    return data[:SLOT_BYTES], data[SLOT_BYTES:]


def test_a_promise_ahead_covers_the_next_acks_which_only_refresh_the_exact_one(
    tmp_path: Path,
) -> None:
    """docs/RAFT.md section 11: one durable write promises 100 entries ahead; the rounds
    under it record the exact promise without fdatasync, always in the other slot."""
    path = promise_path(tmp_path, "n0")
    hs = HardState(2, "n1")
    w = PromiseWriter(path, "g0", "n0", None)
    w.write_ahead(10, hs, 8, 100)
    assert (w.ceiling, w.syncs) == (110, 1)
    anchor = read_promise(path)
    assert anchor is not None and (anchor.promised_index, anchor.durable) == (110, 8)
    anchor_slot = _slots(path)[anchor.sequence % 2]
    for index in range(11, 111):
        assert w.refresh(index, hs, index)
        got = read_promise(path)  # what a restarted process reads: the exact promise
        assert got is not None and (got.promised_index, got.durable) == (index, index)
        assert _slots(path)[anchor.sequence % 2] == anchor_slot  # the anchor is never touched
    assert w.syncs == 1  # a hundred acknowledgements, no fdatasync
    assert not w.refresh(110, hs, 110)  # nothing new: no write
    with pytest.raises(ValueError, match="beyond the durable promise"):
        w.refresh(111, hs, 111)
    with pytest.raises(ValueError, match="new hard state"):
        w.refresh(50, HardState(3, None), 50)
    w.sync()
    assert w.syncs == 2
    w.close()


def test_a_power_cut_that_loses_the_refreshes_leaves_a_promise_that_covers_every_ack(
    tmp_path: Path,
) -> None:
    """The refreshes lost (never written back) or torn: the reader gets the durable promise,
    at or above every acknowledgement, with a durable index the log still holds (so a
    whole group's power cut does not make its members repair: dledger.server.promises)."""
    path = promise_path(tmp_path, "n0")
    hs = HardState(2, "n1")
    w = PromiseWriter(path, "g0", "n0", None)
    w.write(5, hs)
    w.write_ahead(6, hs, 5, 100)
    on_disk = path.read_bytes()  # all that was made durable
    for index in range(7, 60):
        w.refresh(index, hs, index)
    refreshed = path.read_bytes()
    w.close()
    for lost in (on_disk, _torn_refresh(on_disk, refreshed)):
        got = decode_promise(lost)
        assert got.promised_index >= 59 and got.durable <= 6


def _torn_refresh(on_disk: bytes, refreshed: bytes) -> bytes:
    """The refreshed slot torn inside its record: its first 40 bytes new, the rest old."""
    at = next(
        i
        for i in range(0, FILE_BYTES, SLOT_BYTES)
        if on_disk[i : i + SLOT_BYTES] != refreshed[i : i + SLOT_BYTES]
    )
    return on_disk[:at] + refreshed[at : at + 40] + on_disk[at + 40 :]


def test_a_restarted_writer_keeps_the_newest_slot_and_writes_durably_first(
    tmp_path: Path,
) -> None:
    """A new process may find its last refresh in the page cache only: the writer makes the
    file durable when it opens it, takes the newest slot as its anchor, and promises nothing
    beyond it without a durable write."""
    path = promise_path(tmp_path, "n0")
    hs = HardState(2, "n1")
    w = PromiseWriter(path, "g0", "n0", None)
    w.write_ahead(10, hs, 9, 50)
    w.refresh(20, hs, 20)
    w.close()
    got = read_promise(path)
    assert got is not None and got.promised_index == 20
    w2 = PromiseWriter(path, "g0", "n0", got)
    w2.restart_from(20)
    assert w2.ceiling == 0  # nothing covered before a durable write of this process
    newest_at = next(
        i for i, slot in enumerate(_slots(path)) if (d := decode_slot(slot)) and d == got
    )
    newest = _slots(path)[newest_at]
    w2.write_ahead(21, hs, 20, 50)
    assert _slots(path)[newest_at] == newest  # the slot it read is not overwritten
    assert w2.ceiling == 71
    w2.refresh(22, hs, 22)
    assert read_promise(path) == Promise("g0", "n0", 22, hs, got.sequence + 2, 22)
    w2.close()
