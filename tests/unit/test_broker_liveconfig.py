"""Live broker.conf overrides (issue #35): the broker config record (type 25) round-trips and
refuses what breaks its rules, every member applies the same records to the same table, the
table survives a restart from the snapshot, the leader proposes a change only at feature level
2 and only for a live key with a value the broker.conf checks take, and the components read
the new value at their next use."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import pytest
from broker_world import MemoryLog, reopen, world

from broker.components.disk import DiskGuard
from broker.components.scrubber import Scrubber
from broker.components.settings import ServiceConfig
from broker.config import parse_config, service_config
from broker.configkeys import APPLIED_LIVE_KEYS, KEYS, LIVE_KEYS
from broker.liveconfig import (
    LiveConfig,
    LiveSettings,
    check_clear,
    check_update,
    service_overlay,
)
from broker.state import brokerconf, features
from broker.state.brokerconf import (
    MAX_OVERRIDES,
    MAX_VALUE_BYTES,
    OP_CLEAR,
    OP_SET,
    InvalidConfigRecordError,
    decode_record,
    encode_record,
)
from broker.state.errors import FeatureLevelTooLowError, InvalidRequestError
from broker.state.machine import SNAPSHOT_FILE, BrokerStateMachine
from broker.state.message import Message, UniqIdGenerator, encode_batch
from broker.state.records import ENTRY_BROKER_CONFIG, ENTRY_MESSAGES, RECORD_TYPES
from dledger.storage import DiskFullError
from prockit.livekeys import LIVE_BROKER_KEYS

CONF = """
brokerName=broker-a
dLegerPeers=n0-127.0.0.1:40911;n1-127.0.0.1:40912;n2-127.0.0.1:40913
dLegerSelfId=n0
listenPort=10911
fileReservedTime=48
"""


def test_a_record_round_trips_set_and_clear() -> None:
    assert decode_record(encode_record(OP_SET, "topicsPerUser", "500")) == (
        OP_SET,
        "topicsPerUser",
        "500",
    )
    assert decode_record(encode_record(OP_CLEAR, "topicsPerUser")) == (
        OP_CLEAR,
        "topicsPerUser",
        "",
    )
    assert RECORD_TYPES[ENTRY_BROKER_CONFIG] == "broker config"


@pytest.mark.parametrize(
    "body",
    [
        b"",
        b"\x01\x01",  # truncated head
        b"\x02\x01\x01a\x00\x00",  # version 2
        b"\x01\x03\x01a\x00\x00",  # op 3
        b"\x01\x01\x05ab",  # key past the end
        b"\x01\x01\x01a\x00\x05ab",  # value past the end
        b"\x01\x01\x01a\x00\x01bX",  # a byte after the value
        b"\x01\x01\x011\x00\x01b",  # a key that starts with a digit
        b"\x01\x01\x02a-\x00\x01b",  # a key with a dash
        b"\x01\x01\x01a\x00\x02\xff\xfe",  # a value that is not UTF-8
        b"\x01\x01\x01a\x00\x02a\n",  # a line break in a value
        b"\x01\x02\x01a\x00\x01b",  # a clear with a value
    ],
)
def test_a_record_that_breaks_a_rule_is_refused(body: bytes) -> None:
    with pytest.raises(InvalidConfigRecordError):
        decode_record(body)


def test_bounds_of_a_record_and_the_table() -> None:
    with pytest.raises(InvalidConfigRecordError):
        encode_record(OP_SET, "k" * 65, "1")
    with pytest.raises(InvalidConfigRecordError):
        encode_record(OP_SET, "k", "x" * (MAX_VALUE_BYTES + 1))
    encode_record(OP_SET, "k" * 64, "x" * MAX_VALUE_BYTES)
    table: dict[str, str] = {}
    for i in range(MAX_OVERRIDES):
        table = brokerconf.applied(table, encode_record(OP_SET, f"key{i}", "1"))
    with pytest.raises(InvalidConfigRecordError):
        brokerconf.applied(table, encode_record(OP_SET, "oneMore", "1"))
    # A key already held takes no room; a clear frees one.
    assert brokerconf.applied(table, encode_record(OP_SET, "key0", "2"))["key0"] == "2"
    freed = brokerconf.applied(table, encode_record(OP_CLEAR, "key0"))
    assert "oneMore" in brokerconf.applied(freed, encode_record(OP_SET, "oneMore", "1"))


def _member(root: Path) -> tuple[BrokerStateMachine, MemoryLog]:
    sm = BrokerStateMachine(root, hash_slots=1000, max_index_records=5000)
    log = MemoryLog()
    sm.attach(log)
    sm.applied_index()
    return sm, log


def test_every_member_applies_the_same_records_to_the_same_table(tmp_path: Path) -> None:
    bodies = [
        encode_record(OP_SET, "topicsPerUser", "500"),
        b"\x01\x09\x01a\x00\x00",  # breaks a rule: skipped by every member
        encode_record(OP_SET, "autoCreateTopicEnable", "true"),
        encode_record(OP_SET, "topicsPerUser", "600"),
        encode_record(OP_CLEAR, "autoCreateTopicEnable"),
        encode_record(OP_SET, "slaveReadEnable", "true"),
    ]
    tables = []
    for name in ("n0", "n1", "n2"):
        sm, log = _member(tmp_path / name)
        for body in bodies:  # one by one on one member, all at once on the others
            if name == "n0":
                sm.apply([log.add(body, ENTRY_BROKER_CONFIG)])
        if name != "n0":
            sm.apply([log.add(b, ENTRY_BROKER_CONFIG) for b in bodies])
        assert sm.skip_log.skipped == 1
        tables.append(sm.config_overrides)
        sm.close()
    assert tables[0] == {"topicsPerUser": "600", "slaveReadEnable": "true"}
    assert tables[0] == tables[1] == tables[2]


def test_the_overrides_survive_a_restart_from_the_snapshot(tmp_path: Path) -> None:
    sm, log = _member(tmp_path)
    sm.apply([log.add(encode_record(OP_SET, "topicsPerUser", "500"), ENTRY_BROKER_CONFIG)])
    sm.close()
    doc = json.loads((tmp_path / "config" / SNAPSHOT_FILE).read_text())
    assert doc["config"] == {"topicsPerUser": "500"} and doc["version"] == 2
    again = reopen(tmp_path)
    assert again.config_overrides == {"topicsPerUser": "500"}
    again.close()


def test_a_snapshot_without_overrides_writes_no_config_member(tmp_path: Path) -> None:
    """Level 1 writes the snapshot 0.2.0 wrote: the member appears with the first override."""
    sm, _ = _member(tmp_path)
    sm.close()
    assert "config" not in json.loads((tmp_path / "config" / SNAPSHOT_FILE).read_text())


def test_a_snapshot_config_member_is_as_hostile_as_a_record() -> None:
    rows = {"topicsPerUser": "5", "bad key": "1", "long": "x" * (MAX_VALUE_BYTES + 1), "n": 7}
    table, bad = brokerconf.load(rows)
    assert table == {"topicsPerUser": "5"} and sorted(bad) == ["bad key", "long", "n"]
    assert brokerconf.load("not a table") == ({}, [])


def test_the_live_keys_are_marked_in_the_table_and_listed_for_mqadmin() -> None:
    assert LIVE_KEYS == LIVE_BROKER_KEYS
    assert {"autoCreateTopicEnable", "topicsPerUser"} <= LIVE_KEYS
    assert not KEYS["fileReservedTime"].live and not KEYS["listenPort"].live


def test_the_record_is_gated_at_level_2() -> None:
    assert not features.allowed(features.BROKER_CONFIG_RECORD, 1)
    assert features.allowed(features.BROKER_CONFIG_RECORD, 2)


def test_check_update_takes_live_keys_with_values_the_checks_take() -> None:
    cfg = parse_config(CONF)
    assert check_update(cfg, "autoCreateTopicEnable", " TRUE ") == "true"
    assert check_update(cfg, "topicsPerUser", "500") == "500"
    with pytest.raises(InvalidRequestError, match=r"needs a restart: edit broker\.conf on every"):
        check_update(cfg, "fileReservedTime", "72")
    with pytest.raises(InvalidRequestError, match="did you mean autoCreateTopicEnable"):
        check_update(cfg, "autoCreateTopicEnabled", "true")
    with pytest.raises(InvalidRequestError, match="topicsPerUser"):
        check_update(cfg, "topicsPerUser", "0")
    # Cross-key: timed messages may not wait beyond retention (48 h = 172,800 s here).
    assert check_update(cfg, "timerMaxDelaySec", "172800") == "172800"
    with pytest.raises(InvalidRequestError, match="fileReservedTime"):
        check_update(cfg, "timerMaxDelaySec", "172801")


def test_the_overlay_converts_units_and_leaves_unknown_keys_out() -> None:
    base = service_config(parse_config(CONF))
    out = service_overlay(
        base, {"timerMaxDelaySec": "60", "autoCreateTopicEnable": "true", "fileReservedTime": "1"}
    )
    assert out.timer_max_delay_ms == 60_000 and out.auto_create_topic
    assert out.store_port == base.store_port  # a restart-only key's override is left out


def test_a_change_reaches_the_components_at_their_next_use(tmp_path: Path) -> None:
    cfg = parse_config(CONF)
    node, sm, topics, _ = world(tmp_path, service_config(cfg))
    topics.ctx._overlay = service_overlay  # as broker.app.assemble wires it
    live = LiveConfig(topics.ctx, cfg)
    node.feature_level = lambda: 1  # type: ignore[attr-defined]
    with pytest.raises(FeatureLevelTooLowError, match="feature level is 1"):
        asyncio.run(live.update("autoCreateTopicEnable", "true", clear=False))
    assert node.proposals == 0 and sm.config_overrides == {}
    node.feature_level = lambda: 2  # type: ignore[attr-defined]
    assert not topics.ctx.cfg.auto_create_topic
    value, index = asyncio.run(live.update("autoCreateTopicEnable", "true", clear=False))
    assert (value, index) == ("true", 1)
    assert topics.ctx.cfg.auto_create_topic
    values, sources = live.view()
    assert values["autoCreateTopicEnable"] == "true" and sources["autoCreateTopicEnable"] == "live"
    assert sources["listenPort"] == "broker.conf"
    with pytest.raises(InvalidRequestError, match="needs a restart"):
        asyncio.run(live.update("listenPort", "10912", clear=False))
    asyncio.run(live.update("autoCreateTopicEnable", "", clear=True))
    assert not topics.ctx.cfg.auto_create_topic
    assert live.view()[1]["autoCreateTopicEnable"] == "broker.conf"
    assert node.proposals == 2
    sm.close()


def test_a_context_without_overlay_keeps_its_settings() -> None:
    cfg = ServiceConfig("127.0.0.1", 10911)
    assert service_overlay(cfg, {}) == cfg


class _FakeNode:
    """What LiveSettings asks of the Raft node: retune (recorded)."""

    def __init__(self) -> None:
        self.retuned: list[dict[str, int]] = []

    def retune(self, **changes: int) -> None:
        self.retuned.append(changes)


class _Disk:
    def __init__(self, percent: int) -> None:
        self.percent = percent

    def statvfs(self, path: str) -> os.statvfs_result:
        free = 1000 * (100 - self.percent) // 100
        return os.statvfs_result((4096, 4096, 1000, free, free, 100, 50, 50, 0, 255))


def _live_member(
    root: Path, disk: _Disk
) -> tuple[BrokerStateMachine, MemoryLog, DiskGuard, Scrubber, _FakeNode]:
    cfg = parse_config(CONF)
    sm, log = _member(root)
    guard = DiskGuard("n0", str(root), cfg.disk_watermarks, statvfs=disk.statvfs)
    scrubber, node = Scrubber(sm, cfg.scrubRecordsPerSecond), _FakeNode()
    sm.set_config_hook(LiveSettings(cfg, sm, node, guard, scrubber).apply)  # type: ignore[arg-type]
    return sm, log, guard, scrubber, node


def _messages(n: int, ids: UniqIdGenerator) -> bytes:
    return encode_batch([Message("T", 0, b"x", uniq_id=ids.next_id()) for _ in range(n)])[0]


def test_disk_marks_scrub_rates_and_the_dedup_window_apply_on_every_member(
    tmp_path: Path,
) -> None:
    """The keys read outside the service are pushed to their components as each member applies
    the record: the same values at the same index on every member, and again at a restart."""
    records = [
        encode_record(OP_SET, "diskSpaceWarningLevelRatio", "0.80"),
        encode_record(OP_SET, "scrubRecordsPerSecond", "0"),
        encode_record(OP_SET, "scrubBytesPerSec", "1048576"),
        encode_record(OP_SET, "diskMaxUsedSpaceRatio", "60"),
        encode_record(OP_SET, "dedupWindowMaxIds", "3"),
    ]
    disk = _Disk(82)
    for name in ("n0", "n1"):
        sm, log, guard, scrubber, node = _live_member(tmp_path / name, disk)
        sm.apply([log.add(_messages(5, UniqIdGenerator()), ENTRY_MESSAGES)])
        assert len(sm.dedup) == 5 and scrubber.records_per_second > 0
        guard.check()  # 82 % is below the broker.conf mark (90 %)
        sm.apply([log.add(body, ENTRY_BROKER_CONFIG) for body in records])
        with pytest.raises(DiskFullError, match="max=80% resume_below=75%"):
            guard.check()  # the resume mark the file left out follows the new refusal mark
        assert scrubber.records_per_second == 0  # paused
        assert node.retuned[-1] == {
            "retention_early_used_percent": 60,
            "scrub_bytes_per_s": 1 << 20,
        }
        assert (sm.dedup_window_ms, sm.dedup_max_ids, len(sm.dedup)) == (600_000, 3, 3)
        sm.apply(
            [log.add(encode_record(OP_CLEAR, "diskSpaceWarningLevelRatio"), ENTRY_BROKER_CONFIG)]
        )
        guard.check()  # 82 % < 85 %, the file's resume mark again
        sm.close()
        # A restart loads the table from the snapshot and pushes it again.
        again = reopen(tmp_path / name)
        node = _FakeNode()
        guard = DiskGuard("n0", str(tmp_path), parse_config(CONF).disk_watermarks)
        scrubber = Scrubber(again, 100)
        live = LiveSettings(parse_config(CONF), again, node, guard, scrubber)  # type: ignore[arg-type]
        again.set_config_hook(live.apply)
        assert again.dedup_max_ids == 3 and scrubber.records_per_second == 0
        assert node.retuned == [{"retention_early_used_percent": 60, "scrub_bytes_per_s": 1 << 20}]
        again.close()


def test_a_live_disk_mark_is_checked_against_the_others_and_says_which_were_defaults() -> None:
    cfg = parse_config(CONF)
    # The resume mark the file left out follows: lowering the refusal mark is one change.
    assert check_update(cfg, "diskSpaceWarningLevelRatio", "0.50") == "50"
    assert check_update(cfg, "diskSpaceWarningLevelRatio", "70") == "70"
    with pytest.raises(InvalidRequestError, match="not a whole percent"):
        check_update(cfg, "diskSpaceWarningLevelRatio", "0.705")
    # A resume mark the file set does not follow: refused, naming what was compared.
    set_resume = parse_config(CONF + "diskSpaceResumeRatio=80\n")
    with pytest.raises(InvalidRequestError) as info:
        check_update(set_resume, "diskSpaceWarningLevelRatio", "0.75")
    assert "compared diskSpaceResumeRatio=80 (set) with diskSpaceWarningLevelRatio=75 (set)" in str(
        info.value
    )
    with pytest.raises(InvalidRequestError) as info:
        check_update(cfg, "diskSpaceResumeRatio", "95")
    assert "with diskSpaceWarningLevelRatio=90 (default)" in str(info.value)
    # A clear that would leave the marks crossed is refused too.
    overrides = {"diskSpaceWarningLevelRatio": "95", "diskSpaceResumeRatio": "92"}
    with pytest.raises(InvalidRequestError, match="clearing diskSpaceWarningLevelRatio"):
        check_clear(cfg, overrides, "diskSpaceWarningLevelRatio")
    check_clear(cfg, overrides, "diskSpaceResumeRatio")  # 95 with a resume of 85: fine
    # Every key pushed by LiveSettings is live, and mqadmin's list has them.
    assert APPLIED_LIVE_KEYS <= LIVE_BROKER_KEYS
    assert service_overlay(service_config(cfg), {"dedupWindowSeconds": "5"}) == service_config(cfg)
