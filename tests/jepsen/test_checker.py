"""The checkers have teeth: hand-made histories with a lost write, a duplicate, a reordering,
a divergent read, a divergent replica and two leaders in a term are each flagged, and a clean
history passes."""

from __future__ import annotations

from dataclasses import asdict
from types import SimpleNamespace
from typing import Any

from client.errors import MQClientError
from jepsen_like.checker import CheckResult, NodeState, check_all
from jepsen_like.history import MONITOR, NEMESIS, History, OpType, load_history, make_ops
from jepsen_like.workloads import _Base

Rec = tuple[str, OpType, str, Any, float]


def _send(p: str, v: int, q: int, offset: int | None, t: float, dt: float = 0.01) -> list[Rec]:
    inv: Rec = (p, "invoke", "send", {"v": v, "queue": q}, t)
    if offset is None:
        return [inv, (p, "info", "send", {"v": v, "queue": q, "error": "NO_QUORUM"}, t + dt)]
    return [inv, (p, "ok", "send", {"v": v, "queue": q, "offset": offset}, t + dt)]


def _drain(triples: list[list[int]], t: float = 100.0) -> list[Rec]:
    return [
        ("drain", "invoke", "drain", {"queue": 0}, t),
        ("drain", "ok", "drain", triples, t + 0.1),
    ]


def _node(nid: str, sums: list[tuple[int, int, int]], cq: list[tuple[int, str]]) -> NodeState:
    return NodeState(nid, len(sums), len(sums), sums, {"jepsen/0": cq})


GOOD_SUMS = [(1, 1, 11), (2, 1, 22), (3, 2, 33)]
GOOD_CQ = [(0, "A"), (1, "B"), (2, "C")]


def _clean() -> list[Rec]:
    return (
        _send("p0", 1, 0, 0, 1.0)
        + _send("p1", 2, 0, 1, 2.0)
        + _send("p0", 3, 0, 2, 3.0)
        + [
            ("c0", "invoke", "poll", {"queue": 0}, 3.5),
            ("c0", "ok", "poll", [[0, 0, 1], [0, 1, 2]], 3.6),
            (MONITOR, "ok", "state", {"node": "n0", "role": "LEADER", "term": 1}, 1.0),
            (MONITOR, "ok", "state", {"node": "n1", "role": "FOLLOWER", "term": 1}, 1.0),
            (NEMESIS, "info", "start", {"fault": "kill", "detail": "x"}, 1.5),
            (NEMESIS, "info", "stop", {"fault": "kill", "detail": "x"}, 2.5),
        ]
        + _drain([[0, 0, 1], [0, 1, 2], [0, 2, 3]])
    )


def _by_name(results: list[CheckResult]) -> dict[str, CheckResult]:
    return {r.name: r for r in results}


def _check(recs: list[Rec], nodes: list[NodeState] | None = None) -> dict[str, CheckResult]:
    if nodes is None:
        nodes = [_node("n0", GOOD_SUMS, GOOD_CQ), _node("n1", GOOD_SUMS, GOOD_CQ)]
    return _by_name(check_all(make_ops(recs), nodes))


def test_clean_history_passes() -> None:
    results = _check(_clean())
    assert all(r.valid for r in results.values()), results


def test_lost_write_is_flagged() -> None:
    recs = _send("p0", 1, 0, 0, 1.0) + _send("p1", 2, 0, 1, 2.0) + _drain([[0, 0, 1]])
    r = _check(recs)
    assert not r["lost"].valid and r["lost"].count == 1
    assert r["lost"].examples[0]["v"] == 2
    assert r["unexpected"].valid


def test_unknown_outcome_missing_is_not_lost() -> None:
    recs = _send("p0", 1, 0, 0, 1.0) + _send("p1", 2, 0, None, 2.0) + _drain([[0, 0, 1]])
    assert _check(recs)["lost"].valid


def test_failed_drain_fails_lost() -> None:
    recs = [
        *_send("p0", 1, 0, 0, 1.0),
        ("drain", "invoke", "drain", {"queue": 0}, 5.0),
        ("drain", "fail", "drain", {"queue": 0, "error": "UNAVAILABLE"}, 6.0),
    ]
    assert not _check(recs)["lost"].valid


