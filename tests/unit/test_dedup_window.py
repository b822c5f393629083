"""The dedup window in columns (broker.state.dedupwindow) against the OrderedDict it replaced:
the same answers, order, eviction and snapshot bytes for random operation sequences, and much
less memory per id."""

from __future__ import annotations

import array
import base64
import gc
import itertools
import json
import operator
import sys
import tracemalloc
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from broker.state.dedupwindow import (
    COMPACT_MIN_ROWS,
    DedupWindow,
    SendResult,
    decode_dedup,
    encode_dedup,
)

# ------------------------------------------------------------------------------------------
# The reference: the window as broker/state/machine.py kept it before (an OrderedDict of
# str -> SendResult), with its eviction loop and its snapshot encoder and decoder.


def _ref_column(values: Sequence[int]) -> str:
    col = array.array("q", values)
    if sys.byteorder != "little":
        col.byteswap()
    return base64.b64encode(col.tobytes()).decode("ascii")


def ref_encode(window: Sequence[SendResult]) -> dict[str, Any]:
    if not window:
        return {
            "count": 0,
            "ids": "",
            "topics": "",
            "store_timestamps_ms": "",
            "queue_ids": "",
            "queue_offsets": "",
            "positions": "",
        }
    uids, topics, queue_ids, queue_offsets, positions, stamps = (
        list(map(operator.itemgetter(i), window)) for i in range(6)
    )
    return {
        "count": len(window),
        "ids": base64.b64encode(bytes.fromhex("".join(uids))).decode("ascii"),
        "topics": "\n".join(topics),
        "store_timestamps_ms": _ref_column(stamps),
        "queue_ids": _ref_column(queue_ids),
        "queue_offsets": _ref_column(queue_offsets),
        "positions": _ref_column(positions),
    }


def ref_decode(data: Mapping[str, Any]) -> OrderedDict[str, SendResult]:
    count = int(data["count"])
    if count == 0:
        return OrderedDict()
    raw = base64.b64decode(data["ids"], validate=True)
    if len(raw) != 16 * count:
        raise ValueError(f"dedup ids hold {len(raw)} bytes, not {16 * count}")
    text = raw.hex().upper()
    uids = [text[i : i + 32] for i in range(0, len(text), 32)]
    topics = str(data["topics"]).split("\n")
    if len(topics) != count:
        raise ValueError(f"dedup topics hold {len(topics)} names, not {count}")
    columns = []
    for name in ("queue_ids", "queue_offsets", "positions", "store_timestamps_ms"):
        col = array.array("q")
        col.frombytes(base64.b64decode(data[name], validate=True))
        if len(col) != count:
            raise ValueError(f"dedup column {name} holds {len(col)} values, not {count}")
        columns.append(col)
    results = itertools.starmap(SendResult, zip(uids, topics, *columns, strict=True))
    return OrderedDict(zip(uids, results, strict=True))


def ref_evict(d: OrderedDict[str, SendResult], cutoff_ms: int, max_ids: int) -> None:
    while d:
        oldest = next(iter(d.values()))
        if len(d) <= max_ids and oldest.store_timestamp_ms >= cutoff_ms:
            break
        d.popitem(last=False)


def encoded(encode: Any, window: Any) -> str | type[Exception]:
    """The snapshot's JSON text of a window, or the exception type its encoder raised."""
    try:
        return json.dumps(encode(window), sort_keys=True)
    except ValueError:
        return ValueError


def loaded(decode: Any, text: str) -> list[tuple[str, SendResult]] | type[Exception]:
    """A snapshot's window loaded, or ValueError when the decoder refused it."""
    try:
        return list(decode(json.loads(text)).items())
    except ValueError:
        return ValueError


# ------------------------------------------------------------------------------------------
# Random operation sequences

# A small pool, so that sends repeat ids, pops hit and evictions empty the window.
CANONICAL = [f"{i * 0x9E3779B97F4A7C15 % (1 << 128):032X}" for i in range(40)]
OTHER = ["", "abc", "0" * 31, "a" * 32, "G" * 32, "0123456789abcdef0123456789ABCDEF", "Ü" * 4]
ids = st.one_of(st.sampled_from(CANONICAL), st.sampled_from(CANONICAL), st.sampled_from(OTHER))
topics = st.sampled_from(["T", "TopicB", "%RETRY%g", "T"])
results = st.builds(
    lambda uid, topic, q, off, pos, ts: SendResult(uid, topic, q, off, pos, ts),
    ids,
    topics,
    st.integers(0, 1023),
    st.integers(0, 1 << 40),
    st.integers(0, 1 << 50),
    st.integers(0, 2_000),
)


class WindowMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.ref: OrderedDict[str, SendResult] = OrderedDict()
        self.new = DedupWindow()

    @rule(r=results)
    def apply_send(self, r: SendResult) -> None:
        """What apply does per message: a known id is answered, a new one added."""
        assert self.new.get(r.uniq_id) == self.ref.get(r.uniq_id)
        if r.uniq_id not in self.ref:
            self.ref[r.uniq_id] = r
            self.new[r.uniq_id] = r

    @rule(r=results)
    def overwrite(self, r: SendResult) -> None:
        self.ref[r.uniq_id] = r
        self.new[r.uniq_id] = r

    @rule(uid=ids)
    def pop(self, uid: str) -> None:
        assert self.new.pop(uid) == self.ref.pop(uid, None)

    @rule(batch=st.lists(results, max_size=6))
    def batch_skipped(self, batch: list[SendResult]) -> None:
        """A batch added and taken out again (machine._forget_new_ids): oldest first."""
        added = []
        for r in batch:
            if r.uniq_id not in self.ref:
                self.ref[r.uniq_id] = self.new[r.uniq_id] = r
                added.append(r.uniq_id)
        for uid in added:
            assert self.new.pop(uid) == self.ref.pop(uid)

    @rule(cutoff=st.integers(-10, 2_100), max_ids=st.integers(1, 50))
    def evict(self, cutoff: int, max_ids: int) -> None:
        ref_evict(self.ref, cutoff, max_ids)
        self.new.evict(cutoff, max_ids)

    @rule()
    def clear(self) -> None:
        self.ref.clear()
        self.new.clear()

    @rule()
    def snapshot_round_trip(self) -> None:
        text = encoded(lambda w: encode_dedup(w.capture()), self.new)
        assert text == encoded(lambda d: ref_encode(list(d.values())), self.ref)
        if isinstance(text, str):  # ids that are not 16 bytes each: both refuse the load
            assert loaded(decode_dedup, text) == loaded(ref_decode, text)

    @invariant()
    def same(self) -> None:
        assert len(self.new) == len(self.ref)
        assert list(self.new) == list(self.ref)
        assert list(self.new.values()) == list(self.ref.values())
        for uid in OTHER[:3] + CANONICAL[:3]:
            assert self.new.get(uid) == self.ref.get(uid)
            assert (uid in self.new) == (uid in self.ref)


WindowMachine.TestCase.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
TestWindowAgainstOrderedDict = WindowMachine.TestCase


# ------------------------------------------------------------------------------------------
# Targeted cases


def _r(i: int, ts: int = 1_700_000_000_000, topic: str = "T") -> SendResult:
    return SendResult(f"{i:032X}", topic, i % 8, i, 100 * i, ts)


def test_long_runs_compact_the_columns_and_keep_answers() -> None:
    """Far more ids than the cap go through: the columns stay within twice the cap (plus the
    compaction's minimum), and the last cap's ids answer as the OrderedDict's would."""
    cap = 3_000
    new, ref = DedupWindow(), OrderedDict[str, SendResult]()
    for i in range(10 * COMPACT_MIN_ROWS):
        r = _r(i, ts=i)
        new[r.uniq_id] = ref[r.uniq_id] = r
        new.evict(i - 5_000, cap)
        ref_evict(ref, i - 5_000, cap)
        assert new.footprint_rows() <= 2 * cap + COMPACT_MIN_ROWS
    assert list(new.items()) == list(ref.items())
    assert encode_dedup(new.capture()) == ref_encode(list(ref.values()))


def test_ids_whose_hashes_collide_are_both_held() -> None:
    """Two live ids with one hash: the second goes to the plain dict and both answer."""
    new = DedupWindow()
    a, b = _r(1), _r(2)
    new[a.uniq_id] = a
    seq = new._index[hash(a.uniq_id)]
    new._index[hash(b.uniq_id)] = seq  # as if b's hash were a's
    new[b.uniq_id] = b
    assert b.uniq_id in new._odd
    assert new.get(a.uniq_id) == a and new.get(b.uniq_id) == b
    assert list(new.values()) == [a, b]
    assert encode_dedup(new.capture()) == ref_encode([a, b])
    del new._index[hash(b.uniq_id)]
    assert new.pop(b.uniq_id) == b and new.get(a.uniq_id) == a and len(new) == 1


def test_a_snapshot_with_one_id_twice_loads_as_the_ordereddict_did() -> None:
    data = ref_encode([_r(1), _r(2), _r(1, ts=5)])
    assert list(decode_dedup(data).items()) == list(ref_decode(data).items())


def test_topic_names_of_evicted_ids_do_not_pile_up() -> None:
    """Every id on a topic of its own (a hostile sender's names): the shared names table is
    rebuilt from the live ids, so it stays within a bound of the window's size."""
    new = DedupWindow()
    for i in range(20_000):
        new[f"{i:032X}"] = _r(i, ts=i, topic=f"T{i}")
        new.evict(0, 100)
    assert len(new._names) <= 2 * 1024 + 100


# Memory per id held, measured with tracemalloc: the OrderedDict held 376 B per id (a str id,
# a SendResult of six fields and its ints, the dict's entry and order links); the columns hold
# ~185 B. The bound leaves room for allocator and version differences.
MAX_BYTES_PER_ID = 250
IDS_MEASURED = 100_000


def _held_bytes(fill: Any) -> float:
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        held = fill()
        gc.collect()
        after = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    assert len(held) == IDS_MEASURED
    return (after - before) / IDS_MEASURED


def _fill(window: Any) -> Any:
    """Ids as apply makes them (a fresh str and SendResult per message, the topic a fresh str
    per message as the batch decoder makes it)."""
    for i in range(IDS_MEASURED):
        uid = (i * 0x9E3779B97F4A7C15 % (1 << 128)).to_bytes(16, "big").hex().upper()
        topic = "".join(("Bench", "Topic"))
        window[uid] = SendResult(uid, topic, i % 8, i, 1_000_000 + 150 * i, 1_700_000_000_000 + i)
    return window


@pytest.mark.parametrize("kind", ["columns", "ordereddict"])
def test_memory_per_id(kind: str) -> None:
    per_id = _held_bytes(lambda: _fill(DedupWindow() if kind == "columns" else OrderedDict()))
    print(f"{kind}: {per_id:.0f} B per id")
    if kind == "columns":
        assert per_id < MAX_BYTES_PER_ID
    else:  # the measurement can tell: the old form is over the bound
        assert per_id > MAX_BYTES_PER_ID
