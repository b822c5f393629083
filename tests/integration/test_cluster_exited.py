"""A node that ends itself (prockit/fatal.py: a FATAL line, exit 70) shows in `mqcluster status`
as EXITED with that line, while the rest of the group keeps serving."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import pytest
from support import wait_for

from mqcluster.cluster import LEADER_WAIT_S, ClusterError, LocalCluster

pytestmark = pytest.mark.integration

# The ready loop runs many rounds a second; 50 rounds is well after the node joined the group.
FAILPOINT = "ready=raise@50"
# Seconds the armed node gets to reach its failpoint and exit.
EXIT_DEADLINE_S = 30.0


def test_status_shows_a_fatal_exit(local_group: Callable[..., Any]) -> None:
    cluster: LocalCluster = local_group(3)
    leader = cluster.wait_leader()
    victim = next(n for n in cluster.nodes if n.node_id != leader)
    cluster.signal(victim.node_id)  # SIGKILL, then start it again with the failpoint armed
    cluster.node_env[victim.node_id] = {"RAFTMQ_FAILPOINTS": FAILPOINT}
    pid = cluster.start(victim.node_id)
    wait_for(lambda: cluster.pid(victim) is None, EXIT_DEADLINE_S, f"{victim.node_id} to exit")
    rows = {r["node"]: r for r in cluster.status_rows()}
    row = rows[victim.node_id]
    assert row["role"] == "EXITED", row
    line = str(row["exit"])
    assert line.startswith("FATAL component="), line
    assert "failpoint ready" in line, line
    status = subprocess.run(
        [sys.executable, "-m", "mqcluster.cluster", "--base-dir", str(cluster.base), "status"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert status.returncode == 0, status.stdout + status.stderr  # the others have a leader
    assert f"{victim.node_id} exited: FATAL component=" in status.stdout
    assert pid not in [cluster.pid(n) for n in cluster.nodes]


# The leader wait `up` uses (mqcluster.cluster.LEADER_WAIT_S is 30 s): a group whose nodes all
# end at start must say why well before it.
NO_MAJORITY_DEADLINE_S = 20.0


def test_wait_leader_says_at_once_why_no_leader_can_be_elected(
    local_group: Callable[..., Any],
) -> None:
    """Every node refuses its broker.conf and exits: the leader wait fails as soon as no
    majority is left, naming the nodes and their logs' exit line, not after its deadline."""
    cluster: LocalCluster = local_group(3, wait=False, flushDiskType="SOMETIMES")
    started = time.monotonic()
    with pytest.raises(ClusterError, match="no leader can be elected") as caught:
        cluster.wait_leader(LEADER_WAIT_S)
    assert time.monotonic() - started < NO_MAJORITY_DEADLINE_S
    assert "flushDiskType" in str(caught.value), caught.value
    assert "of 3 nodes exited" in str(caught.value), caught.value
