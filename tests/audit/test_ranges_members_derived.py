"""Issue 31 item 6 on stores written in the test (no group to start: the log store, the
broker's ConsumeQueue and key index writers, a few MB): divergence pinned to a range and a
replica by the range digests, a removed member's leftover store ignored, a damaged
ConsumeQueue or key index record reported with its file and offset. Each case was CLEAN (or
reported without a range, a replica verdict or a repair) before."""

from __future__ import annotations

import dataclasses
import io
import json
import mmap
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from broker.state.consumequeue import CQ_RECORD_SIZE, ConsumeQueueStore
from broker.state.indexfile import IndexStore
from dledger.core.membership import ConfState
from dledger.log import Entry, HardState
from dledger.storage import codec
from dledger.storage.codec import ENTRY_HEADER_SIZE, INDEX_RECORD_SIZE
from dledger.storage.promise import PromiseWriter, promise_path
from dledger.storage.store import SegmentedLogStore, StoreConfig
from msgcodec.encode import encode_batch
from msgcodec.layout import Message, tags_hash
from spark_audit.__main__ import main
from spark_audit.plan import plan_group, sources_from_paths
from spark_audit.report import build_report, report_json, write_summary

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

CONFIG = StoreConfig(segment_size_bytes=256 * 1024, index_segment_size_bytes=64 * 1024)
REPLICAS = ("n0", "n1", "n2")
# Small leaves so that a 3,000-entry log has 47 of them and a tree of 3 levels.
LEAF_ENTRIES = "64"
RAW_ENTRIES = 3000
TOPIC = "AuditT"
QUEUES = 2
BATCHES = 60
PER_BATCH = 5
BASE_TS_MS = 1_767_225_600_000  # 2026-01-01 UTC
# A small key index (the broker's default file is 420 MB).
HASH_SLOTS = 1024
MAX_INDEX_RECORDS = 4096


def raw_body(i: int) -> bytes:
    return f"entry {i} ".encode() * 8


def write_raw(store: Path, last: int, commit: int, *, differ_at: int = 0) -> None:
    with SegmentedLogStore(store, CONFIG) as s:
        for lo in range(1, last + 1, 500):
            hi = min(lo + 500, last + 1)
            s.append(
                [
                    Entry(1, i, raw_body(i) + (b"!" if i == differ_at else b""), 0)
                    for i in range(lo, hi)
                ]
            )
        s.flush()
        s.write_checkpoint(commit, commit)


def run(spark: SparkSession, tmp: Path, *paths: Path | str, extra: tuple[str, ...] = ()) -> Any:
    out = tmp / "report.json"
    code = main(
        [*(str(p) for p in paths), "--json", str(out), "-q", "--leaf-entries", LEAF_ENTRIES,
         "--task-mb", "1", *extra],
        spark=spark,
    )  # fmt: skip
    report = json.loads(out.read_text())
    assert report["exit_code"] == code
    return report


def findings(report: Any, what: str) -> list[dict[str, Any]]:
    return [f for g in report["groups"] for f in g["findings"] if f["what"] == what]


@pytest.mark.spark
def test_divergence_is_pinned_to_its_range_and_replica(spark: SparkSession, tmp_path: Path) -> None:
    """n1 holds another (well-formed) entry at 1500: the tree descent finds leaf 23
    (indexes 1473..1536) in 3 rounds without looking at most leaves, and names n1, the
    majority n0 and n2, and the repair."""
    for r in REPLICAS:
        write_raw(tmp_path / r / f"dledger-{r}", RAW_ENTRIES, RAW_ENTRIES,
                  differ_at=1500 if r == "n1" else 0)  # fmt: skip
    report = run(spark, tmp_path, tmp_path)
    assert not report["clean"]
    (d,) = findings(report, "damaged_range")
    assert (d["replica"], d["index"], d["index_end"], d["peer"]) == ("n1", 1473, 1536, "n0")
    assert "the majority (n0, n2)" in d["detail"]
    assert "mqadmin removeMember -n NAMESRV -b default -i n1" in d["detail"]
    ranges = report["groups"][0]["ranges"]
    assert (ranges["leaves"], ranges["levels"], ranges["rounds"]) == (47, 3, 3)
    assert ranges["differing_leaves"] == [23]
    # Root, then the 3 children of the root, then the 16 leaves under the differing one.
    assert ranges["nodes_compared"] == 1 + 3 + 16
    assert len(set(ranges["roots"].values())) == 2
    (e,) = findings(report, "divergent_entry")  # and the entry-by-entry comparison agrees
    assert (e["replica"], e["index"]) == ("n1", 1500)


