"""Fixtures of the audit tests: the stores of a real 3-node group written once per module
(each test audits its own copy), audited with the test run's one SparkSession
(tests/conftest.py ``spark``)."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from support import wait_for

from dledger.server.client import ClientError
from mqcluster.cluster import LocalCluster, _pid_alive
from spark_audit.__main__ import main as audit_main

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

# Segments as small as the shared local_group fixture uses (tests/conftest.py), so that the
# group's log spans several segment files.
TEST_SEGMENT_BYTES = 4 << 20
# Log index files of 1 MiB (32,768 entries), as local_group's: allocated in full at start.
TEST_INDEX_FILE_BYTES = 1 << 20
# What the group writes: about 10 MiB per replica, i.e. three 4 MiB segments.
BODY_BYTES = 4000
BATCHES = 25
BODIES_PER_BATCH = 100
# Seconds to wait for every node to hold and apply the last entry.
CONVERGE_S = 60.0
STOP_GRACE_S = 10.0


@dataclass(frozen=True)
class GroupStores:
    """The stopped group's stores: ``root/n{i}/dledger-n{i}``."""

    root: Path
    replicas: tuple[str, ...]
    last_index: int
    live_exit_code: int  # mqaudit --connect on the running group, before it was stopped
    live_report: dict[str, Any]
    segment_bytes: int = TEST_SEGMENT_BYTES

    def copy(self, dest: Path) -> dict[str, Path]:
        """A private copy of every replica's store; returns replica -> store dir."""
        out = {}
        for r in self.replicas:
            src = self.root / r / f"dledger-{r}"
            dst = dest / r / f"dledger-{r}"
            shutil.copytree(src, dst, ignore=shutil.ignore_patterns("lock"))
            out[r] = dst
        return out


def _body(batch: int, i: int) -> bytes:
    head = f"batch={batch} i={i} ".encode()
    return head + bytes((batch * 131 + i * 7 + k) % 251 for k in range(BODY_BYTES - len(head)))


@pytest.fixture(scope="session")
def group_stores(
    tmp_path_factory: pytest.TempPathFactory, spark: SparkSession
) -> Iterator[GroupStores]:
    """Start a real 3-node group, append ~10 MiB of raw entries, wait until every node has
    applied them, audit the running group once (``--connect``: each node tells its store
    path and commit index), stop the group (clean shutdown writes each checkpoint) and hand
    over the stores. Written once per test session; every test audits its own copy. The
    group is always stopped, pass or fail."""
    base = tmp_path_factory.mktemp("audit-group")
    cluster = LocalCluster(base)
    cluster.configure(
        3,
        auto_ports=True,
        extra={
            "mappedFileSizeCommitLog": str(TEST_SEGMENT_BYTES),
            "mappedFileSizeEntryIndex": str(TEST_INDEX_FILE_BYTES),
        },
    )
    try:
        cluster.up()
        with cluster.client() as client:
            for b in range(BATCHES):
                client.append([_body(b, i) for i in range(BODIES_PER_BATCH)])
            state: dict[str, tuple[int, int, int]] = {}

            def converged() -> bool:
                state.clear()
                for addr in cluster.client_addrs:
                    try:
                        md = client.metadata(addr, timeout_s=1.0)
                    except ClientError:
                        return False
                    state[addr] = (md.last_index, md.commit_index, md.applied_index)
                return len({v for v in state.values()}) == 1 and all(
                    a == b == c for a, b, c in state.values()
                )

            wait_for(converged, CONVERGE_S, "every node to apply the last entry")
            last = next(iter(state.values()))[0]
        live_json = base / "live-audit.json"
        live_code = audit_main(
            [
                "--connect",
                ",".join(cluster.client_addrs),
                "--json",
                str(live_json),
                "-q",
                *cluster.tool_argv(),
            ],
            spark=spark,
        )
        live_report = json.loads(live_json.read_text())
    finally:
        cluster.down(grace_s=STOP_GRACE_S)
    for n in cluster.nodes:
        pid_file = Path(n.pid_file)
        if pid_file.exists():
            pid = int(pid_file.read_text().strip())
            assert not _pid_alive(pid, n.conf), f"node {n.node_id} outlived the fixture"
    yield GroupStores(base, tuple(n.node_id for n in cluster.nodes), last, live_code, live_report)
