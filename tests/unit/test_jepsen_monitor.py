"""The jepsen monitor outlives a node the membership nemesis removed while it polled."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

from support import wait_for

from jepsen_like.workloads import Monitor
from mqcluster.cluster import ClusterError


class _Client:
    def metadata(self, addr: str, timeout_s: float) -> Any:
        return SimpleNamespace(role="LEADER", term=3, commit_index=7, repairing=False)


class _Cluster:
    """'gone' is still in the id list the monitor reads, but the cluster no longer knows it."""

    def __init__(self) -> None:
        self.ids = ["gone", "n0"]
        self.paused: set[str] = set()

    @contextlib.contextmanager
    def direct_client(self) -> Iterator[_Client]:
        yield _Client()

    def node(self, nid: str) -> Any:
        if nid == "gone":
            raise ClusterError("unknown node 'gone'; nodes: n0")
        return SimpleNamespace(client_addr="127.0.0.1:1")


class _History:
    def __init__(self) -> None:
        self.rows: list[dict[str, Any]] = []
        self.lock = threading.Lock()

    def add(self, process: str, kind: str, f: str, value: dict[str, Any]) -> None:
        with self.lock:
            self.rows.append(value)


def test_a_removed_node_is_skipped_and_the_monitor_keeps_polling() -> None:
    history = _History()
    monitor = Monitor(_Cluster(), history)  # type: ignore[arg-type]
    monitor.start()
    try:
        wait_for(lambda: len(history.rows) >= 2, 10, "two polls of n0")
        assert monitor._thread.is_alive()
    finally:
        monitor.stop()
    assert {r["node"] for r in history.rows} == {"n0"}
