"""A damaged membership.json is detected at start and repaired from the log, the settings or
the other members' committed configuration, never replaced by a guess
(dledger.server.confrepair; docs/FORMAT.md "Membership file")."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest
from raftmq.dledger.v1 import dledger_pb2 as pb

from dledger.core import AppendRequest, ChangeKind, ConfChange, ConfState
from dledger.log import ConfigError, Entry, EntryType, FormatTooNewError
from dledger.rewind import NeedsSnapshotError
from dledger.server import confrepair
from dledger.server.confrepair import (
    FROM_FILE,
    FROM_LOG,
    FROM_QUORUM,
    FROM_SETTINGS,
    Answer,
    answer_from,
    check_against_log,
    decide,
    from_answers,
)
from dledger.server.convert import to_pb
from dledger.server.errors import StartError
from dledger.server.membership import CONF_FILE, DamagedConfFileError, load_conf, save_conf
from dledger.server.node import DLedgerNode, NodeConfig
from dledger.server.nodeconfig import LogOnlyStateMachine
from dledger.storage import StoreConfig
from dledger.storage.store import SegmentedLogStore
from mqcluster.cluster import _free_ports

STATIC = ConfState(frozenset({"n0", "n1", "n2"}))
# The group after n3 was added as a learner by the CONFIG entry at index 5.
GROWN = STATIC.apply(ConfChange(ChangeKind.ADD_LEARNER, "n3", "h:4", "h:14"), 5)


class ListLog:
    """The part of a log store the repair reads: entries ``first .. first + len - 1``."""

    def __init__(self, entries: Sequence[Entry], first: int = 1) -> None:
        self.entries = list(entries)
        self.first = first
        self.reads = 0

    def first_index(self) -> int:
        return self.first

    def last_index(self) -> int:
        return self.first + len(self.entries) - 1

    def read_range(self, start: int, max_bytes: int, max_count: int = 1 << 30) -> list[Entry]:
        assert self.first <= start <= self.last_index()
        self.reads += 1
        return self.entries[start - self.first : start - self.first + min(max_count, 3)]


def _log(last: int, configs: dict[int, ConfState], first: int = 1) -> ListLog:
    entries = []
    for i in range(first, last + 1):
        conf = configs.get(i)
        if conf is None:
            entries.append(Entry(1, i, b"e%d" % i))
        else:
            entries.append(Entry(1, i, conf.encode(), EntryType.CONFIG))
    return ListLog(entries, first)


async def _no_answers() -> Sequence[Answer]:
    return []


def _decide(
    tmp_path: Path,
    log: ListLog,
    *,
    applied: int,
    promised: int = 0,
    joins: bool = False,
    answers: Sequence[Answer] = (),
) -> confrepair.StartConf:
    async def ask() -> Sequence[Answer]:
        return answers

    return asyncio.run(
        decide(
            str(tmp_path),
            "n0",
            log,  # type: ignore[arg-type]
            applied=applied,
            promised=promised,
            joins=joins,
            ask=ask,
        )
    )


# ---------------------------------------------------------------- detection


def _valid_doc() -> dict[str, object]:
    return {"v": 1, "index": 5, "config": json.loads(GROWN.encode())}


DAMAGED_TEXTS = {
    "zero-length (a power cut)": "",
    "truncated": json.dumps(_valid_doc())[:37],
    "not JSON": "\x00\x17garbage",
    "not an object": "[1, 2]",
    "version 0": json.dumps({**_valid_doc(), "v": 0}),
    "version a string": json.dumps({**_valid_doc(), "v": "1"}),
    "version a boolean": json.dumps({**_valid_doc(), "v": True}),
    "index negative": json.dumps({**_valid_doc(), "index": -1}),
    "index a boolean": json.dumps({**_valid_doc(), "index": True}),
    "index above int64": json.dumps({**_valid_doc(), "index": 1 << 63}),
    "no voter": json.dumps(
        {"v": 1, "index": 5, "config": {"v": 1, "voters": [], "learners": [], "removed": []}}
    ),
    "config not an object": json.dumps({"v": 1, "index": 5, "config": "n0,n1"}),
    "an id in two roles": json.dumps(
        {"v": 1, "index": 5, "config": {"v": 1, "voters": ["n0"], "learners": ["n0"]}}
    ),
    "joining false": json.dumps({"v": 1, "joining": False}),
    "joining with a config": json.dumps({**_valid_doc(), "joining": True}),
}


@pytest.mark.parametrize("text", DAMAGED_TEXTS.values(), ids=list(DAMAGED_TEXTS))
def test_every_damage_form_is_told_from_a_newer_file(tmp_path: Path, text: str) -> None:
    (tmp_path / CONF_FILE).write_text(text)
    with pytest.raises(DamagedConfFileError, match="not a membership file"):
        load_conf(str(tmp_path), "n0")


def test_a_newer_release_s_file_is_not_damage(tmp_path: Path) -> None:
    """A downgrade guard, as for every file of the store: never "repaired" away."""
    (tmp_path / CONF_FILE).write_text(json.dumps({**_valid_doc(), "v": 2}))
    with pytest.raises(FormatTooNewError):
        load_conf(str(tmp_path), "n0")
    with pytest.raises(FormatTooNewError):
        _decide(tmp_path, _log(10, {5: GROWN}), applied=10)


def test_an_index_above_the_log_and_the_promise_is_damage() -> None:
    log = _log(10, {5: GROWN})
    check_against_log(dataclasses.replace(GROWN, index=12), log, promised=12)  # a cut log
    with pytest.raises(DamagedConfFileError, match="above the log's last index 10"):
        check_against_log(dataclasses.replace(GROWN, index=13), log, promised=12)


def test_a_configuration_the_log_s_config_entry_contradicts_is_damage() -> None:
    log = _log(10, {5: GROWN})
    check_against_log(GROWN, log, promised=0)
    check_against_log(dataclasses.replace(STATIC, index=4), log, promised=0)  # not a CONFIG
    with pytest.raises(DamagedConfFileError, match="differs from the log's CONFIG entry"):
        check_against_log(dataclasses.replace(STATIC, index=5), log, promised=0)


def test_a_good_file_is_used_as_it_is_and_the_log_not_scanned(tmp_path: Path) -> None:
    save_conf(str(tmp_path), GROWN)
    log = _log(10, {5: GROWN})
    got = _decide(tmp_path, log, applied=10)
    assert (got.conf, got.source, got.damage) == (GROWN, FROM_FILE, "")
    assert log.reads == 1  # the entry at the file's index only


# ---------------------------------------------------------------- repair sources


def test_the_log_s_last_config_entry_up_to_the_applied_index_repairs_it(tmp_path: Path) -> None:
    (tmp_path / CONF_FILE).write_text("")
    later = GROWN.apply(ConfChange(ChangeKind.PROMOTE, "n3"), 9)
    got = _decide(tmp_path, _log(10, {2: STATIC, 5: GROWN, 9: later}), applied=8)
    # Entry 9 is above the applied index: the core replays it, as at any start.
    assert (got.conf, got.source) == (GROWN, FROM_LOG)
    assert "not a membership file" in got.damage


def test_the_settings_repair_it_when_the_log_from_index_1_holds_no_config(
    tmp_path: Path,
) -> None:
    (tmp_path / CONF_FILE).write_text("{")
    got = _decide(tmp_path, _log(10, {}), applied=10)
    assert (got.conf, got.source) == (None, FROM_SETTINGS)
    # A CONFIG entry above the applied index is the core's to replay over the settings'.
    got = _decide(tmp_path, _log(10, {8: GROWN}), applied=6)
    assert (got.conf, got.source) == (None, FROM_SETTINGS)


def test_a_joining_node_with_an_empty_log_is_the_learner_it_started_as(tmp_path: Path) -> None:
    (tmp_path / CONF_FILE).write_text("")
    got = _decide(tmp_path, _log(0, {}), applied=0, joins=True)
    assert got.source == FROM_SETTINGS and got.is_joining
    assert got.conf is not None and got.conf.voters == frozenset()
    assert got.conf.learners == {"n0"}


def test_the_members_answers_repair_it_when_the_log_s_start_was_deleted(tmp_path: Path) -> None:
    (tmp_path / CONF_FILE).write_text("")
    log = _log(100, {}, first=51)
    answers = [
        Answer("n1", dataclasses.replace(GROWN, index=3), 60),  # behind this node: no say
        Answer("n2", GROWN, 120),
    ]
    got = _decide(tmp_path, log, applied=90, answers=answers)
    assert (got.conf, got.source) == (GROWN, FROM_QUORUM)


def test_a_joiner_s_log_without_config_entries_asks_the_members(tmp_path: Path) -> None:
    """Its settings are not the group's: they must not make it a voter of its own group."""
    (tmp_path / CONF_FILE).write_text("")
    got = _decide(tmp_path, _log(4, {}), applied=4, joins=True, answers=[Answer("n1", STATIC, 9)])
    assert (got.conf, got.source) == (STATIC, FROM_QUORUM)


