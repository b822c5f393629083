"""Pieces of the audit that need no Spark: the CRC combine, the merging of findings and the
fast path's batch checks."""

from __future__ import annotations

import io
import os
import random

import crc32c
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dledger.storage import codec
from dledger.storage.codec import ENTRY_HEADER_SIZE
from spark_audit import batch, derived, merkle, plan
from spark_audit.crc import crc32c_combine
from spark_audit.model import ORDERED_KEY, Finding, What, entry_digest, to_i64, to_u64
from spark_audit.report import (
    AuditReport,
    Checksums,
    GroupReport,
    ReplicaSummary,
    SegmentSummary,
    merge_findings,
    report_json,
    write_summary,
)


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


# ---------------------------------------------------------------------------------------
# The fast path's batch checks against the codec's one-at-a-time ones
# ---------------------------------------------------------------------------------------


def _entries(sizes: list[int], seed: int) -> tuple[bytes, list[int]]:
    """Valid entries end to end (bodies of ``sizes``); returns the bytes and the offsets."""
    rng = random.Random(seed)
    out = bytearray()
    offs = []
    for i, n in enumerate(sizes):
        offs.append(len(out))
        body = rng.randbytes(n)
        out += codec.encode_entry(index=i + 1, term=1 + i // 7, position=len(out), body=body)
    return bytes(out), offs


def _bodies_ok(data: bytes, offs: list[int]) -> list[bool]:
    arr = np.frombuffer(data, dtype=np.uint8)
    heads = np.stack([arr[o : o + ENTRY_HEADER_SIZE] for o in offs])
    h = heads.view(batch.HEADER_DTYPE).reshape(len(offs))
    return batch.bodies_ok(
        data,
        np.array(offs, dtype=np.intp),
        h["total"].astype(np.uint64),
        h["header_crc"].astype(np.uint64),
        h["body_crc"].astype(np.uint64),
    ).tolist()


def _reference(data: bytes, offs: list[int]) -> list[bool]:
    out = []
    for o in offs:
        try:
            codec.verify_entry(data, o)
            out.append(True)
        except codec.RecordError:
            out.append(False)
    return out


@pytest.mark.parametrize(
    "sizes",
    [
        [100] * 700,  # one run: one CRC call for all
        [0] * 300 + [1] * 300,  # empty bodies, then a 1-byte run
        [37] * 10 + [4000] * 300 + [5] * 3 + [128] * 257,  # short and long runs
        list(range(1, 400)),  # every size once: one call per entry
    ],
)
def test_body_crcs_of_runs_match_the_codec(sizes: list[int]) -> None:
    data, offs = _entries(sizes, seed=len(sizes))
    assert _bodies_ok(data, offs) == [True] * len(sizes)
    rng = random.Random(7)
    for _ in range(25):
        bad = bytearray(data)
        picks = rng.sample(range(len(offs)), rng.choice((1, 1, 2, 3)))
        for i in picks:
            body = sizes[i]
            if body == 0:
                continue
            at = offs[i] + ENTRY_HEADER_SIZE + rng.randrange(body)
            bad[at] ^= 1 << rng.randrange(8)
        assert _bodies_ok(bytes(bad), offs) == _reference(bytes(bad), offs)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.binary(min_size=1, max_size=40), min_size=1, max_size=20))
def test_crc_of_rows_equals_crc32c(rows: list[bytes]) -> None:
    width = max(len(r) for r in rows)
    padded = [r.ljust(width, b"\x5a") for r in rows]
    arr = np.frombuffer(b"".join(padded), dtype=np.uint8).reshape(len(rows), width)
    assert batch.crc32c_rows(arr).tolist() == [crc32c.crc32c(r) for r in padded]


def test_digests_and_ordered_checksum_match_the_model() -> None:
    rng = random.Random(3)
    n = 300
    terms = [rng.randrange(1 << 64) for _ in range(n)]
    types = [rng.randrange(256) for _ in range(n)]
    sizes = [rng.randrange(1 << 32) for _ in range(n)]
    crcs = [rng.randrange(1 << 32) for _ in range(n)]
    t64 = np.array(terms, dtype=np.uint64)
    ty8 = np.array(types, dtype=np.uint8)
    s64 = np.array(sizes, dtype=np.uint64)
    c64 = np.array(crcs, dtype=np.uint64)
    digests = batch.content_digests(t64, ty8, s64, c64).tolist()
    assert digests == [entry_digest(*v) for v in zip(terms, types, sizes, crcs, strict=True)]
    first, seed = 1 << 40, 0x1234
    expected = seed
    for i, v in enumerate(zip(terms, types, sizes, crcs, strict=True)):
        expected = crc32c.crc32c(ORDERED_KEY.pack(first + i, *v), expected)
    assert batch.ordered_crc(first, t64, ty8, s64, c64, seed) == expected


def test_summary_and_json_give_each_replicas_throughput() -> None:
    seg = SegmentSummary("00000000000000000000", Checksums(count=10, bytes=30_000_000))
    seg.tail_bytes = 10_000_000
    replica = ReplicaSummary("n0", "/s/n0", 1, 10, segments={seg.file: seg})
    group = GroupReport("g", 10, "checkpoints", 1, [replica], [], [])
    report = AuditReport([group], "local[2]", 5.0, 2.0, 3, workers_start_s=1.5)
    (r,) = report_json(report)["groups"][0]["replicas"]
    assert (r["scanned_bytes"], r["mb_per_s"]) == (40_000_000, 20.0)
    assert report_json(report)["workers_start_s"] == 1.5
    out = io.StringIO()
    write_summary(report, out)
    header, _, row = out.getvalue().splitlines()[1:4]
    assert header.split()[-2:] == ["MB/s", "status"]
    assert row.split()[-2:] == ["20", "ok"]
    assert "Python workers start 1.5 s" in out.getvalue()


