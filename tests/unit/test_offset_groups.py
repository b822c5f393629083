"""Consumer groups with offsets, bounded in total and per user (issue #32, docs/SECURITY.md
"Quotas per user"): the owner a version-2 offsets record names, kept on apply and in the
snapshot; version-1 records still read; the table's limit enforced on apply."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest
from broker_world import MemoryLog

from broker.state import machine as state
from broker.state.errors import CorruptMessageError
from broker.state.machine import BrokerStateMachine
from broker.state.records import (
    ENTRY_OFFSETS,
    ENTRY_TOPIC,
    OFFSETS_RECORD_VERSION_OWNED,
    TOPIC_DELETE,
    TOPIC_UPSERT,
    TopicConfig,
    decode_offsets_record,
    decode_offsets_record_owned,
    encode_offsets_record,
    encode_topic_record,
)


def new_sm(root: Path, log: MemoryLog) -> BrokerStateMachine:
    sm = BrokerStateMachine(root)
    sm.attach(log)  # type: ignore[arg-type]
    sm.applied_index()
    return sm


def test_an_owned_record_names_each_new_groups_owner_and_v1_still_reads() -> None:
    offsets = {("g1", "T", 0): 5, ("g1", "U", 3): 9, ("g2", "U", 1): 0}
    v1 = encode_offsets_record(offsets)
    assert v1[0] == 1 and encode_offsets_record(offsets, {}) == v1
    assert decode_offsets_record_owned(v1) == (offsets, {})
    v2 = encode_offsets_record(offsets, {"g1": "alice"})
    assert v2[0] == OFFSETS_RECORD_VERSION_OWNED
    assert decode_offsets_record_owned(v2) == (offsets, {"g1": "alice"})
    assert decode_offsets_record(v2) == offsets
    for cut in (1, 5, 12):
        with pytest.raises(CorruptMessageError):
            decode_offsets_record(v2[:-cut])
    # An owner length past the record's end.
    head = struct.pack(">BI", 2, 1) + b"\x01g\x01T\xff"
    with pytest.raises(CorruptMessageError):
        decode_offsets_record(head)


def test_owners_are_applied_kept_in_the_snapshot_and_freed_with_the_topic(tmp_path: Path) -> None:
    log = MemoryLog()
    sm = new_sm(tmp_path, log)
    log.add(encode_topic_record(TOPIC_UPSERT, TopicConfig("T", 2, 2, 6)), ENTRY_TOPIC)
    log.add(encode_topic_record(TOPIC_UPSERT, TopicConfig("U", 2, 2, 6)), ENTRY_TOPIC)
    log.add(encode_offsets_record({("old", "U", 0): 1}), ENTRY_OFFSETS)  # version 1
    log.add(encode_offsets_record({("a", "T", 0): 1, ("b", "T", 1): 2}, {"a": "alice"}), 17)
    # A later record naming another owner of an existing group changes nothing.
    log.add(encode_offsets_record({("a", "T", 1): 3}, {"a": "bob"}), ENTRY_OFFSETS)
    sm.apply(log.entries)
    assert sm.offset_groups == {"old": "", "a": "alice", "b": ""}
    assert sm.offset_groups_of("alice") == 1 and sm.offset_groups_of("bob") == 0
    sm.close()
    doc = json.loads((tmp_path / "config" / "snapshot.json").read_bytes())
    assert doc["offset_owners"] == {"a": "alice"}
    again = new_sm(tmp_path, log)
    assert again.offset_groups == {"old": "", "a": "alice", "b": ""}
    log.add(encode_topic_record(TOPIC_DELETE, TopicConfig("T")), ENTRY_TOPIC)
    again.apply(log.entries[-1:])
    assert again.offset_groups == {"old": ""}
    again.close()


def test_a_snapshot_without_owners_or_with_bad_ones_loads(tmp_path: Path) -> None:
    log = MemoryLog()
    sm = new_sm(tmp_path, log)
    log.add(encode_topic_record(TOPIC_UPSERT, TopicConfig("T", 2, 2, 6)), ENTRY_TOPIC)
    log.add(encode_offsets_record({("a", "T", 0): 1, ("b", "T", 0): 1}, {"a": "x"}), 17)
    sm.apply(log.entries)
    sm.close()
    path = tmp_path / "config" / "snapshot.json"
    doc = json.loads(path.read_bytes())
    doc["offset_owners"] = {"a": 7, "b": "y" * 300, "ghost": "z"}
    path.write_text(json.dumps(doc))
    again = new_sm(tmp_path, log)
    assert again.offset_groups == {"a": "", "b": ""}
    again.close()
    del doc["offset_owners"]  # a snapshot written before owners were kept
    path.write_text(json.dumps(doc))
    again = new_sm(tmp_path, log)
    assert again.offset_groups == {"a": "", "b": ""}
    again.close()


def test_apply_skips_the_offsets_of_new_groups_past_the_limit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(state, "MAX_OFFSET_GROUPS", 2)
    log = MemoryLog()
    sm = new_sm(tmp_path, log)
    log.add(encode_topic_record(TOPIC_UPSERT, TopicConfig("T", 2, 2, 6)), ENTRY_TOPIC)
    log.add(encode_offsets_record({("a", "T", 0): 1, ("b", "T", 0): 1}), ENTRY_OFFSETS)
    log.add(encode_offsets_record({("a", "T", 0): 5, ("c", "T", 0): 1}), ENTRY_OFFSETS)
    sm.apply(log.entries)
    assert sm.offsets == {("a", "T", 0): 5, ("b", "T", 0): 1}
    assert set(sm.offset_groups) == {"a", "b"} and sm.skip_log.skipped == 1
    sm.close()