@pytest.mark.spark
def test_range_digests_ignore_segment_layout(spark: SparkSession, tmp_path: Path) -> None:
    """A replica cut in segments of another size holds the same leaves and root."""
    write_raw(tmp_path / "a" / "dledger-n0", RAW_ENTRIES, RAW_ENTRIES)
    write_raw(tmp_path / "a" / "dledger-n1", RAW_ENTRIES, RAW_ENTRIES)
    other = StoreConfig(segment_size_bytes=128 * 1024, index_segment_size_bytes=64 * 1024)
    with SegmentedLogStore(tmp_path / "b" / "dledger-n2", other) as s:
        s.append([Entry(1, i, raw_body(i), 0) for i in range(1, RAW_ENTRIES + 1)])
        s.flush()
        s.write_checkpoint(RAW_ENTRIES, RAW_ENTRIES)
    report = run(spark, tmp_path, *(tmp_path / x / f"dledger-{r}" for x, r in
                                    (("a", "n0"), ("a", "n1"), ("b", "n2"))))  # fmt: skip
    assert report["clean"], report["groups"][0]["findings"]
    assert len(set(report["groups"][0]["ranges"]["roots"].values())) == 1


def leftover_group(base: Path) -> None:
    """n0..n2 hold 3,000 committed entries; n3, removed early, holds 3 (its checkpoint says
    3); n1's entry 2000 has a flipped body byte."""
    for r in REPLICAS:
        write_raw(base / r / f"dledger-{r}", RAW_ENTRIES, RAW_ENTRIES)
    write_raw(base / "n3" / "dledger-n3", 3, 3)
    flip_body_byte(base / "n1" / "dledger-n1", 2000)


def flip_body_byte(store: Path, index: int) -> None:
    """Flip a bit in the body of entry ``index`` (found through the index file: opening the
    store would write to it)."""
    size = CONFIG.index_segment_size_bytes
    byte = index * INDEX_RECORD_SIZE
    raw = (store / "index" / f"{byte - byte % size:020d}").read_bytes()
    rec = codec.decode_index_record(raw, byte % size)
    seg = rec.position - rec.position % CONFIG.segment_size_bytes
    with open(store / "commitlog" / f"{seg:020d}", "r+b") as f, mmap.mmap(f.fileno(), 0) as mm:
        mm[rec.position - seg + ENTRY_HEADER_SIZE + 5] ^= 0x01


@pytest.mark.spark
def test_removed_members_leftover_store_is_ignored(spark: SparkSession, tmp_path: Path) -> None:
    """cluster.json lists n3 as removed: its 3-entry store no longer pulls the audited
    commit index down to 3 (which left n1's damaged entry 2000 unaudited: CLEAN)."""
    leftover_group(tmp_path)
    (tmp_path / "cluster.json").write_text(
        json.dumps({"group": "g", "nodes": [], "removed": ["n3"]})
    )
    report = run(spark, tmp_path, tmp_path)
    group = report["groups"][0]
    assert group["audited_index"] == RAW_ENTRIES
    assert [r["replica"] for r in group["replicas"]] == list(REPLICAS)
    (gone,) = findings(report, "not_a_member")
    assert gone["replica"] == "n3" and "cluster.json" in gone["detail"]
    (bad,) = findings(report, "corrupt_entry")
    assert (bad["replica"], bad["index"]) == ("n1", 2000)
    assert not report["clean"]


