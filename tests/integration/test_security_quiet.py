"""A healthy secure group refuses nobody (issue #32): what `mqcluster up` makes (TLS, member
certificates, users and ACLs), its followers calling their leader for its status every second
(retentionCheckIntervalMs=1000, where the default is 60 s), and its own start: no
authentication refusal on any member's /metrics, and no refusal line in any log, for a bounded
window. The issue's 10-minute form: RAFTMQ_QUIET_WINDOW_S=600."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from integration.test_metrics import found, scrape

from mqcluster.cluster import LocalCluster

pytestmark = [pytest.mark.integration]

# How long the group is watched: a dozen follower status calls each at 1 s apart.
QUIET_WINDOW_S = float(os.environ.get("RAFTMQ_QUIET_WINDOW_S", "12"))
# How often the members' metrics and logs are read within the window.
POLL_INTERVAL_S = 0.5
# What a refusal looks like in a log: the guard's warning, a caller's gRPC error.
REFUSAL_MARKS = ("refused (authentication)", "UNAUTHENTICATED")


def _refusal_lines(cluster: LocalCluster) -> list[str]:
    logs = [Path(n.log) for n in cluster.nodes]
    if cluster.namesrv is not None:
        logs.append(Path(cluster.namesrv.log))
    return [
        f"{log.name}: {line[:240]}"
        for log in logs
        if log.exists()
        for line in log.read_text(errors="replace").splitlines()
        if any(mark in line for mark in REFUSAL_MARKS)
    ]


def test_a_healthy_secure_group_logs_and_counts_no_authentication_refusal(
    local_group: Callable[..., LocalCluster],
) -> None:
    cluster = local_group(3, namesrv=True, secure=True, retentionCheckIntervalMs=1000)
    deadline = time.monotonic() + QUIET_WINDOW_S
    polls = 0
    while True:
        for n in cluster.nodes:
            samples = scrape(cluster, n.metrics_url)
            refused = found(samples, "raftmq_security_refusals_total", reason="authentication")
            assert not refused, f"{n.node_id}: {refused} authentication refusals"
        lines = _refusal_lines(cluster)
        assert lines == [], "\n".join(lines[:10])
        polls += 1
        if time.monotonic() >= deadline:
            break
        time.sleep(POLL_INTERVAL_S)
    assert polls >= 2
