"""Broker control records are hostile input (issue #16): every record is held on apply to the
rules the API enforces, an invalid one is skipped whole on every member with one log line, no
path is built from an unchecked name, and a snapshot on disk is held to the same rules."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import shutil
import struct
import threading
import time
from pathlib import Path

import pytest
from broker_world import MemoryLog

import broker.state.machine as state_mod
import broker.state.records as records
from broker.app import LazyLog
from broker.state.consumequeue import ConsumeQueueStore
from broker.state.delayrules import delivered_copy, encode_schedule_header, to_schedule
from broker.state.errors import CorruptStoreError, InvalidTopicError
from broker.state.indexfile import INDEX_HEADER_SIZE, INDEX_RECORD_SIZE, SLOT_SIZE, IndexStore
from broker.state.machine import BrokerStateMachine
from broker.state.message import Message, UniqIdGenerator, encode_batch
from broker.state.names import (
    MAX_GROUP_LENGTH,
    MAX_TOPIC_LENGTH,
    SCHEDULE_TOPIC,
    InvalidGroupError,
    is_system_topic,
    is_valid_group_name,
    is_valid_topic_name,
    validate_group_name,
    validate_topic_name,
)
from broker.state.records import (
    CONTROL_VERSION,
    ENTRY_MESSAGES,
    ENTRY_OFFSETS,
    ENTRY_SCHEDULE,
    ENTRY_TOPIC,
    TOPIC_CREATE_IF_ABSENT,
    TOPIC_DELETE,
    TOPIC_UPSERT,
    TopicConfig,
    encode_offsets_record,
    encode_topic_record,
)
from dledger.core import Role
from dledger.log import Entry
from dledger.server.node import DLedgerNode, NodeConfig
from dledger.storage import StoreConfig
from mqcluster.cluster import _free_ports
from nameserver.routes import check_name

IDS = UniqIdGenerator(ip="10.0.0.2", pid=7, instance_hash=2)
SKIP_LINE = "skip invalid record"
VICTIM = "../../../victim"


def msg(queue_id: int, n: int, *, ts: int = 1_000_000, topic: str = "T") -> Message:
    return Message(
        topic=topic,
        queue_id=queue_id,
        body=f"body-{n}".encode(),
        tags="TagA",
        keys=(f"k{n}",),
        store_timestamp_ms=ts,
        uniq_id=IDS.next_id(),
    )


def batch(log: MemoryLog, messages: list[Message]) -> Entry:
    body, _ = encode_batch(messages)
    return log.add(body, ENTRY_MESSAGES)


def new_sm(root: Path, log: MemoryLog) -> BrokerStateMachine:
    sm = BrokerStateMachine(root, hash_slots=1000, max_index_records=5000, cq_records_per_file=50)
    sm.attach(log)
    sm.on_role_change(Role.LEADER, 1, "n0")  # results are kept for a leader's send handlers
    return sm


def topic_record(op: int, name: str, read: int = 4, write: int = 4, perm: int = 6) -> bytes:
    """A topic record as anyone could append it: no check of the name or the numbers."""
    raw = name.encode("utf-8")
    return struct.pack(">BBiiiB", CONTROL_VERSION, op, read, write, perm, len(raw)) + raw


def offsets_record(items: list[tuple[str, str, int, int]]) -> bytes:
    """An offsets record as anyone could append it (one run per item)."""
    out = struct.pack(">BI", CONTROL_VERSION, len(items))
    for group, topic, queue_id, offset in items:
        g, t = group.encode(), topic.encode()
        out += struct.pack(">B", len(g)) + g + struct.pack(">B", len(t)) + t
        out += struct.pack(">H", 1) + struct.pack(">iq", queue_id, offset)
    return out


def opened(root: Path, log: MemoryLog) -> BrokerStateMachine:
    sm = new_sm(root, log)
    sm.applied_index()
    return sm


def skip_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if SKIP_LINE in r.getMessage()]


# ------------------------------------------------------------------------- names


def test_names_follow_rocketmq_rules() -> None:
    for good in ("T", "Orders-1", "a_b|c%d", "x" * MAX_TOPIC_LENGTH, "%RETRY%cg"):
        validate_topic_name(good)
        assert is_valid_topic_name(good)
    for bad in ("", "a.b", "a/b", "..", VICTIM, "x" * (MAX_TOPIC_LENGTH + 1), "é", "a b", 5):
        with pytest.raises(InvalidTopicError) as info:
            validate_topic_name(bad)
        assert info.value.code == "INVALID_TOPIC" and len(str(info.value)) < 1024
        assert not is_valid_topic_name(bad)
    validate_group_name("g" * MAX_GROUP_LENGTH)
    for bad_group in ("", "g" * (MAX_GROUP_LENGTH + 1), "my.group", "a/b", None):
        with pytest.raises(InvalidGroupError) as ginfo:
            validate_group_name(bad_group)
        assert ginfo.value.code == "INVALID_GROUP" and len(str(ginfo.value)) < 1024
        assert not is_valid_group_name(bad_group)
    assert is_system_topic(SCHEDULE_TOPIC) and is_system_topic("%DLQ%g")
    assert not is_system_topic("T")


# ------------------------------------------------------------------------- paths


def test_a_path_like_topic_record_never_touches_outside_the_store(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The finding: a topic named ``../../../victim`` upserted then deleted made every member
    rmtree a directory outside its store."""
    root = tmp_path / "a" / "b" / "store"
    victim = tmp_path / "a" / "victim"
    (victim / "0").mkdir(parents=True)
    (victim / "0" / "keep").write_bytes(b"precious")
    log = MemoryLog()
    log.add(topic_record(TOPIC_UPSERT, VICTIM), ENTRY_TOPIC)
    log.add(topic_record(TOPIC_DELETE, VICTIM), ENTRY_TOPIC)
    log.add(encode_topic_record(TOPIC_UPSERT, TopicConfig("T")), ENTRY_TOPIC)
    sm = opened(root, log)
    with caplog.at_level(logging.ERROR, "broker.state.machine"):
        sm.apply(log.entries)
    assert (victim / "0" / "keep").read_bytes() == b"precious"
    assert list(sm.topics) == ["T"] and sm.last_applied == 3
    assert len(skip_lines(caplog)) == 2 and sm.skip_log.skipped == 2
    assert all("INVALID_TOPIC" in line for line in skip_lines(caplog))
    # The store itself refuses the name too, and find() never builds the path.
    assert sm.cqs.find(VICTIM, 0) is None
    with pytest.raises(InvalidTopicError):
        sm.cqs.drop_topic(VICTIM)
    with pytest.raises(InvalidTopicError):
        sm.cqs.queue(VICTIM, 0)
    assert (victim / "0" / "keep").exists()
    sm.close()


