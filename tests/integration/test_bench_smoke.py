"""``mqbench --smoke`` runs every part of the benchmark end to end and writes its three files.
No figure is asserted (speed is proven by ``make bench``, never by timed tests)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

# The whole smoke run takes 1-2 minutes on a quiet machine, 3.5-4 on a loaded one (load 15-20).
SMOKE_TIMEOUT_S = 330


def test_mqbench_smoke_writes_json_markdown_and_chart(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "bench", "--smoke", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=SMOKE_TIMEOUT_S,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    (result_json,) = tmp_path.glob("*.json")
    result = json.loads(result_json.read_text())
    assert {c["flush"] for c in result["produce"]} == {"SYNC_FLUSH", "ASYNC_FLUSH"}
    assert all(c["messages"] > 0 and c["failed"] == 0 for c in result["produce"])
    assert result["e2e"]["received"] == result["e2e"]["sent"] > 0
    assert result["backlog"]["read"] == result["backlog"]["messages"]
    assert len(result["failover"]["seconds"]) == 1
    assert result["delay_retry"]["delayed"]["all_delivered"]
    assert result["delay_retry"]["retries"]["all_delivered"]
    # Issue #18: the main groups run secure (as mqcluster up makes them), and the send rate
    # with TLS and ACLs on and off is measured in the same run.
    assert result["secure"] is True
    security = result["security"]["cases"]
    assert sorted(c["security"] for c in security) == ["off", "on"], security
    assert all(c["messages"] > 0 and c["failed"] == 0 for c in security), security
    on_cases = [c for c in result["metrics"]["cases"] if c["metrics"] == "on"]
    assert on_cases and all(c["scrapes"] > 0 and c["scrape_failures"] == 0 for c in on_cases)
    assert all(c["scrapes"] == 0 for c in result["metrics"]["cases"] if c["metrics"] == "off")
    assert {r["figure"] for r in result["ratios"]} >= {"failover median (s)"}
    # The official RocketMQ 5 Python client's v2 producer, on the same group (issue #19).
    v2 = result["produce_v2"]
    assert [(c["in_flight"], c["flush"]) for c in v2] == [(1, "SYNC_FLUSH"), (16, "SYNC_FLUSH")]
    assert all(c["messages"] > 0 and c["failed"] == 0 and c["p99_ms"] > 0 for c in v2), v2
    # Issue #36: a backlog drained by the raftmq consumer and the official client's two, each
    # to the last message, with the leader's CPU per message.
    rx = result["receive_v2"]
    assert [c["client"].split()[-1] for c in rx["cases"]] == [
        "PushConsumer",
        "SimpleConsumer",
        "PushConsumer",
    ]
    assert all(c["messages"] == rx["backlog"] > 0 and c["failed"] == 0 for c in rx["cases"]), rx
    assert all(c["leader_cpu_ms_per_msg"] > 0 for c in rx["cases"]), rx
    assert all(sum(c["cpu_s_per_million_msgs"].values()) > 0 for c in v2), v2
    # SEND_MESSAGE_V2 over the remoting port, on the same group (issue #37): signed and over TLS.
    rem = result["produce_remoting"]
    assert [(c["in_flight"], c["flush"]) for c in rem] == [(1, "SYNC_FLUSH"), (16, "SYNC_FLUSH")]
    assert all(c["messages"] > 0 and c["failed"] == 0 and c["p99_ms"] > 0 for c in rem), rem
    # Issue #23: memory per node at rest and at peak, the floor, the peer table without peers.
    for flush in ("SYNC_FLUSH", "ASYNC_FLUSH"):
        mem = result["memory"][flush]
        assert set(mem["at_rest"]) == set(mem["peak"]) == {"n0", "n1", "n2"}
        for node, rest in mem["at_rest"].items():
            assert 0 < rest["rss_anon_mb"] <= mem["peak"][node]["rss_anon_mb"]
            assert rest["rss_file_mb"] > 0
    assert all(set(c["peak_memory_mb"]) == {"n0", "n1", "n2"} for c in result["produce"])
    assert result["rest_memory"]["stored_messages"] == 1024
    assert set(result["rest_memory"]["per_node"]) == {"n0", "n1", "n2"}
    (floor,) = result["floor"]["cases"]
    assert floor["in_flight"] == 16 and floor["ops"] > 0 and floor["errors"] == 0, floor
    assert [(r["flush"], r["in_flight"]) for r in result["floor_table"]] == [
        ("SYNC_FLUSH", 16),
        ("ASYNC_FLUSH", 16),
    ]
    assert all(r["rate_ratio"] > 0 for r in result["floor_table"])
    assert [r["peer_ops_s"] for r in result["peer_table"]] == [None, None]  # --no-peers
    md = result_json.with_suffix(".md").read_text()
    assert md.startswith("# mqbench") and "## v2 producer" in md and "## v2 receive" in md
    assert "## remoting producer" in md
    assert "## The floor" in md and "## Memory per node" in md
    assert result_json.with_suffix(".png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


BACKLOG_SMOKE_TIMEOUT_S = 300  # 50-137 s seen on the loaded 2-core test machine


def test_backlog_bench_smoke_writes_json_markdown_and_plot(tmp_path: Path) -> None:
    """``python -m bench.backlog`` at a tiny scale: every phase runs (fill in steps, the two
    probes, both restarts, the catch-up read) and the three files are written."""
    out = tmp_path / "out"
    argv = ["--messages", "3000", "--steps", "2", "--probe-seconds", "0.5"]
    argv += ["--probe-in-flight", "16", "--out", str(out), "--work", str(tmp_path)]
    proc = subprocess.run(
        [sys.executable, "-m", "bench.backlog", *argv],
        capture_output=True,
        text=True,
        timeout=BACKLOG_SMOKE_TIMEOUT_S,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    (result_json,) = out.glob("backlog-*.json")
    result = json.loads(result_json.read_text())
    assert [s["stored"] for s in result["steps"]] == [1280, 3000]
    assert all(set(s["rss_anon_mb"]) == {"n0", "n1", "n2"} for s in result["steps"])
    assert result["probe_empty"]["messages"] > 0 and result["probe_end"]["messages"] > 0
    one = result["restart_one"]
    assert one["loaded_snapshot"] and not one["rebuilt_from_log"], one
    assert 0 < one["answers_s"] <= one["applied_s"] <= one["serving_s"], one
    every = result["restart_all"]
    assert every["first_send_s"] > 0 and set(every["nodes"]) == {"n0", "n1", "n2"}
    assert all(n["loaded_snapshot"] for n in every["nodes"].values()), every
    # Everything stored (the fill, both probes, the restart's send) is read back.
    assert result["read"]["messages"] == result["read"]["expected"] >= 3000
    assert result_json.with_suffix(".md").read_text().startswith("# A deep backlog")
    assert result_json.with_suffix(".svg").read_text().lstrip().startswith("<?xml")
    assert not [p for p in tmp_path.iterdir() if p.name.startswith("raftmq-backlog-")]
