"""Pieces of the audit that need no Spark: the CRC combine and the merging of findings."""

from __future__ import annotations

import os

import crc32c
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spark_audit.crc import crc32c_combine
from spark_audit.model import Finding, What, to_i64, to_u64
from spark_audit.report import merge_findings


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=300), st.binary(max_size=300))
def test_crc_combine_equals_the_crc_of_the_concatenation(a: bytes, b: bytes) -> None:
    assert crc32c_combine(crc32c.crc32c(a), crc32c.crc32c(b), len(b)) == crc32c.crc32c(a + b)


def test_crc_combine_of_many_pieces() -> None:
    pieces = [os.urandom(n) for n in (25, 250, 0, 25 * 1000, 7)]
    acc = 0
    for p in pieces:
        acc = crc32c_combine(acc, crc32c.crc32c(p), len(p))
    assert acc == crc32c.crc32c(b"".join(pieces))
    with pytest.raises(ValueError):
        crc32c_combine(0, 0, -1)


def test_u64_round_trips_through_signed_64_bit() -> None:
    for v in (0, 1, (1 << 63) - 1, 1 << 63, (1 << 64) - 1):
        assert -(1 << 63) <= to_i64(v) < 1 << 63
        assert to_u64(to_i64(v)) == v


def test_pieces_of_one_problem_from_several_tasks_are_merged() -> None:
    seg = "00000000000004194304"
    a = Finding(What.MISSING_ENTRIES, "g", "n2", seg, "p", 100, 199, 4096, "ends", count=100)
    b = Finding(What.MISSING_ENTRIES, "g", "n2", seg, "p", 200, 250, 4096, "ends", count=51)
    d1 = Finding(What.DIVERGENT_ENTRY, "g", "n0", seg, "p", 300, 300, 10, "x", "n1", 2)
    d2 = Finding(What.DIVERGENT_ENTRY, "g", "n0", seg, "p", 120, 120, 5, "y", "n1", 3)
    merged = merge_findings([b, d1, a, d2])
    missing = [f for f in merged if f.what is What.MISSING_ENTRIES]
    assert [(f.index, f.index_end, f.count, f.offset) for f in missing] == [(100, 250, 151, 4096)]
    (div,) = [f for f in merged if f.what is What.DIVERGENT_ENTRY]
    assert (div.index, div.offset, div.count) == (120, 5, 5)