def test_a_symlink_planted_in_the_store_is_never_followed(tmp_path: Path) -> None:
    """A valid name is one path component; only a symlink on the disk could lead outside. The
    store refuses to open or drop such a queue (PATH_OUTSIDE_STORE) and deletes nothing."""
    outside = tmp_path / "outside"
    (outside / "0").mkdir(parents=True)
    (outside / "0" / "keep").write_bytes(b"precious")
    store = ConsumeQueueStore(tmp_path / "root", records_per_file=10)
    (store.directory / "T").symlink_to(outside, target_is_directory=True)
    (store.directory / "U").mkdir()
    (store.directory / "U" / "0").symlink_to(outside / "0", target_is_directory=True)
    with pytest.raises(CorruptStoreError, match="PATH_OUTSIDE_STORE"):
        store.drop_topic("T")
    with pytest.raises(CorruptStoreError, match="PATH_OUTSIDE_STORE"):
        store.queue("T", 1)
    with pytest.raises(CorruptStoreError, match="PATH_OUTSIDE_STORE"):
        store.queue("U", 0)
    assert sorted(p.name for p in outside.iterdir()) == ["0"]
    assert (outside / "0" / "keep").read_bytes() == b"precious"
    assert store.queue_ids() == []  # neither is listed as a queue
    store.close()


def test_stray_directories_are_reported_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = ConsumeQueueStore(tmp_path, records_per_file=10)
    (store.directory / "bad name").mkdir()
    (store.directory / "T" / "junk").mkdir(parents=True)
    store.queue("T", 0)
    with caplog.at_level(logging.WARNING, "broker.state.consumequeue"):
        for _ in range(3):  # a snapshot lists the queues every second
            assert store.queue_ids() == [("T", 0)]
    strays = [r for r in caplog.records if "ignoring directory" in r.getMessage()]
    assert len(strays) == 2
    store.close()