def test_committed_configuration_names_the_members(tmp_path: Path) -> None:
    """Without cluster.json, the configuration the replicas saved (membership.json, the
    newest by index) says n3 was removed; it wins over an older one n3 kept."""
    leftover_group(tmp_path)
    newer = ConfState(frozenset(REPLICAS), removed=("n3",), index=5)
    older = ConfState(frozenset((*REPLICAS, "n3")), index=2)
    for r in REPLICAS:
        save_configuration(tmp_path / r / f"dledger-{r}", newer)
    save_configuration(tmp_path / "n3" / "dledger-n3", older)
    plan = plan_group("g", sources_from_paths("g", [str(tmp_path)]))
    assert [rp.replica for rp in plan.replicas] == list(REPLICAS)
    assert plan.audited_index == RAW_ENTRIES
    (gone,) = plan.findings
    assert gone.replica == "n3" and "configuration of index 5" in gone.detail


def save_configuration(store: Path, conf: ConfState) -> None:
    doc = {"index": conf.index, "config": json.loads(conf.encode())}
    (store / "membership.json").write_text(json.dumps(doc))


# ---------------------------------------------------------------------------------------
# Derived state
# ---------------------------------------------------------------------------------------


def message(b: int, i: int) -> Message:
    n = b * PER_BATCH + i
    return Message(
        TOPIC,
        n % QUEUES,
        f"body {n}".encode() * 4,
        tags=f"tag{n % 3}",
        keys=(f"k{n}",),
        store_timestamp_ms=BASE_TS_MS + n * 10,
        uniq_id=f"{n:032X}",
    )


def write_broker(root: Path, replica: str) -> None:
    """A broker's log, ConsumeQueues and key index, written by the broker's own writers as
    its apply path would (positions from the log store)."""
    cqs = ConsumeQueueStore(root)
    index = IndexStore(root, hash_slots=HASH_SLOTS, max_records=MAX_INDEX_RECORDS)
    with SegmentedLogStore(root / f"dledger-{replica}", CONFIG) as s:
        for b in range(BATCHES):
            msgs = [message(b, i) for i in range(PER_BATCH)]
            body, offsets = encode_batch(msgs)
            s.append([Entry(1, b + 1, body, 0)])
            base = s.body_position(b + 1)
            sizes = [*(offsets[1:]), len(body)]
            rows = []
            for m, at, end in zip(msgs, offsets, sizes, strict=True):
                cqs.append(TOPIC, m.queue_id, base + at, end - at, tags_hash(m.tags))
                rows.append((TOPIC, m.keys, m.uniq_id, base + at, m.store_timestamp_ms))
            index.put_messages(rows)
        s.flush()
        s.write_checkpoint(BATCHES, BATCHES)
    cqs.flush()
    cqs.close()
    index.flush()
    index.close()


