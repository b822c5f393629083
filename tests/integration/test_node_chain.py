"""Issue 31 on a real group: a forged append diverges a follower's committed log; the real
leader's next append finds it by content (the chained checksum), raises the alarm (a metric
and an ERROR line naming both sides), and the follower is repaired: its committed log is the
others' again, entry for entry."""

from __future__ import annotations

import json
import re
import urllib.request
from collections.abc import Callable
from pathlib import Path

import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families
from raftmq.dledger.v1 import dledger_pb2_grpc as pb_grpc
from support import own_labels, wait_for

from client.mqadmin import EXIT_FLAGGED
from client.mqadmin import main as mqadmin
from dledger.core import AppendRequest
from dledger.log import Entry
from dledger.server.client import ClientError, LogClient
from dledger.server.convert import to_pb
from mqcluster.cluster import LocalCluster

pytestmark = pytest.mark.integration

# Bound on each wait (a loaded 2-core machine: elections and catch-up take seconds).
WAIT_S = 30.0
SEEDS, AFTER = 5, 5
_MISMATCH = re.compile(
    r"ERROR \S+ node=(\S+) term=\d+ chain_mismatch committed entry index=(\d+) commit=\d+ "
    r"peer=(\S+) peer_chain=([0-9a-f]{16}) own_chain=([0-9a-f]{16})"
)


def _append_ok(client: LogClient, body: bytes) -> bool:
    try:
        client.append([body])
    except ClientError:
        return False
    return True


def _metrics(cluster: LocalCluster, url: str, names: tuple[str, ...]) -> dict[str, float]:
    """Unlabelled samples of a node's /metrics ({} while it does not answer)."""
    try:
        with urllib.request.urlopen(url, timeout=5, context=cluster.metrics_ssl_context()) as r:
            text = r.read().decode()
    except OSError:
        return {}
    return {
        s.name: float(s.value)
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name in names and not own_labels(s.labels)
    }


def _log(client: LogClient, addr: str, upto: int) -> list[tuple[int, int, int, bytes]]:
    try:
        return [(e.index, e.term, e.type, e.body) for e in client.read_all(addr, upto)]
    except ClientError:
        return []


def _forge(cluster: LocalCluster, leader_id: str, to: str, term: int, last: int) -> None:
    """One append to ``to``'s peer port claiming the leader's id and term: two entries after
    the leader's last and a commit index covering them (no chain: the term is compared)."""
    forged = AppendRequest(
        leader_id,
        to,
        term,
        last,
        term,
        (Entry(term, last + 1, b"forged-1"), Entry(term, last + 2, b"forged-2")),
        last + 2,
    )
    metadata = (
        ("x-raftmq-group", cluster.group),
        ("x-raftmq-from", leader_id),
        ("x-raftmq-client-addr", "203.0.113.66:1"),
    )
    port = cluster.node(to).peer_port
    with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
        pb_grpc.DLedgerPeerStub(ch).Stream(
            iter([to_pb(forged, cluster.group)]), metadata=metadata, timeout=5
        )


def test_forged_append_is_found_at_the_next_append_alarmed_and_repaired(
    local_group: Callable[..., LocalCluster], capsys: pytest.CaptureFixture[str]
) -> None:
    cluster = local_group(3)
    leader_id = cluster.wait_leader()
    leader = cluster.node(leader_id)
    victim = next(n for n in cluster.nodes if n.node_id != leader_id)
    with cluster.client() as client:
        for i in range(SEEDS):
            wait_for(lambda i=i: _append_ok(client, b"seed-%d" % i), WAIT_S, "seed appends")
        md = client.metadata(leader.client_addr)
        term, last = md.term, md.last_index
        wait_for(
            lambda: client.metadata(victim.client_addr).last_index >= last,
            WAIT_S,
            "the follower to hold the leader's last entry",
        )
        _forge(cluster, leader_id, victim.node_id, term, last)
        # Applied as committed on the follower: today's state of affairs, and the divergence.
        wait_for(
            lambda: b"forged-2" in {e[3] for e in _log(client, victim.client_addr, last + 2)},
            WAIT_S,
            "the follower to hold the forged entries as committed",
        )
        # The real leader's next append carries its own entries at those (index, term).
        for i in range(AFTER):
            wait_for(lambda i=i: _append_ok(client, b"after-%d" % i), WAIT_S, "appends after")
        victim_log = Path(victim.log)
        wait_for(
            lambda: _MISMATCH.search(victim_log.read_text(errors="replace")) is not None,
            WAIT_S,
            "the follower's ERROR line naming the mismatch",
        )
        m = _MISMATCH.search(victim_log.read_text(errors="replace"))
        assert m is not None
        assert (m.group(1), int(m.group(2)), m.group(3)) == (victim.node_id, last + 1, leader_id)
        assert m.group(4) != m.group(5)
        names = (
            "raftmq_corruption_chain_mismatch_total",
            "raftmq_corruption_committed_repairs_total",
        )
        seen: list[dict[str, float]] = []

        def alarmed() -> bool:
            seen.append(_metrics(cluster, victim.metrics_url, names))
            return seen[-1].get(names[0], 0) >= 1 and seen[-1].get(names[1], 0) >= 1

        wait_for(alarmed, WAIT_S, "the mismatch and repair metrics")
        assert seen[-1][names[1]] == 1
        # Repaired: the follower's committed log is the leader's, entry for entry.
        upto = client.metadata(leader.client_addr).commit_index
        want = _log(client, leader.client_addr, upto)
        assert len(want) == upto and not any(b"forged" in e[3] for e in want)
        for n in cluster.nodes:
            wait_for(
                lambda a=n.client_addr: _log(client, a, upto) == want,
                WAIT_S,
                f"{n.node_id}'s committed log to be the leader's",
            )
        # And the group goes on: a send commits on all three.
        wait_for(lambda: _append_ok(client, b"final"), WAIT_S, "an append after the repair")
        assert cluster.wait_leader(10) == leader_id
        _replica_status_shows_the_repair(cluster, victim.node_id, capsys)
    text = victim_log.read_text(errors="replace")
    assert f"repair_committed index={last + 1}" in text
    assert "Traceback" not in text and "FATAL" not in text, text[-3000:]


def _replica_status_shows_the_repair(
    cluster: LocalCluster, victim: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """mqadmin replicaStatus on the repaired group: every member answers with the same chain
    at the common committed index, and the victim is flagged for its committed repair (exit
    3): the Metadata fields come from the running nodes."""
    # -a names the group by a node; mqadmin wants a NameServer address all the same.
    argv = [*cluster.tool_argv(), "-n", "127.0.0.1:9", "--json", "replicaStatus"]
    argv += ["-a", cluster.nodes[0].client_addr]
    capsys.readouterr()
    code, out = mqadmin(argv), capsys.readouterr()
    assert code == EXIT_FLAGGED, out.err
    doc = json.loads(out.out)
    rows = {r["node"]: r for r in doc["rows"]}
    assert set(rows) == {n.node_id for n in cluster.nodes}
    index = doc["chain_index"]
    assert index > 0 and "group_flags" not in doc, doc
    chains = {r[f"chain@{index}"] for r in rows.values()}
    assert len(chains) == 1 and "-" not in chains, rows
    assert "committed entries repaired 1" in rows[victim]["flags"], rows[victim]
    assert all(r["repairing"] == "no" for r in rows.values())