# ------------------------------------------------------------------------- topic records


BAD_TOPIC_RECORDS = {
    "path": topic_record(TOPIC_UPSERT, "a/b"),
    "dot": topic_record(TOPIC_CREATE_IF_ABSENT, "a.b"),
    "too long": topic_record(TOPIC_UPSERT, "x" * (MAX_TOPIC_LENGTH + 1)),
    "empty": topic_record(TOPIC_UPSERT, ""),
    "no queues": topic_record(TOPIC_UPSERT, "T", read=0),
    "too many queues": topic_record(TOPIC_UPSERT, "T", write=records.MAX_QUEUE_NUMS + 1),
    "negative queues": topic_record(TOPIC_UPSERT, "T", read=-4),
    "perm too big": topic_record(TOPIC_UPSERT, "T", perm=8),
    "perm negative": topic_record(TOPIC_UPSERT, "T", perm=-1),
    "schedule topic": topic_record(TOPIC_UPSERT, SCHEDULE_TOPIC),
}


@pytest.mark.parametrize("case", sorted(BAD_TOPIC_RECORDS))
def test_topic_records_the_api_would_refuse_are_skipped(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, case: str
) -> None:
    log = MemoryLog()
    log.add(BAD_TOPIC_RECORDS[case], ENTRY_TOPIC)
    log.add(encode_topic_record(TOPIC_UPSERT, TopicConfig("Good")), ENTRY_TOPIC)
    sm = opened(tmp_path, log)
    with caplog.at_level(logging.ERROR, "broker.state.machine"):
        sm.apply(log.entries)
    assert list(sm.topics) == ["Good"] and sm.last_applied == 2
    lines = skip_lines(caplog)
    assert len(lines) == 1 and "index=1 type=18" in lines[0] and len(lines[0]) < 1024
    sm.close()


def test_the_schedule_topic_cannot_be_created_or_deleted_by_record(tmp_path: Path) -> None:
    """A delete of SCHEDULE_TOPIC_XXXX dropped every pending delayed message."""
    log = MemoryLog()
    batch(log, [to_schedule(msg(0, n), 2) for n in range(3)])
    log.add(encode_topic_record(TOPIC_UPSERT, TopicConfig(SCHEDULE_TOPIC, 18, 18)), ENTRY_TOPIC)
    log.add(encode_topic_record(TOPIC_DELETE, TopicConfig(SCHEDULE_TOPIC, 18, 18)), ENTRY_TOPIC)
    sm = opened(tmp_path, log)
    sm.apply(log.entries)
    pending = sm.cqs.find(SCHEDULE_TOPIC, 1)
    assert pending is not None and pending.max_offset == 3
    assert SCHEDULE_TOPIC not in sm.topics and sm.skip_log.skipped == 2
    sm.close()


def test_the_topic_table_is_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """More topics than the NameServer takes in one registration would cut the group off."""
    monkeypatch.setattr(records, "MAX_TOPICS", 3)
    log = MemoryLog()
    for name in ("A", "B", "C", "D"):
        log.add(encode_topic_record(TOPIC_CREATE_IF_ABSENT, TopicConfig(name)), ENTRY_TOPIC)
    log.add(encode_topic_record(TOPIC_UPSERT, TopicConfig("A", 2, 2)), ENTRY_TOPIC)  # update
    log.add(encode_topic_record(TOPIC_DELETE, TopicConfig("C")), ENTRY_TOPIC)
    log.add(encode_topic_record(TOPIC_UPSERT, TopicConfig("D")), ENTRY_TOPIC)  # room again
    sm = opened(tmp_path, log)
    sm.apply(log.entries[:4])
    assert sorted(sm.topics) == ["A", "B", "C"] and sm.skip_log.skipped == 1
    sm.apply(log.entries[4:])
    assert sorted(sm.topics) == ["A", "B", "D"] and sm.topics["A"].read_queue_nums == 2
    sm.close()


# ------------------------------------------------------------------------- offsets records


BAD_OFFSETS = {
    "group with a dot": ("my.group", "T", 0, 1),
    "empty group": ("", "T", 0, 1),
    "path topic": ("g", VICTIM, 0, 1),
    "negative queue": ("g", "T", -1, 1),
    "queue too big": ("g", "T", records.MAX_QUEUE_NUMS, 1),
    "negative offset": ("g", "T", 0, -5),
}


