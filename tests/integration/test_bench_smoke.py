"""``mqbench --smoke`` runs every part of the benchmark end to end and writes its three files.
No figure is asserted (speed is proven by ``make bench``, never by timed tests)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

SMOKE_TIMEOUT_S = 240


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
    on_cases = [c for c in result["metrics"]["cases"] if c["metrics"] == "on"]
    assert on_cases and all(c["scrapes"] > 0 and c["scrape_failures"] == 0 for c in on_cases)
    assert all(c["scrapes"] == 0 for c in result["metrics"]["cases"] if c["metrics"] == "off")
    assert {r["figure"] for r in result["ratios"]} >= {"failover median (s)"}
    # The official RocketMQ 5 Python client's v2 producer, on the same group (issue #19).
    v2 = result["produce_v2"]
    assert [(c["in_flight"], c["flush"]) for c in v2] == [(1, "SYNC_FLUSH"), (16, "SYNC_FLUSH")]
    assert all(c["messages"] > 0 and c["failed"] == 0 and c["p99_ms"] > 0 for c in v2), v2
    md = result_json.with_suffix(".md").read_text()
    assert md.startswith("# mqbench") and "## v2 producer" in md
    assert result_json.with_suffix(".png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