@pytest.mark.spark
def test_damaged_consume_queue_and_key_index_records_are_reported(
    spark: SparkSession, tmp_path: Path
) -> None:
    for r in REPLICAS:
        write_broker(tmp_path / r, r)
    clean = run(spark, tmp_path, *(tmp_path / r for r in REPLICAS))
    assert clean["clean"], clean["groups"][0]["findings"]
    derived = clean["groups"][0]["replicas"][1]["derived"]
    assert derived["consumequeue"] == {"files": QUEUES, "records": BATCHES * PER_BATCH}
    assert derived["key_index"]["records"] == 2 * BATCHES * PER_BATCH  # uniq id + one key

    # n1: queue 1's record at offset 7 says 1 byte less; a key index record's position moves.
    cq_file = tmp_path / "n1" / "consumequeue" / TOPIC / "1" / f"{0:020d}"
    with open(cq_file, "r+b") as f, mmap.mmap(f.fileno(), 0) as mm:
        at = 7 * CQ_RECORD_SIZE + 8
        mm[at : at + 4] = (int.from_bytes(mm[at : at + 4], "big") - 1).to_bytes(4, "big")
    (key_file,) = (tmp_path / "n2" / "index").iterdir()
    record_at = 64 + 4 * HASH_SLOTS + 20 * 3  # record 3
    with open(key_file, "r+b") as f, mmap.mmap(f.fileno(), 0) as mm:
        pos = int.from_bytes(mm[record_at + 4 : record_at + 12], "big")
        mm[record_at + 4 : record_at + 12] = (pos + 1).to_bytes(8, "big")
    report = run(spark, tmp_path, *(tmp_path / r for r in REPLICAS))
    assert not report["clean"]
    (cq,) = findings(report, "cq_mismatch")
    assert (cq["replica"], cq["file"], cq["offset"]) == (
        "n1", f"consumequeue/{TOPIC}/1/{0:020d}", 7 * CQ_RECORD_SIZE)  # fmt: skip
    assert "queue offset 7" in cq["detail"] and "the record says" in cq["detail"]
    assert cq["index"] >= 1
    (ki,) = findings(report, "key_index_mismatch")
    assert (ki["replica"], ki["file"], ki["offset"]) == ("n2", f"index/{key_file.name}", record_at)
    assert not findings(report, "corrupt_entry") and not findings(report, "damaged_range")


@pytest.mark.spark
def test_rolled_back_replica_is_named(spark: SparkSession, tmp_path: Path) -> None:
    """n2's store is an older copy of itself (2,000 entries, its checkpoint says 2,000)
    while its promise file says it acknowledged 3,000: ROLLED_BACK with both numbers, and
    its old checkpoint no longer lowers the audited commit index to 2,000 (which made the
    audit CLEAN)."""
    for r in REPLICAS:
        last = 2000 if r == "n2" else RAW_ENTRIES
        write_raw(tmp_path / r / f"dledger-{r}", last, last)
        writer = PromiseWriter(promise_path(tmp_path / r, r), "g", r, None)
        writer.write(RAW_ENTRIES, HardState(1, "n0"))
        writer.close()
    report = run(spark, tmp_path, tmp_path)
    group = report["groups"][0]
    assert group["audited_index"] == RAW_ENTRIES
    (rb,) = findings(report, "rolled_back")
    assert (rb["replica"], rb["index"], rb["index_end"]) == ("n2", 2001, RAW_ENTRIES)
    assert rb["file"] == "dledger-n2.promise"
    assert "ends at index 2000 but the node promised index 3000" in rb["detail"]
    assert "mqadmin removeMember" in rb["detail"]
    assert not report["clean"]


@pytest.mark.spark
def test_digest_store_reuses_unchanged_ranges_and_reads_changed_ones(
    spark: SparkSession, tmp_path: Path
) -> None:
    stores = tmp_path / "stores"
    for r in REPLICAS:
        write_raw(stores / r / f"dledger-{r}", RAW_ENTRIES, RAW_ENTRIES)
    digests = ("--digests", str(tmp_path / "digests.json"))
    first = run(spark, tmp_path, stores, extra=digests)
    assert first["clean"] and first["reused"]["ranges"] == 0
    stored = json.loads((tmp_path / "digests.json").read_text())["groups"]["default"]
    assert len(stored) >= 2  # the committed ranges, each clean

    second = run(spark, tmp_path, stores, extra=digests)
    assert second["clean"]
    assert second["reused"]["ranges"] == len(stored)
    assert second["reused"]["entries"] == RAW_ENTRIES
    assert second["scanned_bytes"] < first["scanned_bytes"] / 10
    for key in ("ranges",):
        assert second["groups"][0][key] == first["groups"][0][key]
    assert [r["committed"] for r in second["groups"][0]["replicas"]] == [
        r["committed"] for r in first["groups"][0]["replicas"]
    ]

    # A byte flipped in n1's entry 2000 changes that segment's stamps: its range is read
    # again (and the damage found), the others are reused.
    flip_body_byte(stores / "n1" / "dledger-n1", 2000)
    third = run(spark, tmp_path, stores, extra=digests)
    (bad,) = findings(third, "corrupt_entry")
    assert (bad["replica"], bad["index"]) == ("n1", 2000)
    assert 1 <= third["reused"]["ranges"] < len(stored)