@pytest.mark.parametrize("case", sorted(BAD_OFFSETS))
def test_offsets_records_the_api_would_refuse_are_skipped_whole(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, case: str
) -> None:
    log = MemoryLog()
    log.add(encode_offsets_record({("g", "T", 1): 7}), ENTRY_OFFSETS)
    # One bad item among good ones: nothing of the record is applied.
    log.add(offsets_record([("g", "T", 1, 9), ("h", "T", 2, 9), BAD_OFFSETS[case]]), ENTRY_OFFSETS)
    sm = opened(tmp_path, log)
    with caplog.at_level(logging.ERROR, "broker.state.machine"):
        sm.apply(log.entries)
    assert sm.offsets == {("g", "T", 1): 7}
    lines = skip_lines(caplog)
    assert len(lines) == 1 and "INVALID_RECORD" in lines[0]
    sm.close()


# ------------------------------------------------------------------------- message records


def test_a_message_batch_with_one_bad_message_changes_nothing(tmp_path: Path) -> None:
    """The first message's id stayed in the dedup window although the batch was skipped, so a
    retry of it was answered 'duplicate' and never stored."""
    good = msg(0, 1)
    hostile = msg(0, 2, topic="Q" * len(VICTIM))
    body, _ = encode_batch([good, hostile])
    log = MemoryLog()
    log.add(body.replace(b"Q" * len(VICTIM), VICTIM.encode()), ENTRY_MESSAGES)
    batch(log, [msg(5000, 3)])  # a queue id no topic can have
    batch(log, [msg(1, 4, ts=1 << 62)])  # a store time the index cannot name a file for
    batch(log, [good])  # the producer's retry
    sm = opened(tmp_path / "store", log)
    sm.apply(log.entries)
    retried = sm.take_results(4)
    assert retried is not None and not retried[0].duplicate and retried[0].queue_offset == 0
    assert sm.skip_log.skipped == 3
    assert [(t, q) for t, q in sm.cqs.queue_ids()] == [("T", 0)]
    assert sm.cqs.queue("T", 0).max_offset == 1
    assert not (tmp_path / "victim").exists()
    assert list(sm.dedup) == [good.uniq_id]
    assert sm.index.max_position() == retried[0].position
    sm.close()


