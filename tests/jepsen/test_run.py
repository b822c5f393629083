"""End-to-end runs of ``mqjepsen`` against real local groups (real processes, gRPC, files).

- the CI form of the documented command passes;
- with the test-only ``unsafeAckBeforeReplication`` the same harness catches lost writes;
- disk faults (torn tail, flipped bit in a committed entry) leave the group working;
- the storage nemesis's short form: every kind of damage on one node of three, repaired by
  the node itself while the group serves.
Each run tears its group down; the tests also check that no node process survives.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from jepsen_like.__main__ import main
from mqcluster.cluster import _pid_alive

pytestmark = pytest.mark.integration

# The one seed CI runs (any seed must pass; a failing seed is a bug to reproduce with it).
# Seed 2 draws the membership nemesis first: the membership fault the short run must have is
# there whatever the timing does to the draws after it (seed 7's came by timing's luck).
CI_SEED = int(os.environ.get("RAFTMQ_JEPSEN_SEED", "2"))
# The short run issue #21 asks CI for: 60 s, four faults of SHORT_RUN_INTERVAL_S each with as
# long healthy in between, and a quiet end (5 + 4 x 10 - 5 = 40 s of schedule, 12 s quiet).
# (40 s with 4 s intervals schedules the same four faults 20 s sooner; the issue names 60 s.)
SHORT_RUN_TIME_LIMIT_S = 60
SHORT_RUN_INTERVAL_S = 5
# The storage nemesis's CI form: exactly five faults (`--faults 5`: its deck deals each kind
# once in any five storage windows) of 2 s with 2 s healthy between, then a 4 s quiet end.
# Its wall time is mostly the damaged node's restarts (a rollback restarts it twice, damage
# found at start once more), so it grows with the machine's load: on the shared 2-core test
# machine 41-66 s wall at load average 6.5-9 and 60-86 s at 11-13 (2026-11-28, 5 runs
# each). The time limit only bounds a machine slower still; a slow machine makes the run
# longer, never thinner.
STORAGE_SEED = int(os.environ.get("RAFTMQ_JEPSEN_STORAGE_SEED", "5"))
STORAGE_FAULTS = 5
STORAGE_TIME_LIMIT_S = 150
STORAGE_INTERVAL_S = 2
STORAGE_QUIET_S = 4
# What the damaged node's log says when it found and repaired each kind of damage.
REPAIR_LOG_MARKS = {
    "bitflip": "DAMAGE",
    "truncate": "DAMAGE",
    "rollback": "repair_done",
    "hardstate": "from the promise file",
    "derived": "consumequeue record wrong",
}


def _results(run_dir: Path) -> dict[str, object]:
    data: dict[str, object] = json.loads((run_dir / "results.json").read_text())
    return data


def _checks(run_dir: Path) -> dict[str, dict[str, object]]:
    checks = _results(run_dir)["checks"]
    assert isinstance(checks, list)
    return {str(c["name"]): c for c in checks}


def _assert_no_node_left(run_dir: Path) -> None:
    state = json.loads((run_dir / "cluster" / "cluster.json").read_text())
    for info in [*state["nodes"], state["namesrv"]]:
        pid_file = Path(info["pid_file"])
        assert not pid_file.exists() or not _pid_alive(int(pid_file.read_text()), info["conf"])


def test_short_run_passes(tmp_path: Path) -> None:
    """`mqjepsen run --nodes 3 --time-limit 60 --interval 5 --nemesis
    membership,partition,kill,pause --seed S`: the membership nemesis adds, removes (the
    leader too) and replaces nodes under the workload's load."""
    run_dir = tmp_path / "run"
    code = main(
        [
            "run",
            "--nodes",
            "3",
            "--time-limit",
            str(SHORT_RUN_TIME_LIMIT_S),
            "--interval",
            str(SHORT_RUN_INTERVAL_S),
            "--nemesis",
            "membership,partition,kill,pause",
            "--seed",
            str(CI_SEED),
            "--dir",
            str(run_dir),
        ]
    )
    checks = _checks(run_dir)
    assert code == 0, {k: v["summary"] for k, v in checks.items()}
    assert all(c["valid"] for c in checks.values())
    results = _results(run_dir)
    counts = results["op_counts"]
    assert isinstance(counts, dict)
    assert counts["send"]["ok"] > 100  # the workload really ran
    assert results["faults"], "the nemesis injected no fault"
    assert any(f["kind"] == "membership" for f in results["faults"]), results["faults"]
    for name in ("history.jsonl", "index.html", "latency.png", "throughput.png", "verdict.txt"):
        assert (run_dir / name).exists(), name
    _assert_no_node_left(run_dir)
    assert main(["check", str(run_dir)]) == 0  # the saved history and state check the same