def test_duplicate_is_flagged() -> None:
    recs = (
        _send("p0", 1, 0, 0, 1.0)
        + _send("p1", 2, 0, 1, 2.0)
        + _drain([[0, 0, 1], [0, 1, 2], [0, 2, 1]])
    )
    r = _check(recs)
    assert not r["duplicated"].valid and r["duplicated"].count == 1
    assert r["duplicated"].examples[0]["v"] == 1
    assert _by_name(check_all(make_ops(recs), None, max_duplicates=1))["duplicated"].valid


def test_unexpected_value_is_flagged() -> None:
    recs = _send("p0", 1, 0, 0, 1.0) + _drain([[0, 0, 1], [0, 1, 99]])
    r = _check(recs)
    assert not r["unexpected"].valid and r["unexpected"].examples[0]["v"] == 99


def test_real_time_reordering_is_flagged() -> None:
    # 1 was acknowledged (t=1.01) before 2 was invoked (t=2.0), yet 2 precedes 1 in the queue.
    recs = _send("p0", 1, 0, 1, 1.0) + _send("p1", 2, 0, 0, 2.0) + _drain([[0, 0, 2], [0, 1, 1]])
    r = _check(recs)
    assert not r["order"].valid
    assert r["order"].stats["by_kind"] == {"real-time": 1}


def test_concurrent_writes_may_be_in_either_order() -> None:
    recs: list[Rec] = [
        ("p0", "invoke", "send", {"v": 1, "queue": 0}, 1.0),
        ("p1", "invoke", "send", {"v": 2, "queue": 0}, 1.1),
        ("p1", "ok", "send", {"v": 2, "queue": 0, "offset": 0}, 1.2),
        ("p0", "ok", "send", {"v": 1, "queue": 0, "offset": 1}, 1.3),
        *_drain([[0, 0, 2], [0, 1, 1]]),
    ]
    assert _check(recs)["order"].valid


def test_ack_at_wrong_position_is_flagged() -> None:
    recs = _send("p0", 1, 0, 0, 1.0) + _send("p1", 2, 0, 0, 2.0) + _drain([[0, 0, 1], [0, 1, 2]])
    r = _check(recs)
    assert not r["order"].valid and "ack-position" in r["order"].stats["by_kind"]


def test_read_that_diverges_from_final_log_is_flagged() -> None:
    recs = _clean()
    recs.insert(6, ("c1", "invoke", "poll", {"queue": 0}, 3.5))
    recs.insert(7, ("c1", "ok", "poll", [[0, 1, 3]], 3.6))  # the final log has 2 there
    r = _check(recs)
    assert not r["order"].valid and "read-diverges" in r["order"].stats["by_kind"]


def test_divergent_replica_is_flagged() -> None:
    bad = [(1, 1, 11), (2, 2, 99), (3, 2, 33)]
    r = _check(_clean(), [_node("n0", GOOD_SUMS, GOOD_CQ), _node("n1", bad, GOOD_CQ)])
    assert not r["replicas"].valid
    assert r["replicas"].examples[0]["kind"] == "entry-differs"
    assert r["replicas"].examples[0]["index"] == 2


def test_replica_missing_entries_is_flagged() -> None:
    r = _check(_clean(), [_node("n0", GOOD_SUMS, GOOD_CQ), _node("n1", GOOD_SUMS[:2], GOOD_CQ)])
    assert not r["replicas"].valid


def test_divergent_consume_queue_is_flagged() -> None:
    cq = [(0, "A"), (1, "X"), (2, "C")]
    r = _check(_clean(), [_node("n0", GOOD_SUMS, GOOD_CQ), _node("n1", GOOD_SUMS, cq)])
    assert not r["replicas"].valid
    assert r["replicas"].examples[0]["kind"] == "consume-queue-differs"


def test_unreadable_replica_is_flagged() -> None:
    r = _check(_clean(), [_node("n0", GOOD_SUMS, GOOD_CQ), NodeState("n1", error="corrupt")])
    assert not r["replicas"].valid


def test_two_leaders_in_one_term_are_flagged() -> None:
    recs = [*_clean(), (MONITOR, "ok", "state", {"node": "n1", "role": "LEADER", "term": 1}, 2.0)]
    r = _check(recs)
    assert not r["leaders"].valid and r["leaders"].examples[0] == {
        "term": 1,
        "leaders": ["n0", "n1"],
    }


