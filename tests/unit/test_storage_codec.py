"""The byte formats of dledger/storage/codec.py (docs/FORMAT.md)."""

from __future__ import annotations

import struct

import crc32c
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dledger.log import HardState
from dledger.storage import codec
from dledger.storage.codec import (
    BLANK_SIZE,
    ENTRY_HEADER_SIZE,
    Checkpoint,
    ItemKind,
    RecordError,
)

u64 = st.integers(min_value=0, max_value=(1 << 64) - 1)


def test_header_layout_is_documented_bytes() -> None:
    raw = codec.encode_entry(index=7, term=3, position=4096, body=b"hello", type=1)
    assert len(raw) == ENTRY_HEADER_SIZE + 5
    assert raw[0:4] == b"DLE1"
    assert struct.unpack(">I", raw[4:8])[0] == 53
    assert struct.unpack(">Q", raw[8:16])[0] == 7
    assert struct.unpack(">Q", raw[16:24])[0] == 3
    assert struct.unpack(">Q", raw[24:32])[0] == 4096
    assert raw[32] == 1 and raw[33] == codec.FORMAT_VERSION
    assert raw[34:36] == b"\0\0"
    assert struct.unpack(">I", raw[36:40])[0] == 5
    assert struct.unpack(">I", raw[40:44])[0] == crc32c.crc32c(b"hello")
    assert struct.unpack(">I", raw[44:48])[0] == crc32c.crc32c(raw[0:44])
    assert raw[48:] == b"hello"


@settings(max_examples=100, deadline=None)
@given(
    index=u64,
    term=u64,
    position=u64,
    body=st.binary(max_size=3000),
    typ=st.integers(0, 255),
)
def test_entry_round_trip(index: int, term: int, position: int, body: bytes, typ: int) -> None:
    raw = codec.encode_entry(index=index, term=term, position=position, body=body, type=typ)
    h = codec.verify_entry(raw, 0, expected_position=position)
    assert (h.index, h.term, h.position, h.type, h.body_size) == (
        index,
        term,
        position,
        typ,
        len(body),
    )
    assert h.total_size == len(raw)
    assert raw[ENTRY_HEADER_SIZE:] == body