def test_a_store_failure_is_not_mistaken_for_a_bad_record(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Skipping on one member because of its own disk would make the members differ: the
    error leaves apply (and the node's apply task ends the process)."""
    log = MemoryLog()
    batch(log, [msg(0, 1)])
    sm = opened(tmp_path, log)

    def broken(*_: object) -> None:
        raise CorruptStoreError("file is 7 bytes, more than 6", path="x")

    monkeypatch.setattr(sm.index, "put_messages", broken)
    with pytest.raises(CorruptStoreError):
        sm.apply(log.entries)
    assert sm.last_applied == 0
    monkeypatch.undo()
    sm.close()


def test_a_flood_of_bad_records_is_logged_in_bounded_lines(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    log = MemoryLog()
    for _ in range(3 * state_mod.SKIP_LOG_LINES_PER_WINDOW):
        log.add(topic_record(TOPIC_UPSERT, VICTIM), ENTRY_TOPIC)
    sm = opened(tmp_path, log)
    with caplog.at_level(logging.ERROR, "broker.state.machine"):
        sm.apply(log.entries)
    assert sm.skip_log.skipped == 3 * state_mod.SKIP_LOG_LINES_PER_WINDOW
    assert len(skip_lines(caplog)) == state_mod.SKIP_LOG_LINES_PER_WINDOW
    sm.close()


# ------------------------------------------------------------------------- schedule records


def test_a_forged_schedule_header_cannot_stop_a_delay_level(tmp_path: Path) -> None:
    """A header reaching past the level's queue moved the level's offset there: the level
    delivered nothing (the real entry for the same messages was then 'stale')."""
    originals = [msg(0, n, ts=1000 + n) for n in range(4)]
    log = MemoryLog()
    batch(log, [to_schedule(m, 2) for m in originals])
    log.add(encode_schedule_header(2, 0, 1 << 40), ENTRY_SCHEDULE)  # forged: far past
    copies = [delivered_copy(to_schedule(m, 2), now_ms=9000) for m in originals]
    too_many, _ = encode_batch(copies)
    log.add(encode_schedule_header(2, 0, 2) + too_many, ENTRY_SCHEDULE)  # 4 copies for 2
    log.add(encode_schedule_header(9, 0, 1), ENTRY_SCHEDULE)  # an empty level
    real, _ = encode_batch(copies)
    log.add(encode_schedule_header(2, 0, 4) + real, ENTRY_SCHEDULE)  # the leader's entry
    sm = opened(tmp_path, log)
    sm.apply(log.entries)
    assert sm.skip_log.skipped == 3
    assert sm.schedule_offsets == {2: 4}
    delivered = sm.cqs.find("T", 0)
    assert delivered is not None and delivered.max_offset == 4
    sm.close()


# ------------------------------------------------------------------------- snapshot on disk


def test_a_snapshot_with_invalid_names_loads_without_them(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """An invalid topic in the table made every registration fail (the NameServer refuses the
    whole list); a hostile snapshot must neither bring one back nor stop the broker."""
    log = MemoryLog()
    log.add(encode_topic_record(TOPIC_UPSERT, TopicConfig("T")), ENTRY_TOPIC)
    batch(log, [msg(0, 1)])
    log.add(encode_offsets_record({("g", "T", 0): 1}), ENTRY_OFFSETS)
    sm = opened(tmp_path, log)
    sm.apply(log.entries)
    sm.close()
    path = tmp_path / "config" / "snapshot.json"
    data = json.loads(path.read_bytes())
    data["topics"].update({VICTIM: [4, 4, 6], "bad name": [4, 4, 6], "Z": [0, 4, 6]})
    data["offsets"]["my.group"] = {"T": {"0": 3}}
    data["offsets"]["g"][VICTIM] = {"0": 3}
    data["offsets"]["g"]["T"]["-1"] = 3
    data["schedule"] = {"0": 5, "3": -1, "2": 0}  # level 2 kept: at most its queue's max
    path.write_text(json.dumps(data))
    with caplog.at_level(logging.ERROR, "broker.state.machine"):
        again = opened(tmp_path, log)
    assert again.last_applied == len(log.entries)  # loaded, not rebuilt
    assert list(again.topics) == ["T"]
    assert again.offsets == {("g", "T", 0): 1}
    assert again.schedule_offsets == {2: 0}
    left_out = [r.getMessage() for r in caplog.records if "left out" in r.getMessage()]
    assert len(left_out) == 3
    for name in again.topics:  # what the NameServer checks in every registration
        check_name("topic", name)
    again.close()


def test_every_record_the_broker_writes_passes(tmp_path: Path) -> None:
    """The checks refuse nothing the broker itself proposes (system topics included)."""
    log = MemoryLog()
    for name in ("T", "%RETRY%cg", "%DLQ%cg", "x" * MAX_TOPIC_LENGTH):
        log.add(
            encode_topic_record(TOPIC_CREATE_IF_ABSENT, TopicConfig(name, 1024, 1, 7)), ENTRY_TOPIC
        )
    batch(log, [msg(1023, 1), msg(0, 2, topic="%RETRY%cg"), to_schedule(msg(3, 3), 18)])
    group = "g" * MAX_GROUP_LENGTH
    log.add(encode_offsets_record({(group, "T", 1023): 0, ("cg", "T", 0): 1 << 62}), ENTRY_OFFSETS)
    log.add(encode_topic_record(TOPIC_DELETE, TopicConfig("%DLQ%cg")), ENTRY_TOPIC)
    sm = opened(tmp_path, log)
    sm.apply(log.entries)
    assert sm.skip_log.skipped == 0
    assert sorted(sm.topics) == sorted(["T", "%RETRY%cg", "x" * MAX_TOPIC_LENGTH])
    assert len(sm.offsets) == 2
    sm.close()


def test_a_duplicate_in_a_skipped_batch_keeps_the_window(tmp_path: Path) -> None:
    log = MemoryLog()
    first = msg(0, 1)
    batch(log, [first])
    again = dataclasses.replace(first, queue_id=1)
    batch(log, [again, msg(0, 2), msg(0, 3, ts=1 << 62)])
    sm = opened(tmp_path, log)
    sm.apply(log.entries)
    assert list(sm.dedup) == [first.uniq_id] and sm.skip_log.skipped == 1
    sm.close()


def test_an_index_file_name_that_is_no_time_is_ignored(tmp_path: Path) -> None:
    """The next index file is named after the last one's time: a stray 17-digit name that is
    no date made every later put raise ValueError, which apply takes for a bad record (and
    only the member with that file would skip it)."""
    index = IndexStore(tmp_path, hash_slots=16, max_records=4)
    index.put_message("T", ("k",), "U1", 100, 1_000_000)
    index.close()
    (real,) = (tmp_path / "index").iterdir()
    shutil.copyfile(real, tmp_path / "index" / ("9" * 17))
    again = IndexStore(tmp_path, hash_slots=16, max_records=4)
    assert again.files == [real]
    again.put_message("T", ("a", "b", "c"), "U2", 200, 2_000_000)  # needs a new file
    assert again.query_key("T", "b", 4) == [200]
    again.close()


def test_end_to_end_a_node_applies_a_path_like_topic_record_harmlessly(tmp_path: Path) -> None:
    """The same finding through a real node: its store, its ready loop and the broker state
    machine, in process on free ports. The crafted records are proposed as a (forged or buggy)
    leader would have; the client port refuses them from outside now (ENTRY_TYPE_NOT_ALLOWED)."""
    root = tmp_path / "a" / "b" / "store"
    victim = tmp_path / "a" / "victim"
    (victim / "0").mkdir(parents=True)
    (victim / "0" / "keep").write_bytes(b"precious")
    peer_port, client_port = _free_ports(2)
    cfg = NodeConfig(
        group="g",
        self_id="n0",
        peers={"n0": f"127.0.0.1:{peer_port}"},
        client_host="127.0.0.1",
        client_port=client_port,
        store_dir=str(root / "dledger"),
        store=StoreConfig(segment_size_bytes=1 << 20, preallocate=False),
    )
    sm = BrokerStateMachine(root, hash_slots=1000, max_index_records=5000)

    async def go() -> None:
        node = DLedgerNode(cfg, sm)
        sm.attach(LazyLog(node))
        await node.start()
        try:
            deadline = time.monotonic() + 10.0
            while node.role is not Role.LEADER:
                assert time.monotonic() < deadline, "no leader within 10 s"
                await asyncio.sleep(0.01)
            for record in (
                topic_record(TOPIC_UPSERT, VICTIM),
                topic_record(TOPIC_DELETE, VICTIM),
                encode_topic_record(TOPIC_UPSERT, TopicConfig("T")),
            ):
                _, last, _ = await node.propose([record], ENTRY_TOPIC)
            while sm.last_applied < last:
                assert time.monotonic() < deadline, "not applied within 10 s"
                await asyncio.sleep(0.01)
        finally:
            await node.stop()

    asyncio.run(go())
    sm.close()
    assert (victim / "0" / "keep").read_bytes() == b"precious"
    assert list(sm.topics) == ["T"] and sm.skip_log.skipped == 2


def test_a_planted_index_chain_cannot_hang_a_truncate(tmp_path: Path) -> None:
    """Recovery truncates the key index; a record whose 'previous' points at itself (the
    records are not covered by the header's CRC) made the truncate loop forever."""
    index = IndexStore(tmp_path, hash_slots=1, max_records=8)  # one slot: every key chains
    for n in range(3):
        index.put_message("T", (), f"U{n}", 100 * (n + 1), 1_000_000)
    index.close()
    (path,) = (tmp_path / "index").iterdir()
    records_at = INDEX_HEADER_SIZE + 1 * SLOT_SIZE
    with path.open("r+b") as f:  # record 3's previous (its last 4 bytes) -> 3
        f.seek(records_at + 3 * INDEX_RECORD_SIZE + INDEX_RECORD_SIZE - 4)
        f.write(struct.pack(">I", 3))
    again = IndexStore(tmp_path, hash_slots=1, max_records=8)
    outcome: list[BaseException | None] = []

    def truncate() -> None:
        try:
            again.truncate_after_position(200)
            outcome.append(None)
        except BaseException as exc:
            outcome.append(exc)

    worker = threading.Thread(target=truncate, daemon=True)
    worker.start()
    worker.join(10.0)
    assert not worker.is_alive(), "truncate still running after 10 s"
    assert len(outcome) == 1 and isinstance(outcome[0], CorruptStoreError), outcome