def test_history_round_trips_through_jsonl(tmp_path: Any) -> None:
    h = History(tmp_path / "h.jsonl")
    for p, t, f, v, _ in _clean():
        h.add(p, t, f, v)
    h.close()
    ops = load_history(tmp_path / "h.jsonl")
    assert [(o.process, o.type, o.f, o.value) for o in ops] == [r[:4] for r in _clean()]
    results = check_all(ops, None)
    assert all(r.valid for r in results)


def test_partition_shapes_cut_what_they_say() -> None:
    import random

    from jepsen_like.nemesis import PARTITION_SHAPES, partition_links

    ids = ["n0", "n1", "n2", "n3", "n4"]
    for shape in PARTITION_SHAPES:
        links, detail = partition_links(shape, ids, "n2", random.Random(1))
        assert links and detail, shape
        if shape == "isolate-leader":
            assert sorted(links) == sorted(
                [f"n2->{x}" for x in ids if x != "n2"] + [f"{x}->n2" for x in ids if x != "n2"]
            )
        if shape == "client-leader":
            assert links == ["client->n2"]
        if shape == "majorities-ring":  # every node still hears from a majority (itself too)
            for x in ids:
                heard = [y for y in ids if y != x and f"{y}->{x}" not in links]
                assert len(heard) + 1 >= 3 and len(heard) + 1 < 5, (x, heard)
        if shape == "random-halves":
            sides = {x for x in ids if any(link.startswith(f"{x}->") for link in links)}
            assert sides == set(ids)


def test_node_that_never_caught_up_is_flagged() -> None:
    nodes = [_node("n0", GOOD_SUMS, GOOD_CQ), _node("n1", GOOD_SUMS, GOOD_CQ)]
    results = _by_name(check_all(make_ops(_clean()), nodes, convergence="n1 behind"))
    assert not results["replicas"].valid
    assert results["replicas"].examples[0] == {"kind": "not-converged", "why": "n1 behind"}


def test_a_partition_cuts_only_the_links_that_exist() -> None:
    """After the membership nemesis added n3 (which has no proxy links), a partition that
    names n3 cuts the others' links and never asks the network for n3's (a KeyError there
    cost the rest of a 300 s run its partitions)."""
    import contextlib
    from types import SimpleNamespace

    from jepsen_like.nemesis import Nemesis

    cut: list[list[str]] = []
    links = {f"{a}->{b}": None for a in ("n0", "n1", "n2") for b in ("n0", "n1", "n2") if a != b}
    net = SimpleNamespace(links=links, cut=cut.append)
    cluster = SimpleNamespace(
        ids=["n0", "n1", "n2", "n3"],
        net=net,
        direct_client=contextlib.nullcontext,
        leader=lambda _c: "n0",
    )
    history = SimpleNamespace(now=lambda: 0.0, add=lambda *a: None)
    nemesis = Nemesis(cluster, history, ["partition"], 7, 1.0, ["isolate-leader"])  # type: ignore[arg-type]
    nemesis._fault("partition", 0.0)
    assert sorted(cut[0]) == sorted(["n0->n1", "n0->n2", "n1->n0", "n2->n0"])
    assert "2 links of added nodes do not exist" in nemesis.windows[0].detail


def test_a_failure_is_definite_only_when_no_attempt_may_have_written() -> None:
    """A NOT_LEADER is a definite failure, unless the client says an earlier attempt of the
    same send had an unknown outcome; an error that cannot say is unknown."""
    history = History()
    owner = SimpleNamespace(history=history)
    for unknown in (False, True):
        err = MQClientError("NOT_LEADER", "FAILED_PRECONDITION", "x", outcome_unknown=unknown)
        _Base._complete(owner, "p0", "send", {"v": 1}, err)  # type: ignore[arg-type]
    _Base._complete(owner, "p0", "send", {"v": 2}, RuntimeError("NOT_LEADER"))  # type: ignore[arg-type]
    assert [op.type for op in history.ops()] == ["fail", "info", "info"]


def _storage_fault(node: str, damage: str, t: float) -> list[Rec]:
    facts = {"fault": "storage", "detail": f"{damage} on {node}", "node": node, "damage": damage}
    return [(NEMESIS, "info", "start", facts, t), (NEMESIS, "info", "stop", facts, t + 3.0)]


