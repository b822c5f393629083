"""Shared fixtures: a local group that is always torn down, and a check for stray processes."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from broker.cluster import LocalCluster

# Every node PID a test started, to prove at the end that none outlived its test.
_STARTED: list[tuple[int, str]] = []

# Small segments keep the tests' disk footprint and pre-allocation time small.
TEST_SEGMENT_BYTES = 4 << 20

ClusterFactory = Callable[..., LocalCluster]


@pytest.fixture
def local_group(tmp_path: Path) -> Iterator[ClusterFactory]:
    """``local_group(nodes=3, **broker_conf)`` starts a group on free ports and waits for a leader.

    Every group is stopped (SIGTERM, then SIGKILL) when the test ends, pass or fail.
    """
    clusters: list[LocalCluster] = []

    def make(nodes: int = 3, wait: bool = True, **conf: object) -> LocalCluster:
        extra = {"mappedFileSizeCommitLog": str(TEST_SEGMENT_BYTES)}
        extra.update({k: str(v) for k, v in conf.items()})
        cluster = LocalCluster(tmp_path / f"group{len(clusters)}")
        clusters.append(cluster)
        cluster.configure(nodes, auto_ports=True, extra=extra)
        original_start = cluster.start

        def start(node_id: str) -> int:
            pid = original_start(node_id)
            _STARTED.append((pid, cluster.node(node_id).conf))
            return pid

        cluster.start = start  # type: ignore[method-assign]
        if wait:
            cluster.up()
        else:
            for n in cluster.nodes:
                cluster.start(n.node_id)
        return cluster

    yield make
    for cluster in clusters:
        cluster.down(grace_s=5.0)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    from broker.cluster import _pid_alive

    stray = [pid for pid, conf in _STARTED if _pid_alive(pid, conf)]
    for pid in stray:
        os.kill(pid, 9)
    if stray:
        session.exitstatus = 1
        print(f"\nERROR: test processes outlived their tests: {stray}")