# ---------------------------------------------------------------------------------------
# Range digests (spark_audit.merkle) and the broker constants the executors repeat
# ---------------------------------------------------------------------------------------


def _leaves(n: int, changed: dict[int, int] | None = None) -> dict[int, merkle.Leaf]:
    return {k: merkle.Leaf(4096, (changed or {}).get(k, k * 7919)) for k in range(n)}


def test_leaf_sums_of_pieces_add_up_to_the_whole() -> None:
    rng = np.random.default_rng(7)
    n = 10_000
    terms = rng.integers(1, 5, n, dtype=np.uint64)
    digests = rng.integers(0, 1 << 63, n, dtype=np.uint64)
    held = rng.random(n) > 0.01
    whole = {k: (c, v) for k, c, v in merkle.leaf_sums(1, terms, digests, held, 1000)}
    acc: dict[int, merkle.Leaf] = {}
    for a, b in ((0, 1234), (1234, 1500), (1500, n)):  # pieces cut inside leaves
        for k, c, v in merkle.leaf_sums(1 + a, terms[a:b], digests[a:b], held[a:b], 1000):
            acc[k] = acc.get(k, merkle.Leaf(0, 0)).add(c, v)
    assert {k: (x.count, x.sum) for k, x in acc.items()} == whole
    assert sorted(whole) == list(range(10)) and whole[0][0] == int(held[:1000].sum())
    # Any change of term, digest or index changes the leaf.
    t2 = terms.copy()
    t2[5] += np.uint64(1)
    assert (
        merkle.leaf_sums(1, t2, digests, held, 1000)[0]
        != merkle.leaf_sums(1, terms, digests, held, 1000)[0]
        or not held[5]
    )
    assert merkle.leaf_sums(2, terms, digests, held, 1000)[0][2] != whole[0][1]


def test_descent_looks_only_into_differing_subtrees() -> None:
    n = 5000  # 3 levels above the leaves with fan-out 16 (5000 -> 313 -> 20 -> 2 -> 1)
    a = merkle.Tree(_leaves(n), n)
    b = merkle.Tree(_leaves(n, {4321: 1}), n)
    c = merkle.Tree(_leaves(n), n)
    d = merkle.descend({"a": a, "b": b, "c": c})
    assert d.differing_leaves == (4321,)
    assert d.rounds == len(a.levels) == 5
    # The root, its 2 children, the 4 under the second (20 nodes on that level), 16, 16.
    assert d.nodes_compared == 1 + 2 + 4 + 16 + 16
    assert merkle.descend({"a": a, "c": c}) == merkle.Descent((), 1, 1)


def test_a_replica_is_named_only_against_a_strict_majority() -> None:
    x, y, z = merkle.Leaf(64, 1), merkle.Leaf(64, 2), merkle.Leaf(63, 3)
    v = merkle.judge_leaf(3, {"n0": x, "n1": y, "n2": x})
    assert (v.majority, v.agreeing, v.disagreeing) == (x, ("n0", "n2"), ("n1",))
    split = merkle.judge_leaf(3, {"n0": x, "n1": y, "n2": z})
    assert split.majority is None and split.disagreeing == ("n0", "n1", "n2")
    assert merkle.judge_leaf(3, {"n0": x, "n1": y}).majority is None


def test_the_executors_copies_of_broker_and_server_constants_are_equal() -> None:
    from broker.state import consumequeue, indexfile, names
    from broker.state import timerrules as timer
    from dledger.server import membership

    assert derived.CQ_RECORD_BYTES == consumequeue.CQ_RECORD_SIZE
    assert derived.CQ_DTYPE.itemsize == consumequeue.CQ_RECORD.size
    assert derived.CQ_FILE_NAME_DIGITS == consumequeue.FILE_NAME_DIGITS
    assert (derived.SCHEDULE_TOPIC, derived.TIMER_TOPIC) == (
        names.SCHEDULE_TOPIC,
        names.TIMER_TOPIC,
    )
    assert derived.HOP_RECORD_BYTES == timer.HOP_RECORD_SIZE
    assert derived.KEY_INDEX_MAGIC == indexfile.INDEX_MAGIC
    assert derived.KEY_INDEX_VERSION == indexfile.INDEX_VERSION
    assert derived.KEY_INDEX_HEADER.format == indexfile.INDEX_HEADER_NO_CRC.format
    assert derived.KEY_INDEX_HEADER_BYTES == indexfile.INDEX_HEADER_SIZE
    assert derived.KEY_INDEX_CRC_AT == indexfile.INDEX_HEADER_CRC_OFFSET
    assert derived.KEY_RECORD_BYTES == indexfile.INDEX_RECORD_SIZE
    assert derived.KEY_INDEX_MAX_RECORDS == indexfile.MAX_RECORDS_LIMIT
    assert derived.KEY_SEPARATOR == indexfile.KEY_SEPARATOR
    assert derived._key_hash("T#k1") == indexfile.key_hash("T#k1")
    assert plan.MEMBERSHIP_FILE == membership.CONF_FILE
    assert plan.MEMBERSHIP_FILE_MAX_BYTES == membership.CONF_FILE_MAX_BYTES