def test_answers_that_disagree_refuse_the_start() -> None:
    other = dataclasses.replace(GROWN, voters=frozenset({"n0", "n1"}))
    with pytest.raises(ConfigError, match="members disagree"):
        from_answers([Answer("n1", GROWN, 20), Answer("n2", other, 20)], 10)
    same = dataclasses.replace(GROWN, index=7)  # a snapshot's index: the same configuration
    assert from_answers([Answer("n1", GROWN, 20), Answer("n2", same, 20)], 10) == GROWN


def test_nothing_deciding_refuses_the_start_with_what_to_do(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(confrepair, "QUORUM_WAIT_MS", 50)
    monkeypatch.setattr(confrepair, "QUORUM_ROUND_MS", 10)
    (tmp_path / CONF_FILE).write_text("")
    with pytest.raises(ConfigError, match="nothing decides the configuration") as err:
        _decide(tmp_path, _log(100, {}, first=51), applied=90)
    assert "log's start (index 51) was deleted" in str(err.value)
    assert "membership.json" in str(err.value)
    # A member whose commit index is behind this node's applied index decides nothing, nor
    # one whose configuration changed after it.
    with pytest.raises(ConfigError, match="nothing decides"):
        _decide(tmp_path, _log(100, {}, first=51), applied=90, answers=[Answer("n1", GROWN, 80)])
    later = dataclasses.replace(GROWN, index=95)
    with pytest.raises(ConfigError, match="nothing decides"):
        _decide(tmp_path, _log(100, {}, first=51), applied=90, answers=[Answer("n1", later, 200)])


def test_an_answer_is_bounded_and_checked() -> None:
    good = pb.HoldingsResponse(config=GROWN.encode(), config_index=5, commit_index=9)
    assert answer_from("n1", good) == Answer("n1", GROWN, 9)
    for bad in (
        pb.HoldingsResponse(),  # a release before the field
        pb.HoldingsResponse(config=b"{", config_index=5, commit_index=9),
        pb.HoldingsResponse(config=GROWN.encode(), config_index=10, commit_index=9),
        pb.HoldingsResponse(config=GROWN.encode(), config_index=5, commit_index=1 << 63),
        pb.HoldingsResponse(config=b" " * (1 << 15), config_index=5, commit_index=9),
    ):
        assert answer_from("n1", bad) is None


# ---------------------------------------------------------------- a node's start


def _node_cfg(tmp_path: Path, **changes: object) -> NodeConfig:
    n0_port, n1_port, client_port = _free_ports(3)
    peers = {"n0": f"127.0.0.1:{n0_port}", "n1": f"127.0.0.1:{n1_port}"}
    store = StoreConfig(segment_size_bytes=1 << 20, preallocate=False)
    cfg = NodeConfig("g", "n0", peers, "127.0.0.1", client_port, str(tmp_path / "s"), store)
    # A long election timeout: n0 never campaigns (n1 never runs).
    return dataclasses.replace(
        cfg, election_timeout_ms=60_000, heartbeat_interval_ms=100, **changes
    )


class _AppliedUpTo(LogOnlyStateMachine):
    """A state machine that says it applied up to ``applied`` (a broker's snapshot does)."""

    def __init__(self, applied: int) -> None:
        super().__init__()
        self._applied = applied

    def applied_index(self) -> int:
        return self._applied


def _run(cfg: NodeConfig, body: Callable[[DLedgerNode], None], applied: int = 0) -> None:
    async def go() -> None:
        node = DLedgerNode(cfg, seed=1, state_machine=_AppliedUpTo(applied))
        await node.start()
        try:
            body(node)
        finally:
            await node.stop()

    asyncio.run(go())


def _fill(cfg: NodeConfig, entries: Sequence[Entry]) -> None:
    """The node's store holding ``entries`` (its leader n1 sent them) and closed."""

    async def go() -> None:
        node = DLedgerNode(cfg, seed=1)
        await node.start()
        try:
            node.on_peer_message("n1", to_pb(AppendRequest("n1", "n0", 1, 0, 0, entries, 0), "g"))
            deadline = time.monotonic() + 10
            while node.core.stable_index < len(entries):
                assert time.monotonic() < deadline, "entries not stored"
                await asyncio.sleep(0.005)
        finally:
            await node.stop()

    asyncio.run(go())


def test_a_static_member_with_a_zero_length_file_starts_from_its_settings(tmp_path: Path) -> None:
    """Before: StartError "not a membership file", the node out until a person acted."""
    cfg = _node_cfg(tmp_path)
    _fill(cfg, [Entry(1, i, b"e%d" % i) for i in range(1, 31)])
    (Path(cfg.store_dir) / CONF_FILE).write_bytes(b"")

    def check(node: DLedgerNode) -> None:
        assert node.core.conf_state.voters == {"n0", "n1"}
        assert node.corruption_found == {"membership": 1}
        assert node.membership_repairs == {FROM_SETTINGS: 1}

    _run(cfg, check, applied=30)
    saved = load_conf(cfg.store_dir, "n0")  # rewritten whole
    assert saved is not None and saved.index == 0 and saved.voters == {"n0", "n1"}


def test_a_member_with_a_garbled_file_takes_the_log_s_config_entry(tmp_path: Path) -> None:
    cfg = _node_cfg(tmp_path)
    grown = ConfState(frozenset({"n0", "n1"})).apply(
        ConfChange(ChangeKind.ADD_LEARNER, "n3", "h:4", "h:14"), 5
    )
    entries = [Entry(1, i, b"e%d" % i) for i in range(1, 31)]
    entries[4] = Entry(1, 5, grown.encode(), EntryType.CONFIG)
    _fill(cfg, entries)
    path = Path(cfg.store_dir) / CONF_FILE
    path.write_bytes(path.read_bytes()[:-9] + b"\x00garbage")

    def check(node: DLedgerNode) -> None:
        assert node.core.conf_state == grown
        assert node.membership_repairs == {FROM_LOG: 1}

    _run(cfg, check, applied=30)
    assert load_conf(cfg.store_dir, "n0") == grown


def test_a_joiner_nothing_decides_for_is_refused_with_a_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Started to join, its log holds entries but no CONFIG entry, no member answers: its
    settings must not make it a voter; the start is refused, naming what to do."""
    monkeypatch.setattr(confrepair, "QUORUM_WAIT_MS", 300)
    monkeypatch.setattr(confrepair, "QUORUM_ROUND_MS", 50)
    cfg = _node_cfg(tmp_path)
    _fill(cfg, [Entry(1, i, b"e%d" % i) for i in range(1, 11)])
    (Path(cfg.store_dir) / CONF_FILE).write_text('{"v": 1, "joining": tru')
    joiner = dataclasses.replace(cfg, join_addr="127.0.0.1:1")
    with pytest.raises(StartError, match="nothing decides the configuration") as err:
        _run(joiner, lambda node: None, applied=10)
    assert "started to join a group" in str(err.value)
    assert (Path(cfg.store_dir) / CONF_FILE).read_text() == '{"v": 1, "joining": tru'


def test_a_reseed_with_a_damaged_file_decides_its_voters_from_the_log_or_stops(
    tmp_path: Path,
) -> None:
    """A reseed (the application's state cannot be rebuilt from this log) drops the log only
    while another voter holds a copy: with the file damaged, the voters come from what the
    log and the settings decide, and a start nothing decides for stops instead."""
    cfg = _node_cfg(tmp_path)
    _fill(cfg, [Entry(1, i, b"e%d" % i) for i in range(1, 11)])
    (Path(cfg.store_dir) / CONF_FILE).write_bytes(b"")
    cause = NeedsSnapshotError("the state machine's files are gone")
    for joins, expect in ((False, "settings"), (True, "stop")):
        node = DLedgerNode(dataclasses.replace(cfg, join_addr="127.0.0.1:1" if joins else ""))
        node.store = SegmentedLogStore(cfg.store_dir, cfg.store)
        node._applied = 10
        try:
            if expect == "settings":
                assert node._reseed_conf(cause) is None  # the dLegerPeers voters
            else:
                with pytest.raises(StartError, match="which members hold a copy"):
                    node._reseed_conf(cause)
        finally:
            node.store.close()