@settings(max_examples=100, deadline=None)
@given(body=st.binary(min_size=1, max_size=200), data=st.data())
def test_any_single_bit_flip_is_detected(body: bytes, data: st.DataObject) -> None:
    raw = bytearray(codec.encode_entry(index=1, term=1, position=0, body=body))
    bit = data.draw(st.integers(0, len(raw) * 8 - 1))
    raw[bit // 8] ^= 1 << (bit % 8)
    with pytest.raises(RecordError):
        codec.verify_entry(raw, 0, expected_position=0)


def test_encode_rejects_bad_values() -> None:
    with pytest.raises(ValueError):
        codec.encode_entry(index=-1, term=0, position=0, body=b"")
    with pytest.raises(ValueError):
        codec.encode_entry(index=1, term=0, position=0, body=b"", type=256)


def test_blank_record() -> None:
    raw = codec.encode_blank(position=100, length=64)
    assert len(raw) == BLANK_SIZE and raw[:4] == b"BLNK"
    assert codec.decode_blank(raw) == (64, 100)
    bad = bytearray(raw)
    bad[9] ^= 1
    with pytest.raises(RecordError):
        codec.decode_blank(bytes(bad))
    with pytest.raises(ValueError):
        codec.encode_blank(position=0, length=BLANK_SIZE - 1)


def _segment(entries: list[bytes], size: int, base: int = 0, blank: bool = True) -> bytearray:
    buf = bytearray(size)
    off = 0
    for i, body in enumerate(entries, start=1):
        off += codec.encode_entry_into(buf, off, index=i, term=1, position=base + off, body=body)
    if blank and size - off >= BLANK_SIZE:
        buf[off : off + BLANK_SIZE] = codec.encode_blank(position=base + off, length=size - off)
    return buf


def test_iter_segment_entries_then_blank() -> None:
    buf = _segment([b"a" * 10, b"b" * 20], 1000, base=5000)
    items = list(codec.iter_segment(buf, 5000))
    assert [i.kind for i in items] == [ItemKind.ENTRY, ItemKind.ENTRY, ItemKind.BLANK]
    assert [i.position for i in items] == [5000, 5058, 5126]
    assert items[-1].size == 1000 - 126


def test_iter_segment_end_padding_and_corrupt() -> None:
    buf = _segment([b"a" * 10], 1000, blank=False)
    assert [i.kind for i in codec.iter_segment(buf, 0)][-1] is ItemKind.END
    # Exactly full: no room for anything, not even a blank.
    full = _segment([b"x" * (200 - ENTRY_HEADER_SIZE)], 200)
    assert [i.kind for i in codec.iter_segment(full, 0)] == [ItemKind.ENTRY, ItemKind.PADDING]
    # Fewer than BLANK_SIZE bytes left: padding, no blank record.
    short = _segment([b"x" * (200 - ENTRY_HEADER_SIZE - 7)], 200)
    kinds = [i.kind for i in codec.iter_segment(short, 0)]
    assert kinds == [ItemKind.ENTRY, ItemKind.PADDING]
    assert short[193:] == bytes(7)
    # Garbage magic.
    bad = _segment([b"a"], 1000, blank=False)
    bad[49:53] = b"JUNK"
    items = list(codec.iter_segment(bad, 0))
    assert items[-1].kind is ItemKind.CORRUPT and items[-1].offset == 49


def test_iter_segment_rejects_misplaced_entry() -> None:
    buf = bytearray(1000)
    buf[0:58] = codec.encode_entry(index=1, term=1, position=999, body=b"x" * 10)
    items = list(codec.iter_segment(buf, 0))
    assert items[0].kind is ItemKind.CORRUPT and "position" in items[0].reason


def test_find_valid_entry() -> None:
    buf = bytearray(2000)
    raw = codec.encode_entry(index=9, term=1, position=777, body=b"zz")
    buf[777 : 777 + len(raw)] = raw
    buf[100:104] = codec.ENTRY_MAGIC_BYTES  # a lone magic is not an entry
    assert codec.find_valid_entry(buf, 0, 0) == 777
    assert codec.find_valid_entry(bytes(buf), 0, 778) == -1
    assert codec.find_valid_entry(memoryview(buf), 0, 0) == 777


def test_iter_entries_decodes_a_raw_batch() -> None:
    raw = codec.encode_entry(index=1, term=2, position=0, body=b"a") + codec.encode_entry(
        index=2, term=2, position=49, body=b"bc", type=17
    )
    got = list(codec.iter_entries(raw))
    assert [(e.index, e.term, e.body, e.type) for e in got] == [(1, 2, b"a", 0), (2, 2, b"bc", 17)]
    with pytest.raises(RecordError):
        list(codec.iter_entries(raw[:-1]))


@settings(max_examples=50, deadline=None)
@given(size=st.integers(1, 1 << 30), pos=u64, term=u64, typ=st.integers(0, 255), chain=u64)
def test_index_record_round_trip(size: int, pos: int, term: int, typ: int, chain: int) -> None:
    raw = codec.encode_index_record(size=size, position=pos, term=term, type=typ, chain=chain)
    assert len(raw) == codec.INDEX_RECORD_SIZE == 64 and raw[:4] == b"IDX2"
    rec = codec.decode_index_record(raw, 0)
    assert (rec.size, rec.position, rec.term, rec.type, rec.chain) == (size, pos, term, typ, chain)
    bad = bytearray(raw)
    bad[20] ^= 0x10
    with pytest.raises(RecordError):
        codec.decode_index_record(bytes(bad), 0)


@settings(max_examples=50, deadline=None)
@given(st.tuples(u64, u64, u64, u64, u64, u64, u64), st.integers(1, 3))
def test_checkpoint_round_trip(fields: tuple[int, ...], level: int) -> None:
    """Format 2 (0.2.0's bytes) at the baseline feature level, format 3 from level 2."""
    version = codec.CHECKPOINT_VERSION if level >= 2 else codec.CHECKPOINT_VERSION_V2
    c = Checkpoint(*fields, feature_level=level, version=version)
    raw = codec.encode_checkpoint(c)
    size = codec.CHECKPOINT_SIZE if level >= 2 else codec.CHECKPOINT_SIZE_V2
    assert len(raw) == size and raw[:4] == b"CKPT"
    assert int.from_bytes(raw[4:6], "big") == version
    assert codec.decode_checkpoint(raw) == c
    for i in range(len(raw)):
        bad = bytearray(raw)
        bad[i] ^= 0x01
        # A flip in the version that makes it larger is damage too, not a newer release's
        # file: the CRC says so (docs/FORMAT.md "Format versions").
        with pytest.raises(RecordError):
            codec.decode_checkpoint(bytes(bad))


@settings(max_examples=50, deadline=None)
@given(term=u64, voted=st.one_of(st.none(), st.text(max_size=40)))
def test_hard_state_round_trip(term: int, voted: str | None) -> None:
    s = HardState(term=term, voted_for=voted)
    raw = codec.encode_hard_state(s)
    assert codec.decode_hard_state(raw) == s
    with pytest.raises(RecordError):
        codec.decode_hard_state(raw[:-1])
    bad = bytearray(raw)
    bad[10] ^= 0x80
    with pytest.raises(RecordError):
        codec.decode_hard_state(bytes(bad))
