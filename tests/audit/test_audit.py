"""The audit over stores a real 3-node group wrote: clean, then one injected fault per test,
each found and localized exactly (replica, segment file, index, byte offset)."""

from __future__ import annotations

import json
import mmap
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import pytest

from dledger.log import Entry
from dledger.storage import codec
from dledger.storage.codec import ENTRY_HEADER_SIZE, INDEX_RECORD_SIZE
from dledger.storage.files import segment_name
from dledger.storage.store import SegmentedLogStore, StoreConfig
from mqrelease import BASELINE_LEVEL, FEATURE_LEVEL, RELEASE
from spark_audit.__main__ import main

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = pytest.mark.spark


class GroupStores(Protocol):
    """What the ``group_stores`` fixture (tests/audit/conftest.py) hands over."""

    last_index: int
    segment_bytes: int
    live_exit_code: int
    live_report: dict[str, Any]

    def copy(self, dest: Path) -> dict[str, Path]: ...


# Small tasks so that ranges split segments and the replicas' pieces are joined again.
TASK_MB = "3"
# The group's segment size (tests/audit/conftest.py TEST_SEGMENT_BYTES).
SEGMENT_BYTES = 4 << 20


def audit(spark: SparkSession, stores: dict[str, Path], tmp: Path, *extra: str) -> tuple[int, Any]:
    report = tmp / "report.json"
    code = main(
        [*(str(p) for p in stores.values()), "--json", str(report), "--task-mb", TASK_MB,
         "-q", *extra],
        spark=spark,
    )  # fmt: skip
    return code, json.loads(report.read_text())


def errors(report: Any) -> list[dict[str, Any]]:
    """The error findings of the entry-by-entry checks (the range verdicts they lead to,
    ``damaged_range``, are checked apart: ``damaged_ranges``)."""
    return [
        f
        for g in report["groups"]
        for f in g["findings"]
        if f["severity"] == "error" and f["what"] != "damaged_range"
    ]


def damaged_ranges(report: Any) -> list[dict[str, Any]]:
    return [f for g in report["groups"] for f in g["findings"] if f["what"] == "damaged_range"]


def only(findings: list[dict[str, Any]], what: str) -> dict[str, Any]:
    matching = [f for f in findings if f["what"] == what]
    assert len(matching) == 1, findings
    return matching[0]


def index_slot(store: Path, index: int) -> tuple[Path, int]:
    """The index file holding ``index``'s record and the record's offset in it."""
    files = sorted((store / "index").iterdir())
    size = files[0].stat().st_size
    byte = index * INDEX_RECORD_SIZE
    return store / "index" / segment_name(byte - byte % size), byte % size


def locate(store: Path, index: int) -> tuple[str, int, codec.IndexRecord]:
    """(data segment name, byte offset in it, index record) of entry ``index``."""
    path, off = index_slot(store, index)
    rec = codec.decode_index_record(path.read_bytes(), off)
    start = rec.position - rec.position % SEGMENT_BYTES
    return segment_name(start), rec.position - start, rec


def commit_index(store: Path) -> int:
    return codec.decode_checkpoint((store / "checkpoint").read_bytes()).commit_index


def test_clean_stores_pass(spark: SparkSession, group_stores: GroupStores, tmp_path: Path) -> None:
    stores = group_stores.copy(tmp_path / "stores")
    code, report = audit(spark, stores, tmp_path)
    assert code == 0, report
    (group,) = report["groups"]
    assert group["audited_index"] == group_stores.last_index
    assert group["audited_from"] == "checkpoints"
    assert not group["findings"] and not group["pairs"]
    replicas = group["replicas"]
    assert [r["replica"] for r in replicas] == ["n0", "n1", "n2"]
    sums = {(r["committed"]["unordered"], r["committed"]["ordered"]) for r in replicas}
    assert len(sums) == 1  # every replica holds the same committed log
    for r in replicas:
        assert r["status"] == "ok"
        assert r["last_index"] == group_stores.last_index
        assert r["committed"]["first_index"] == 1
        assert r["committed"]["count"] == group_stores.last_index
        assert len(r["segments"]) >= 3  # the log spans several segment files
        assert sum(s["committed"]["count"] for s in r["segments"]) == group_stores.last_index


