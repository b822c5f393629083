"""``mqadmin replicaStatus`` against a fake group: one row per member, the chains compared at
the lowest commit index, and the flags (repairing, chains that differ, damage counters, a
member not answering) that make the exit code 3."""

from __future__ import annotations

import json

import grpc
import pytest
from raftmq.dledger.v1 import dledger_pb2 as dpb

from client import mqadmin, replicas
from client.members import MemberRow, Members

MEMBERS = [("n0", "127.0.0.1:1"), ("n1", "127.0.0.1:2"), ("n2", "127.0.0.1:3")]
# Each member's chain at each index it holds (the same content everywhere by default).
GOOD_CHAINS = {i: 0x1000 + i for i in range(1, 11)}


class _Unreachable(grpc.RpcError):  # type: ignore[misc]
    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.UNAVAILABLE

    def details(self) -> str:
        return "connection refused"

    def trailing_metadata(self) -> tuple[()]:
        return ()


class _FakeGroup:
    """Answers Metadata per node from its commit index and its chains; records each ask."""

    def __init__(self, commits: dict[str, int]) -> None:
        self.commits = commits
        self.chains = {node: dict(GOOD_CHAINS) for node in commits}
        self.extra: dict[str, dict[str, object]] = {node: {} for node in commits}
        self.down: set[str] = set()
        self.asked: list[tuple[str, int]] = []

    def call(self, addr: str, chain_index: int) -> dpb.MetadataResponse:
        node = next(n for n, a in MEMBERS if a == addr)
        self.asked.append((node, chain_index))
        if node in self.down:
            raise _Unreachable()
        chains = self.chains[node]
        commit = self.commits[node]
        resp = dpb.MetadataResponse(
            self_id=node,
            role="LEADER" if node == "n0" else "FOLLOWER",
            term=3,
            commit_index=commit,
            applied_index=commit,
            last_index=10,
            promised_index=10,
            commit_chain=chains[commit],
            chain_index=chain_index,
            chain=chains.get(chain_index, 0),
            chain_known=chain_index in chains,
        )
        for k, v in self.extra[node].items():
            if isinstance(v, dict):
                getattr(resp, k).update(v)
            else:
                setattr(resp, k, v)
        return resp


def test_a_healthy_group_compares_chains_at_the_lowest_commit_and_flags_nothing() -> None:
    group = _FakeGroup({"n0": 9, "n1": 7, "n2": 8})
    report = replicas.replica_status(group.call, MEMBERS)
    assert report.chain_index == 7
    assert {(n, i) for n, i in group.asked if i} == {("n0", 7), ("n1", 7), ("n2", 7)}
    assert not report.flagged
    assert [r.answer.chain for r in report.rows if r.answer] == [GOOD_CHAINS[7]] * 3


def test_a_chain_that_differs_at_the_common_index_is_flagged_naming_both_sides() -> None:
    group = _FakeGroup({"n0": 9, "n1": 7, "n2": 8})
    group.chains["n2"][7] = 0xBAD
    report = replicas.replica_status(group.call, MEMBERS)
    assert report.flagged
    (flag,) = report.flags
    assert "index 7" in flag and "n2=0000000000000bad" in flag
    assert f"n0={GOOD_CHAINS[7]:016x}" in flag


def test_repairing_damage_and_an_unreachable_member_are_flagged_per_node() -> None:
    group = _FakeGroup({"n0": 9, "n1": 9, "n2": 9})
    group.extra["n0"] = {"corruption_found": {"scrub": 1}, "derived_mismatches": {"index": 2}}
    group.extra["n1"] = {"repairing": True, "last_index": 4}
    group.down.add("n2")
    report = replicas.replica_status(group.call, MEMBERS)
    flags = {r.node_id: r.flags for r in report.rows}
    assert flags["n0"] == ("damage found 1 (scrub=1)", "derived-state mismatches 2 (index=2)")
    assert flags["n1"] == ("repairing (log ends at 4, promised 10)",)
    assert flags["n2"][0].startswith("no answer: ")
    assert report.chain_index == 9 and not report.flags  # the two that answered agree


def test_a_member_made_to_rebuild_more_than_once_in_its_window_is_flagged() -> None:
    group = _FakeGroup({"n0": 9, "n1": 9, "n2": 9})
    group.extra["n1"] = {"rewind_restarts_recent": 1}  # one repair: a fault, not a pattern
    group.extra["n2"] = {"rewind_restarts_recent": 3}
    flags = {r.node_id: r.flags for r in replicas.replica_status(group.call, MEMBERS).rows}
    assert flags["n1"] == ()
    assert flags["n2"][0].startswith("restarted 3 times in a row to rebuild its state")
    assert "REWIND_REPEATS" in flags["n2"][0]


def _run(group: _FakeGroup, monkeypatch: pytest.MonkeyPatch, *flags: str) -> int:
    rows = tuple(MemberRow(n, "VOTER", "p", a, 0, True) for n, a in MEMBERS)
    monkeypatch.setattr(replicas, "list_members", lambda ch, addr: Members(rows, "n0", 1, True, 3))
    monkeypatch.setattr(replicas, "metadata_caller", lambda channels: group.call)
    argv = ["-n", "x:1", *flags, "replicaStatus", "-a", "127.0.0.1:1"]
    return mqadmin.main(argv)


def test_the_command_prints_one_row_per_node_and_exits_3_when_flagged(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    group = _FakeGroup({"n0": 9, "n1": 8, "n2": 9})
    assert _run(group, monkeypatch) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:7] == [
        "node",
        "addr",
        "role",
        "release",
        "feature_level",
        "supported_feature_level",
        "term",
    ]
    assert "chain@8" in lines[0]
    assert [ln.split()[0] for ln in lines[1:4]] == ["n0", "n1", "n2"]
    assert "flagged: False" in lines

    group.chains["n1"][8] = 0xBAD
    group.extra["n2"] = {"repairing": True}
    assert _run(group, monkeypatch, "--json") == mqadmin.EXIT_FLAGGED == 3
    doc = json.loads(capsys.readouterr().out)
    assert doc["flagged"] is True and doc["chain_index"] == 8
    assert "chain differs at committed index 8" in doc["group_flags"]
    by_node = {r["node"]: r for r in doc["rows"]}
    assert by_node["n1"]["chain@8"] == "0000000000000bad"
    assert by_node["n2"]["repairing"] == "YES" and by_node["n2"]["flags"].startswith("repairing")
    assert by_node["n0"]["flags"] == "-"
    # A node of a release before feature levels answers without them.
    assert by_node["n0"]["release"] == "<=0.2.0" and by_node["n0"]["feature_level"] == 1


def test_a_member_below_the_groups_level_is_flagged(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    group = _FakeGroup({"n0": 9, "n1": 9, "n2": 9})
    for n in ("n0", "n1"):
        group.extra[n] = {"release": "0.3.0", "feature_level": 2, "supported_feature_level": 2}
    assert _run(group, monkeypatch, "--json") == mqadmin.EXIT_FLAGGED
    doc = json.loads(capsys.readouterr().out)
    assert doc["group_flags"] == (
        "n2 supports feature level 1 < group level 2: upgrade it (runs 0.2.0 or older)"
    )
    by_node = {r["node"]: r for r in doc["rows"]}
    assert by_node["n0"]["release"] == "0.3.0" and by_node["n0"]["feature_level"] == 2
    assert by_node["n2"]["supported_feature_level"] == 1