# ---------------------------------------------------------------------------------------
# Feature levels (docs/RAFT.md section 14)
# ---------------------------------------------------------------------------------------


def raised_group(base: Path) -> None:
    """n0 and n1 applied the raise to level 2 (CONFIG entry 3000); n2's store is still at
    level 1 (its saved configuration is the bootstrap one)."""
    for r in REPLICAS:
        write_raw(base / r / f"dledger-{r}", RAW_ENTRIES, RAW_ENTRIES)
    raised = ConfState(frozenset(REPLICAS), index=RAW_ENTRIES, features=2)
    for r in ("n0", "n1"):
        save_configuration(base / r / f"dledger-{r}", raised)
    save_configuration(base / "n2" / "dledger-n2", ConfState(frozenset(REPLICAS), index=1))


def test_a_store_below_the_groups_feature_level_is_flagged(tmp_path: Path) -> None:
    raised_group(tmp_path)
    plan = plan_group("g", sources_from_paths("g", [str(tmp_path)]))
    assert plan.feature_level == 2
    assert {rp.replica: rp.feature_level for rp in plan.replicas} == {"n0": 2, "n1": 2, "n2": 1}
    assert {rp.supported_feature_level for rp in plan.replicas} == {0}  # offline: unknown
    (below,) = plan.findings
    assert (below.what.value, below.replica) == ("below_feature_level", "n2")
    assert "store is at feature level 1, below the group's level 2" in below.detail
    report = build_report(
        [plan], [], mismatch_counts={}, mismatch_sample=[], master="-", session_start_s=0,
        job_s=1, tasks=0, parquet_path=None,
    )  # fmt: skip
    assert report.exit_code == 0  # information: the leader's hold is not damage
    (group,) = report_json(report)["groups"]
    assert group["feature_level"] == 2
    levels = {r["replica"]: (r["feature_level"], r["status"]) for r in group["replicas"]}
    assert levels == {"n0": (2, "ok"), "n1": (2, "ok"), "n2": (1, "below_feature_level")}
    out = io.StringIO()
    write_summary(report, out)
    lines = out.getvalue().splitlines()
    assert lines[0].endswith("feature level 2")
    assert lines[1].split()[-3:] == ["level", "MB/s", "status"]
    assert lines[5].split()[0] == "n2" and lines[5].split()[-3] == "1/-"


def test_a_running_member_whose_release_supports_less_is_flagged(tmp_path: Path) -> None:
    """--connect: the nodes report their support; n2 runs a release that supports level 1
    (its leader withholds entries from it). A member that supports the level but whose
    store has not reached it yet is only behind: not flagged."""
    raised_group(tmp_path)
    sources = sources_from_paths("g", [str(tmp_path)])
    support = {"n0": (2, "0.3.0"), "n1": (2, "0.3.0"), "n2": (1, "0.2.0 or older")}
    running = [
        dataclasses.replace(
            s, supported_feature_level=support[s.replica][0], release=support[s.replica][1]
        )
        for s in sources
    ]
    plan = plan_group("g", running)
    (below,) = plan.findings
    assert below.replica == "n2"
    assert "runs 0.2.0 or older, which supports feature levels up to 1" in below.detail
    assert "sends it no entries" in below.detail
    upgraded = [dataclasses.replace(s, supported_feature_level=2) for s in running]
    assert plan_group("g", upgraded).findings == ()