def test_running_group_audit_asks_the_nodes(group_stores: GroupStores) -> None:
    """``--connect``: the nodes report their store paths and commit indexes (the group was
    audited by the fixture while it ran, idle after the last append)."""
    assert group_stores.live_exit_code == 0, group_stores.live_report
    (group,) = group_stores.live_report["groups"]
    assert group["group"] == "broker-a"
    assert group["audited_from"] == "metadata"
    assert group["audited_index"] == group_stores.last_index
    assert [f for f in group["findings"] if f["severity"] == "error"] == []
    assert {r["replica"] for r in group["replicas"]} == {"n0", "n1", "n2"}
    assert {r["committed"]["count"] for r in group["replicas"]} == {group_stores.last_index}
    assert len({r["committed"]["ordered"] for r in group["replicas"]}) == 1
    # Each member's feature level: its store's, and its release's support as it reported it.
    assert group["feature_level"] == BASELINE_LEVEL
    levels = {
        (r["feature_level"], r["supported_feature_level"], r["release"]) for r in group["replicas"]
    }
    assert levels == {(BASELINE_LEVEL, FEATURE_LEVEL, RELEASE)}


def test_flipped_bit_in_a_committed_entry(
    spark: SparkSession, group_stores: GroupStores, tmp_path: Path
) -> None:
    stores = group_stores.copy(tmp_path / "stores")
    index = group_stores.last_index // 2
    seg, off, _ = locate(stores["n1"], index)
    with open(stores["n1"] / "commitlog" / seg, "r+b") as f:
        mm = mmap.mmap(f.fileno(), 0)
        mm[off + ENTRY_HEADER_SIZE + 100] ^= 0x10
        mm.close()
    code, report = audit(spark, stores, tmp_path)
    assert code == 1
    (f,) = errors(report)
    assert (f["what"], f["replica"], f["file"], f["index"], f["index_end"], f["offset"]) == (
        "corrupt_entry",
        "n1",
        seg,
        index,
        index,
        off,
    )
    assert "body CRC" in f["detail"]
    n1 = next(r for r in report["groups"][0]["replicas"] if r["replica"] == "n1")
    assert n1["status"] == "corrupt_entry,damaged_range"
    # The range verdict names n1 (the majority n0, n2 holds the whole range) and the repair.
    (d,) = damaged_ranges(report)
    assert (d["replica"], d["index"], d["index_end"]) == ("n1", 1, group_stores.last_index)
    assert "mqadmin removeMember" in d["detail"] and "(n0, n2)" in d["detail"]
    assert n1["last_index"] == group_stores.last_index  # the scan went on after the bad entry


def test_truncated_committed_range(
    spark: SparkSession, group_stores: GroupStores, tmp_path: Path
) -> None:
    stores = group_stores.copy(tmp_path / "stores")
    store = stores["n2"]
    index = group_stores.last_index - 150
    seg, off, _ = locate(store, index)
    os.truncate(store / "commitlog" / seg, off)
    code, report = audit(spark, stores, tmp_path)
    assert code == 1
    found = errors(report)
    missing = only(found, "missing_entries")
    assert (missing["replica"], missing["file"], missing["index"], missing["offset"]) == (
        "n2",
        seg,
        index,
        off,
    )
    assert missing["index_end"] == commit_index(store) == group_stores.last_index
    short = only(found, "short_segment")
    assert (short["replica"], short["file"], short["offset"]) == ("n2", seg, off)
    # The index still holds records of the cut entries: reported from the first of them.
    dangling = only(found, "index_mismatch")
    path, rec_off = index_slot(store, index)
    assert (dangling["replica"], dangling["file"], dangling["index"], dangling["offset"]) == (
        "n2",
        path.name,
        index,
        rec_off,
    )
    assert {f["replica"] for f in found} == {"n2"}
    n2 = next(r for r in report["groups"][0]["replicas"] if r["replica"] == "n2")
    assert n2["last_index"] == index - 1
    assert (n2["end"]["file"], n2["end"]["offset"]) == (seg, off)


