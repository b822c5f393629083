"""The fast (batch) scan against the careful per-entry reader, on stores a real 3-node group
wrote: clean, with each kind of injected fault, and with random byte flips. Both must give
the same rows, value for value and in the same order (findings with their replica, file,
index and offset; checksums; divergent entries), and the fast path must really be what
scans the healthy entries."""

from __future__ import annotations

import mmap
import os
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import pytest

from dledger.log import Entry
from dledger.storage import codec
from dledger.storage.codec import ENTRY_HEADER_SIZE, INDEX_RECORD_SIZE
from dledger.storage.files import segment_name
from dledger.storage.store import SegmentedLogStore, StoreConfig
from spark_audit import scan
from spark_audit.model import GroupPlan, TaskSpec
from spark_audit.plan import plan_group, plan_tasks, sources_from_paths

pytestmark = pytest.mark.spark  # the group_stores fixture audits the running group once

# Small tasks, so that ranges start inside segments and inside index files.
TASK_BYTES = 1 << 20
# Random-flip rounds and flips per round (each round audits its own copy of the stores).
FLIP_ROUNDS = 12
FLIPS_PER_ROUND = 4
SEGMENT_BYTES = 4 << 20  # tests/audit/conftest.py TEST_SEGMENT_BYTES


class GroupStores(Protocol):
    last_index: int
    segment_bytes: int

    def copy(self, dest: Path) -> dict[str, Path]: ...


def _rows(plan: GroupPlan, tasks: list[TaskSpec], *, fast: bool) -> list[list[dict[str, Any]]]:
    out = []
    for t in tasks:
        result = scan.run_task(plan, t, fast=fast)
        out.append(list(scan.iter_rows(plan, t, result)))
    return out


