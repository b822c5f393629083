"""Config validation, error codes, and the driver contract's edges."""

from __future__ import annotations

import random

import pytest

from dledger.core import (
    MUTATIONS,
    ConfigError,
    RaftConfig,
    RaftNode,
    Role,
)
from dledger.log import DLedgerError, EntryType
from dledger.sim.harness import finish_ready
from dledger.sim.memlog import MemLog


@pytest.mark.parametrize(
    "kwargs",
    [
        {"election_timeout_ticks": 1},
        {"heartbeat_interval_ticks": 0},
        {"heartbeat_interval_ticks": 10, "election_timeout_ticks": 10},
        {"max_inflight_appends": 0},
        {"max_inflight_appends": 1_000_000},
        {"max_append_batch_bytes": 0},
        {"max_append_batch_entries": 0},
        {"max_pending_proposal_bytes": 0},
        {"mutations": frozenset({"no_such_mutation"})},
    ],
)
def test_bad_config_is_rejected(kwargs: dict[str, object]) -> None:
    with pytest.raises(ConfigError) as info:
        RaftConfig(**kwargs)  # type: ignore[arg-type]
    assert info.value.code == "INVALID_CONFIG"
    assert isinstance(info.value, DLedgerError)


def test_defaults_have_no_mutations() -> None:
    cfg = RaftConfig()
    assert cfg.mutations == frozenset()
    assert len(MUTATIONS) == 13


def test_bad_membership_is_rejected() -> None:
    with pytest.raises(ConfigError):
        RaftNode("n0", [f"n{i}" for i in range(8)], MemLog(), RaftConfig(), random.Random(0))
    with pytest.raises(ConfigError):
        RaftNode("n0", ["n1", "n1"], MemLog(), RaftConfig(), random.Random(0))
    with pytest.raises(ConfigError):
        RaftNode(
            "n0", ["n1", "n2"], MemLog(), RaftConfig(preferred_leader_id="n7"), random.Random(0)
        )


def test_single_member_group_commits_alone() -> None:
    log = MemLog()
    node = RaftNode("n0", ["n0"], log, RaftConfig(), random.Random(0))
    applied = []
    proposed = False
    for _ in range(30):
        node.tick()
        while node.has_ready():
            rd = node.ready()
            assert rd.early_messages == ()
            assert finish_ready(node, log, rd) == []
            applied.extend(rd.committed)
        if node.role is Role.LEADER and not proposed:
            node.propose([b"solo"])
            proposed = True
    assert node.role is Role.LEADER
    assert [e.body for e in applied if e.type == EntryType.NORMAL] == [b"solo"]


def test_ready_must_be_advanced_before_the_next() -> None:
    node = RaftNode("n0", ["n1", "n2"], MemLog(), RaftConfig(), random.Random(0))
    rd = node.ready()
    with pytest.raises(AssertionError):
        node.ready()
    node.advance(rd)
    assert not node.has_ready()