def test_forged_committed_entry(
    spark: SparkSession, group_stores: GroupStores, tmp_path: Path
) -> None:
    """A replica holds a different, perfectly valid entry (CRCs right) at a committed index."""
    stores = group_stores.copy(tmp_path / "stores")
    index = group_stores.last_index // 3
    seg, off, _ = locate(stores["n0"], index)
    path = stores["n0"] / "commitlog" / seg
    with open(path, "r+b") as f:
        mm = mmap.mmap(f.fileno(), 0)
        h = codec.decode_header(mm, off)
        forged = b"F" * h.body_size
        codec.encode_entry_into(
            mm, off, index=index, term=h.term, position=h.position, body=forged, type=h.type
        )
        mm.close()
    parquet = tmp_path / "mismatch.parquet"
    code, report = audit(spark, stores, tmp_path, "--parquet", str(parquet))
    assert code == 1
    (f,) = errors(report)
    assert (f["what"], f["replica"], f["file"], f["index"], f["offset"], f["count"]) == (
        "divergent_entry",
        "n0",
        seg,
        index,
        off,
        1,
    )
    assert f["peer"] == "n1"
    pairs = {(p["replica"], p["peer"]): p for p in report["groups"][0]["pairs"]}
    assert set(pairs) == {("n0", "n1"), ("n0", "n2")}
    assert all(p["first_divergent_index"] == index and p["committed"] for p in pairs.values())
    import pyarrow.parquet as pq

    rows = pq.read_table(parquet).to_pylist()
    assert len(rows) == 1 and report["groups"][0]["mismatch_count"] == 1
    assert (rows[0]["replica"], rows[0]["index"], rows[0]["file"], rows[0]["offset"]) == (
        "n0",
        index,
        seg,
        off,
    )
    assert rows[0]["peer"] == "n1" and rows[0]["term"] == rows[0]["peer_term"]
    assert rows[0]["digest"] != rows[0]["peer_digest"]


def test_index_record_points_to_the_wrong_place(
    spark: SparkSession, group_stores: GroupStores, tmp_path: Path
) -> None:
    stores = group_stores.copy(tmp_path / "stores")
    store = stores["n2"]
    index = group_stores.last_index // 4
    _, _, rec = locate(store, index)
    _, _, next_rec = locate(store, index + 1)
    path, rec_off = index_slot(store, index)
    wrong = codec.encode_index_record(
        size=rec.size, position=next_rec.position, term=rec.term, type=rec.type, chain=rec.chain
    )  # a valid record (its CRC is right) that points at the next entry
    with open(path, "r+b") as f:
        os.pwrite(f.fileno(), wrong, rec_off)
    code, report = audit(spark, stores, tmp_path)
    assert code == 1
    (f,) = errors(report)
    assert (f["what"], f["replica"], f["file"], f["index"], f["index_end"], f["offset"]) == (
        "index_mismatch",
        "n2",
        path.name,
        index,
        index,
        rec_off,
    )
    assert f"position={next_rec.position}" in f["detail"]
    assert f"the entry is at position={rec.position}" in f["detail"]


def test_uncommitted_divergent_tail_is_not_divergence(
    spark: SparkSession, group_stores: GroupStores, tmp_path: Path
) -> None:
    stores = group_stores.copy(tmp_path / "stores")
    last = group_stores.last_index
    config = StoreConfig(segment_size_bytes=group_stores.segment_bytes, preallocate=False)
    for replica, fill, n in (("n0", b"a", 5), ("n1", b"b", 3)):
        with SegmentedLogStore(stores[replica], config) as store:
            term = store.last_term()
            store.append(
                [Entry(term=term, index=last + 1 + i, body=fill * (100 + i)) for i in range(n)]
            )
            store.flush()
        assert commit_index(stores[replica]) == last  # appended, never committed
    code, report = audit(spark, stores, tmp_path)
    assert code == 0, errors(report)
    (group,) = report["groups"]
    tails = [f for f in group["findings"] if f["what"] == "uncommitted_tail"]
    assert {(f["replica"], f["index"]) for f in tails} <= {("n0", last + 1), ("n1", last + 1)}
    assert tails
    assert group["pairs"] == [
        {
            "replica": "n0",
            "peer": "n1",
            "first_divergent_index": last + 1,
            "count": 3,
            "committed": False,
        }
    ]
    tail_counts = {r["replica"]: r["tail_count"] for r in group["replicas"]}
    assert tail_counts == {"n0": 5, "n1": 3, "n2": 0}
    assert all(r["committed"]["count"] == last for r in group["replicas"])


def test_usage_and_input_errors_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 2
    assert main([str(tmp_path / "nowhere")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("mqaudit: error:") and "nowhere" in err[-1]
    (tmp_path / "empty").mkdir()
    assert main([str(tmp_path / "empty")]) == 2
    with pytest.raises(SystemExit) as exc:
        main(["--upto", "x", str(tmp_path)])
    assert exc.value.code == 2
    with pytest.raises(SystemExit) as exc:
        main(["--help"])
    assert exc.value.code == 0