def _state(node: str, t: float, repairing: bool) -> Rec:
    value = {"node": node, "role": "FOLLOWER", "term": 1, "commit": 3, "repairing": repairing}
    return (MONITOR, "ok", "state", value, t)


def _voting(nid: str, **kw: Any) -> NodeState:
    fields: dict[str, Any] = {"role": "FOLLOWER", "voter": True, "chain_index": 3, "chain": 7}
    fields.update(kw)
    return NodeState(nid, 3, 3, GOOD_SUMS, {"jepsen/0": GOOD_CQ}, **fields)


def test_a_damaged_node_that_repaired_and_votes_passes() -> None:
    recs = (
        _clean()
        + _storage_fault("n1", "rollback", 4.0)
        + [_state("n1", 5.0, True), _state("n1", 6.5, True), _state("n1", 7.0, False)]
    )
    results = _check(recs, [_voting("n0", role="LEADER"), _voting("n1")])
    assert all(r.valid for r in results.values()), results
    assert results["repaired"].stats["repairs"] == [
        {"node": "n1", "damage": "rollback", "at": 4.0, "took": 3.0}
    ]


def test_a_damaged_node_still_repairing_at_the_end_fails() -> None:
    """The run's teeth for issue 31's "a voter again without a manual step": a node that
    stays repairing (no vote, not counted) fails ``repaired``, though every write is there."""
    recs = _clean() + _storage_fault("n1", "bitflip", 4.0) + [_state("n1", 5.0, True)]
    nodes = [_voting("n0", role="LEADER"), _voting("n1", repairing=True)]
    results = _check(recs, nodes)
    assert results["lost"].valid and results["replicas"].valid
    rep = results["repaired"]
    assert not rep.valid
    assert rep.examples == [
        {"kind": "not-voting", "node": "n1", "repairing": True, "voter": True, "role": "FOLLOWER"}
    ]
    assert rep.stats["repairs"][0]["took"] is None  # never seen repaired
    # `mqjepsen check` reads the same state back from final-state.json
    assert [NodeState.from_dict(asdict(n)) for n in nodes] == nodes


def test_a_damaged_node_that_is_no_voter_or_does_not_answer_fails() -> None:
    for bad in (
        {"voter": False},
        {"role": "PRE_CANDIDATE"},
        {"error": "UNAVAILABLE: connection refused"},
    ):
        nodes = [_voting("n0", role="LEADER"), _voting("n1", **bad)]
        results = _check(_clean() + _storage_fault("n1", "hardstate", 4.0), nodes)
        assert not results["repaired"].valid, bad
    # an undamaged node's state is not the repaired check's business
    nodes = [_voting("n0", role="LEADER"), _voting("n1"), _voting("n2", voter=False)]
    assert _check(_clean() + _storage_fault("n1", "hardstate", 4.0), nodes)["repaired"].valid


def test_a_refused_start_or_a_slow_repair_fails() -> None:
    nodes = [_voting("n0", role="LEADER"), _voting("n1")]
    refused: Rec = (
        NEMESIS,
        "info",
        "refused",
        {"fault": "storage", "node": "n1", "damage": "truncate", "reason": "corrupt"},
        4.5,
    )
    results = _check(_clean() + _storage_fault("n1", "truncate", 4.0) + [refused], nodes)
    assert results["repaired"].examples[0]["kind"] == "refused-start"
    slow = [
        *_storage_fault("n1", "rollback", 4.0),
        _state("n1", 5.0, True),
        _state("n1", 70.0, True),
        _state("n1", 70.5, False),
    ]
    results = _check(_clean() + slow, nodes)
    assert results["repaired"].examples[0]["kind"] == "slow-repair"
    assert results["repaired"].examples[0]["took"] == 66.5


def test_replicas_with_different_chains_fail() -> None:
    """Equal (index, term, checksum) lists but different chained checksums at the common
    index: one store's own chain says its entries differ."""
    nodes = [_voting("n0", role="LEADER"), _voting("n1", chain=8)]
    results = _check(_clean(), nodes)
    assert not results["replicas"].valid
    assert results["replicas"].examples == [
        {"kind": "chain-differs", "index": 3, "n0": f"{7:016x}", "n1": f"{8:016x}"}
    ]
    assert _check(_clean(), [_voting("n0"), _voting("n1", chain_index=0)])["replicas"].valid