class _CarefulCount:
    """Counts the entries the careful reader takes (the rest went through the fast path)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.entries = 0
        original = scan.ReplicaScanner._entry

        def counting(this: scan.ReplicaScanner, *args: Any) -> None:
            self.entries += 1
            original(this, *args)

        monkeypatch.setattr(scan.ReplicaScanner, "_entry", counting)


def _plan(stores: dict[str, Path]) -> tuple[GroupPlan, list[TaskSpec]]:
    plan = plan_group("g", sources_from_paths("g", [str(p) for p in stores.values()]))
    return plan, plan_tasks([plan], task_bytes=TASK_BYTES)


def _assert_same(
    stores: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> tuple[list[list[dict[str, Any]]], int]:
    """Fast and careful rows are equal; returns them and the careful entries of the fast
    run."""
    plan, tasks = _plan(stores)
    careful = _rows(plan, tasks, fast=False)
    counter = _CarefulCount(monkeypatch)
    fast = _rows(plan, tasks, fast=True)
    for t, a, b in zip(tasks, fast, careful, strict=True):
        assert a == b, f"task {t}"
    return fast, counter.entries


def _index_slot(store: Path, index: int) -> tuple[Path, int]:
    files = sorted((store / "index").iterdir())
    size = files[0].stat().st_size
    byte = index * INDEX_RECORD_SIZE
    return store / "index" / segment_name(byte - byte % size), byte % size


def _locate(store: Path, index: int) -> tuple[Path, int, codec.IndexRecord]:
    path, off = _index_slot(store, index)
    rec = codec.decode_index_record(path.read_bytes(), off)
    start = rec.position - rec.position % SEGMENT_BYTES
    return store / "commitlog" / segment_name(start), rec.position - start, rec


def _xor(path: Path, offset: int, mask: int) -> None:
    with open(path, "r+b") as f:
        mm = mmap.mmap(f.fileno(), 0)
        mm[offset] ^= mask
        mm.close()


def _kinds(rows: list[list[dict[str, Any]]]) -> set[tuple[str, str]]:
    return {(r["what"], r["replica"]) for task in rows for r in task if r["kind"] == "finding"}


# Each fault: (store copy, last index) -> the (finding kind, replica) the audit must report.
Fault = Callable[[dict[str, Path], int], set[tuple[str, str]]]


def _body_bit(stores: dict[str, Path], last: int) -> set[tuple[str, str]]:
    seg, off, _ = _locate(stores["n1"], last // 2)
    _xor(seg, off + ENTRY_HEADER_SIZE + 100, 0x10)
    return {("corrupt_entry", "n1")}


def _header_term_bit(stores: dict[str, Path], last: int) -> set[tuple[str, str]]:
    seg, off, _ = _locate(stores["n0"], last // 3)
    _xor(seg, off + 16 + 7, 0x01)  # the term field: only the header CRC tells
    return {("corrupt_entry", "n0")}


def _header_reserved_bit(stores: dict[str, Path], last: int) -> set[tuple[str, str]]:
    seg, off, _ = _locate(stores["n2"], last // 3 + 11)
    _xor(seg, off + 35, 0x04)  # the reserved field: nothing but the header CRC covers it
    return {("corrupt_entry", "n2")}


def _index_points_elsewhere(stores: dict[str, Path], last: int) -> set[tuple[str, str]]:
    index = last // 4
    _, _, rec = _locate(stores["n2"], index)
    _, _, nxt = _locate(stores["n2"], index + 1)
    path, off = _index_slot(stores["n2"], index)
    wrong = codec.encode_index_record(
        size=rec.size, position=nxt.position, term=rec.term, type=rec.type, chain=rec.chain
    )
    with open(path, "r+b") as f:
        os.pwrite(f.fileno(), wrong, off)
    return {("index_mismatch", "n2")}


def _index_crc_bit(stores: dict[str, Path], last: int) -> set[tuple[str, str]]:
    path, off = _index_slot(stores["n1"], last // 5)
    _xor(path, off + 30, 0x80)
    return {("index_mismatch", "n1")}


def _index_record_zeroed(stores: dict[str, Path], last: int) -> set[tuple[str, str]]:
    path, off = _index_slot(stores["n0"], last // 6)
    with open(path, "r+b") as f:
        os.pwrite(f.fileno(), bytes(INDEX_RECORD_SIZE), off)
    return {("index_mismatch", "n0")}


def _index_files_gone(stores: dict[str, Path], last: int) -> set[tuple[str, str]]:
    for f in (stores["n2"] / "index").iterdir():
        f.unlink()
    return {("index_mismatch", "n2")}


def _truncated(stores: dict[str, Path], last: int) -> set[tuple[str, str]]:
    seg, off, _ = _locate(stores["n2"], last - 150)
    os.truncate(seg, off)
    return {("missing_entries", "n2"), ("index_mismatch", "n2")}  # short_segment: the plan's


def _forged(stores: dict[str, Path], last: int) -> set[tuple[str, str]]:
    index = last // 3
    seg, off, _ = _locate(stores["n0"], index)
    with open(seg, "r+b") as f:
        mm = mmap.mmap(f.fileno(), 0)
        h = codec.decode_header(mm, off)
        codec.encode_entry_into(
            mm, off, index=index, term=h.term, position=h.position, body=b"F" * h.body_size,
            type=h.type,
        )  # fmt: skip
        mm.close()
    return {("divergent_entry", "n0")}


def _wrong_index_field(stores: dict[str, Path], last: int) -> set[tuple[str, str]]:
    """A valid entry (both CRCs right) that names the wrong index."""
    index = last // 2 + 7
    seg, off, _ = _locate(stores["n1"], index)
    with open(seg, "r+b") as f:
        mm = mmap.mmap(f.fileno(), 0)
        h = codec.verify_entry(mm, off)
        body = bytes(mm[off + ENTRY_HEADER_SIZE : off + h.total_size])
        codec.encode_entry_into(
            mm, off, index=index - 5, term=h.term, position=h.position, body=body,
            type=h.type,
        )  # fmt: skip
        mm.close()
    return {("corrupt_entry", "n1")}


def _bytes_between_entries(stores: dict[str, Path], last: int) -> set[tuple[str, str]]:
    """An entry rewritten shorter (CRCs right, its index record too): stray bytes then lie
    between it and the next entry, which the index still finds."""
    index = last // 2 - 3
    seg, off, rec = _locate(stores["n1"], index)
    with open(seg, "r+b") as f:
        mm = mmap.mmap(f.fileno(), 0)
        h = codec.verify_entry(mm, off)
        body = bytes(mm[off + ENTRY_HEADER_SIZE : off + h.total_size - 100])
        size = codec.encode_entry_into(
            mm, off, index=index, term=h.term, position=h.position, body=body, type=h.type
        )
        mm.close()
    path, rec_off = _index_slot(stores["n1"], index)
    fixed = codec.encode_index_record(size=size, position=rec.position, term=rec.term,
                                      type=rec.type, chain=rec.chain)  # fmt: skip
    with open(path, "r+b") as f:
        os.pwrite(f.fileno(), fixed, rec_off)
    return {("corrupt_entry", "n1")}


def _uncommitted_tail(stores: dict[str, Path], last: int) -> set[tuple[str, str]]:
    config = StoreConfig(segment_size_bytes=SEGMENT_BYTES, preallocate=False)
    for replica, fill, n in (("n0", b"a", 5), ("n1", b"b", 3)):
        with SegmentedLogStore(stores[replica], config) as store:
            term = store.last_term()
            store.append(
                [Entry(term=term, index=last + 1 + i, body=fill * (100 + i)) for i in range(n)]
            )
            store.flush()
    return {("uncommitted_tail", "n0"), ("uncommitted_tail", "n1")}


FAULTS: dict[str, Fault] = {
    "body_bit": _body_bit,
    "header_term_bit": _header_term_bit,
    "header_reserved_bit": _header_reserved_bit,
    "index_points_elsewhere": _index_points_elsewhere,
    "index_crc_bit": _index_crc_bit,
    "index_record_zeroed": _index_record_zeroed,
    "index_files_gone": _index_files_gone,
    "truncated": _truncated,
    "forged": _forged,
    "wrong_index_field": _wrong_index_field,
    "uncommitted_tail": _uncommitted_tail,
    "bytes_between_entries": _bytes_between_entries,
}


def test_clean_stores_go_through_the_fast_path(
    group_stores: GroupStores, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    stores = group_stores.copy(tmp_path / "stores")
    rows, careful_entries = _assert_same(stores, monkeypatch)
    assert careful_entries == 0  # every entry of a healthy store is taken a batch at a time
    assert not _kinds(rows)
    counts = [r["count"] for task in rows for r in task if r["kind"] == "part"]
    assert sum(counts) == 3 * group_stores.last_index


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_fast_and_careful_scans_agree_on_a_fault(
    fault: str, group_stores: GroupStores, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    stores = group_stores.copy(tmp_path / "stores")
    expected = FAULTS[fault](stores, group_stores.last_index)
    rows, careful_entries = _assert_same(stores, monkeypatch)
    assert expected <= _kinds(rows), _kinds(rows)
    if fault != "index_files_gone":
        # The careful reader took over around the fault only.
        assert careful_entries < group_stores.last_index // 10


def _used_bytes(path: Path) -> int:
    """Bytes up to the last non-zero byte (segments and index files are preallocated)."""
    data = path.read_bytes()
    return len(data.rstrip(b"\0"))


@pytest.mark.parametrize("seed", range(FLIP_ROUNDS))
def test_fast_and_careful_scans_agree_on_random_flips(
    seed: int, group_stores: GroupStores, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rng = random.Random(seed)
    stores = group_stores.copy(tmp_path / "stores")
    files = [
        (p, used)
        for store in stores.values()
        for sub in ("commitlog", "index")
        for p in sorted((store / sub).iterdir())
        if (used := _used_bytes(p)) > 0
    ]
    for _ in range(FLIPS_PER_ROUND):
        path, used = rng.choice(files)
        _xor(path, rng.randrange(used), 1 << rng.randrange(8))
    rows, _ = _assert_same(stores, monkeypatch)
    assert _kinds(rows)  # a flipped bit anywhere in the used bytes is found