def test_storage_nemesis_short_run_passes(tmp_path: Path) -> None:
    """`mqjepsen run --nodes 3 --nemesis storage --faults 5 --interval 2 --quiet 4
    --time-limit 150 --seed S`: under load, one node of the three has a bit flipped and a cut
    in committed data (any segment), its store rolled back to an older copy of itself, its
    hard state and a ConsumeQueue record damaged, each after a stop and followed by a
    restart. Nothing acknowledged is lost, the replicas end identical, and the damaged node
    found each damage, repaired itself and votes again with no manual step (``repaired``)."""
    run_dir = tmp_path / "storage"
    code = main(
        [
            "run",
            "--nodes",
            "3",
            "--time-limit",
            str(STORAGE_TIME_LIMIT_S),
            "--interval",
            str(STORAGE_INTERVAL_S),
            "--quiet",
            str(STORAGE_QUIET_S),
            "--faults",
            str(STORAGE_FAULTS),
            "--nemesis",
            "storage",
            "--seed",
            str(STORAGE_SEED),
            "--dir",
            str(run_dir),
        ]
    )
    checks = _checks(run_dir)
    assert code == 0, {k: v["summary"] for k, v in checks.items()}
    results = _results(run_dir)
    counts = results["op_counts"]
    assert isinstance(counts, dict)
    assert counts["send"]["ok"] > 100  # the workload really ran
    repaired = checks["repaired"]["stats"]
    assert isinstance(repaired, dict)
    assert set(repaired["faults"]) == set(REPAIR_LOG_MARKS), repaired  # every kind happened
    assert not results["refused_starts"]
    faults = results["faults"]
    assert isinstance(faults, list)
    victims = {f["detail"].split(" on ")[1].split(" ")[0] for f in faults}
    assert len(victims) == 1, victims  # a minority: one node of three
    log = (run_dir / "cluster" / f"{victims.pop()}.log").read_text(errors="replace")
    for kind, mark in REPAIR_LOG_MARKS.items():
        assert mark in log, (kind, mark)
    assert "Traceback" not in log
    _assert_no_node_left(run_dir)
    assert not (run_dir / "rollback-copies").exists() or not any(
        (run_dir / "rollback-copies").iterdir()
    )
    assert main(["check", str(run_dir)]) == 0


def test_unsafe_ack_is_caught_as_lost_writes(tmp_path: Path) -> None:
    """A group that acknowledges before majority replication loses acknowledged appends when
    its leader is isolated; the checker must say so (exit 1, `lost` > 0)."""
    run_dir = tmp_path / "teeth"
    code = main(
        [
            "run",
            "--workload",
            "log",
            "--time-limit",
            "12",
            "--interval",
            "3",
            "--nemesis",
            "partition",
            "--partitions",
            "isolate-leader",
            "--unsafe-ack",
            "--seed",
            "3",
            "--dir",
            str(run_dir),
        ]
    )
    assert code == 1
    lost = _checks(run_dir)["lost"]
    faults = json.loads((run_dir / "results.json").read_text())["faults"]
    assert not lost["valid"] and isinstance(lost["count"], int) and lost["count"] > 0, faults
    _assert_no_node_left(run_dir)
    assert main(["check", str(run_dir)]) == 1
    # every node said loudly that it was unsafe
    for log in sorted((run_dir / "cluster").glob("n[0-9].log")):
        assert "UNSAFE unsafeAckBeforeReplication=true" in log.read_text(errors="replace"), log


def test_a_group_that_cannot_start_is_torn_down(tmp_path: Path) -> None:
    run_dir = tmp_path / "broken"
    code = main(["run", "--set", "raftTickMs=1", "--time-limit", "5", "--dir", str(run_dir)])
    assert code == 1
    assert "raftTickMs" in (run_dir / "jepsen.log").read_text()
    _assert_no_node_left(run_dir)


def test_bad_usage_exits_2(tmp_path: Path) -> None:
    assert main(["run", "--nodes", "4", "--dir", str(tmp_path / "x")]) == 2
    assert main(["run", "--nemesis", "meteor", "--dir", str(tmp_path / "y")]) == 2
    assert main(["run", "--unsafe-ack", "--dir", str(tmp_path / "z")]) == 2  # needs log
    assert main(["run", "--storage-faults", "meteor", "--dir", str(tmp_path / "s")]) == 2
    assert main(["run", "--faults", "-1", "--dir", str(tmp_path / "f")]) == 2
    assert main(["frobnicate"]) == 2
