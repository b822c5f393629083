"""The leader's periodic chain check (dledger.server.chaincheck, docs/RAFT.md section 13):
it names one committed index every peer asked holds, compares each peer's chain there with
its own, and counts and logs a peer whose chain differs, naming both sides."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import Any, cast

import grpc
import pytest
from raftmq.dledger.v1 import dledger_pb2 as pb

from dledger.core import PeerStatus, Role, Status
from dledger.log import IndexOutOfRangeError
from dledger.server import chaincheck
from dledger.server.metrics import _damage_families
from dledger.server.node import DLedgerNode, NodeConfig
from dledger.storage import StoreConfig

CHAINS = {i: 0xC0 + i for i in range(1, 21)}


class _Store:
    damage = None  # no damage report from an open

    def chain_at(self, index: int) -> int:
        if index not in CHAINS:
            raise IndexOutOfRangeError(f"index {index}")
        return CHAINS[index]


@dataclass
class _Core:
    role: Role = Role.LEADER
    commit_index: int = 15
    matches: dict[str, int] = field(default_factory=lambda: {"n1": 12, "n2": 20})

    def status(self) -> Status:
        peers = tuple(
            PeerStatus(p, m, m + 1, "replicate", 0, 0, True) for p, m in self.matches.items()
        )
        return Status(
            "n0", self.role, 2, "n0", "n0", self.commit_index, 15, 20, 20, None, peers, {}
        )


@dataclass
class _Cfg:
    self_id: str = "n0"
    group: str = "g"


class _Node:
    """What the check reads of a node: its core's status, store, config and counters."""

    def __init__(self) -> None:
        self.core = _Core()
        self.store = _Store()
        self.cfg = _Cfg()
        self.chain_check_mismatches: dict[str, int] = {}
        self.corruption_found: dict[str, int] = {}
        self.membership_repairs: dict[str, int] = {}
        self.state_rebuilds: dict[str, int] = {}
        self.rewind_restarts_recent = 0
        self.scrubber = None

    def peer_client_addr(self, node_id: str) -> str:
        return {"n1": "127.0.0.1:1", "n2": "127.0.0.1:2"}.get(node_id, "")


class _Refused(grpc.RpcError):  # type: ignore[misc]
    pass


def _peers(chains: dict[str, dict[int, int]], down: frozenset[str] = frozenset()) -> Any:
    """Peers answering Metadata from their own chains; records (addr, index) asked."""
    asked: list[tuple[str, int]] = []
    by_addr = {"127.0.0.1:1": "n1", "127.0.0.1:2": "n2"}

    async def ask(addr: str, index: int) -> pb.MetadataResponse:
        asked.append((addr, index))
        peer = by_addr[addr]
        if peer in down:
            raise _Refused()
        own = chains[peer]
        return pb.MetadataResponse(
            self_id=peer, chain_index=index, chain=own.get(index, 0), chain_known=index in own
        )

    ask.asked = asked  # type: ignore[attr-defined]
    return ask


def _check(node: _Node, ask: Any) -> int:
    return asyncio.run(chaincheck.check_once(cast(DLedgerNode, node), ask))


def test_the_leader_asks_every_peer_at_the_lowest_match_or_commit_index() -> None:
    node = _Node()
    ask = _peers({"n1": dict(CHAINS), "n2": dict(CHAINS)})
    assert _check(node, ask) == 0
    assert sorted(ask.asked) == [("127.0.0.1:1", 12), ("127.0.0.1:2", 12)]
    assert node.chain_check_mismatches == {}


def test_a_peer_answering_another_chain_is_counted_and_logged_naming_both_sides(
    caplog: pytest.LogCaptureFixture,
) -> None:
    node = _Node()
    bad = dict(CHAINS)
    bad[12] = 0xBAD
    ask = _peers({"n1": dict(CHAINS), "n2": bad})
    caplog.set_level(logging.ERROR, logger=chaincheck.logger.name)
    chaincheck.logger.addHandler(caplog.handler)  # whatever an earlier test did to the root
    try:
        assert _check(node, ask) == 1
        assert _check(node, ask) == 1
    finally:
        chaincheck.logger.removeHandler(caplog.handler)
    assert node.chain_check_mismatches == {"n2": 2}
    (line, *_) = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert "committed index 12" in line
    assert f"n0 has chain {CHAINS[12]:016x}" in line and "n2 has 0000000000000bad" in line
    # The metric: every peer labelled, by member id only.
    families = {f.name: f for f in _damage_families(cast(DLedgerNode, node))}
    samples = {
        s.labels["peer"]: s.value
        for s in families["raftmq_corruption_chain_check_mismatch"].samples
        if s.name.endswith("_total")
    }
    assert samples == {"n1": 0, "n2": 2}


def test_peers_that_cannot_compare_are_skipped_and_followers_do_not_check() -> None:
    node = _Node()
    # n1 is down; n2 no longer holds index 12 (a snapshot base above it).
    ask = _peers({"n1": dict(CHAINS), "n2": {}}, down=frozenset({"n1"}))
    assert _check(node, ask) == 0 and node.chain_check_mismatches == {}
    node.core.role = Role.FOLLOWER
    ask = _peers({"n1": {}, "n2": {}})
    assert _check(node, ask) == 0 and ask.asked == []


def test_the_interval_is_bounded(tmp_path: Any) -> None:
    peers = {"n0": "127.0.0.1:1"}
    store = StoreConfig()
    for bad in (1, 999, chaincheck.MAX_CHAIN_CHECK_INTERVAL_MS + 1):
        with pytest.raises(Exception, match="chain_check_interval_ms"):
            NodeConfig(
                "g", "n0", peers, "127.0.0.1", 2, str(tmp_path), store, chain_check_interval_ms=bad
            )
    NodeConfig("g", "n0", peers, "127.0.0.1", 2, str(tmp_path), store, chain_check_interval_ms=0)
