"""Shared fixtures: a local group that is always torn down, a check for stray processes, and
the test run's one SparkSession (the audit tests and the fuzz suite's audits share it)."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from client import PushConsumer
from mqcluster.cluster import LocalCluster, _pid_alive, _wait_pid_gone
from prockit.processes import free_ports

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

# Every node PID a test started, to prove at the end that none outlived its test.
_STARTED: list[tuple[int, str]] = []

# Small segments keep the tests' disk footprint and pre-allocation time small.
TEST_SEGMENT_BYTES = 4 << 20
# Small log index files too: each is allocated in full at start, and the default (32 MiB per
# node) was three quarters of the disk a test group took. 1 MiB holds 32,768 entries.
TEST_INDEX_FILE_BYTES = 1 << 20

ClusterFactory = Callable[..., LocalCluster]


@pytest.fixture
def local_group(tmp_path: Path) -> Iterator[ClusterFactory]:
    """``local_group(nodes=3, **broker_conf)`` starts a group on free ports and waits for a leader.

    Every group is stopped (SIGTERM, then SIGKILL) when the test ends, pass or fail.
    """
    clusters: list[LocalCluster] = []

    def make(
        nodes: int = 3,
        wait: bool = True,
        namesrv: bool = False,
        secure: bool = False,
        **conf: object,
    ) -> LocalCluster:
        """``namesrv=True``: the group also gets its own NameServer (``cluster.namesrv``);
        ``secure=True``: TLS, member certificates and ACLs, as ``mqcluster up`` makes it."""
        extra = {
            "mappedFileSizeCommitLog": str(TEST_SEGMENT_BYTES),
            "mappedFileSizeEntryIndex": str(TEST_INDEX_FILE_BYTES),
        }
        extra.update({k: str(v) for k, v in conf.items()})
        cluster = LocalCluster(tmp_path / f"group{len(clusters)}")
        clusters.append(cluster)
        cluster.configure(nodes, auto_ports=True, extra=extra, namesrv=namesrv, secure=secure)
        original_start = cluster.start
        original_start_namesrv = cluster.start_namesrv

        def start(node_id: str) -> int:
            pid = original_start(node_id)
            _STARTED.append((pid, cluster.node(node_id).conf))
            return pid

        def start_namesrv() -> int:
            pid = original_start_namesrv()
            assert cluster.namesrv is not None
            _STARTED.append((pid, cluster.namesrv.conf))
            return pid

        cluster.start = start  # type: ignore[method-assign]
        cluster.start_namesrv = start_namesrv  # type: ignore[method-assign]
        if wait:
            cluster.up()
        else:
            if cluster.namesrv is not None:
                cluster.start_namesrv()
            for n in cluster.nodes:
                cluster.start(n.node_id)
        return cluster

    yield make
    for cluster in clusters:
        cluster.down(grace_s=5.0)


@dataclass
class NameServerProc:
    """A NameServer process started by the ``name_servers`` fixture."""

    port: int
    conf: str
    log: str
    proc: subprocess.Popen[bytes]

    @property
    def addr(self) -> str:
        return f"127.0.0.1:{self.port}"

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self, sig: signal.Signals = signal.SIGTERM, timeout_s: float = 5.0) -> int | None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5.0)
        return self.proc.returncode


NameServerFactory = Callable[..., NameServerProc]


@pytest.fixture
def name_servers(tmp_path: Path) -> Iterator[NameServerFactory]:
    """``name_servers(**conf)`` starts one ``mqnamesrv`` on a free port (``conf``: its config
    keys) and waits until it listens. Every one is stopped when the test ends."""
    started: list[NameServerProc] = []

    def make(**conf: object) -> NameServerProc:
        # Not a port the test already chose for another of its keys (remotingListenPort...).
        chosen = {int(v) for v in conf.values() if isinstance(v, int) or str(v).isdigit()}
        (port,) = free_ports(1, avoid=chosen)
        base = tmp_path / f"namesrv{len(started)}"
        conf_path, log_path = base.with_suffix(".conf"), base.with_suffix(".log")
        values = {"listenPort": port, **conf}
        conf_path.write_text("".join(f"{k}={v}\n" for k, v in values.items()))
        with open(log_path, "ab") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "nameserver", "-c", str(conf_path)],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        ns = NameServerProc(port, str(conf_path), str(log_path), proc)
        started.append(ns)
        _STARTED.append((proc.pid, str(conf_path)))
        _wait_listening(ns)
        return ns

    yield make
    for ns in started:
        ns.stop()
        _wait_pid_gone(ns.proc.pid, ns.conf, 5.0)


def _wait_listening(ns: NameServerProc, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not ns.alive():
            raise AssertionError(f"NameServer exited at start: {Path(ns.log).read_text()}")
        with socket.socket() as s:
            s.settimeout(0.2)
            if s.connect_ex(("127.0.0.1", ns.port)) == 0:
                return
        time.sleep(0.05)
    raise AssertionError(f"NameServer not listening on {ns.addr} within {timeout_s} s")


# `make test` runs two pytest sessions side by side: `-m processes` (every test that starts
# processes: real groups, NameServers, the JVM), whose tests run one at a time in file order as
# before, since they are timing-sensitive; and `-m "not processes"` (unit, simulator, checker
# tests), which keeps the second core busy meanwhile. The mark is given here, at collection.
PROCESS_MARK = "processes"
# The markers and fixtures that say a test starts processes.
PROCESS_MARKERS = ("integration", "spark")
PROCESS_FIXTURES = frozenset({"local_group", "name_servers", "spark", "group_stores"})
# Directories whose every test starts processes, marker or not.
PROCESS_DIRS = ("integration", "audit")
TESTS_DIR = Path(__file__).resolve().parent


def starts_processes(item: pytest.Item) -> bool:
    """Whether ``item`` starts processes: a marker, a group fixture, or where it lives."""
    if any(item.get_closest_marker(m) is not None for m in PROCESS_MARKERS):
        return True
    if PROCESS_FIXTURES.intersection(getattr(item, "fixturenames", ())):
        return True
    return any(item.path.is_relative_to(TESTS_DIR / d) for d in PROCESS_DIRS)


def pytest_itemcollected(item: pytest.Item) -> None:
    # As each test is collected, before `-m` selects on the marks.
    if starts_processes(item):
        item.add_marker(PROCESS_MARK)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    stray = [pid for pid, conf in _STARTED if _pid_alive(pid, conf)]
    for pid in stray:
        os.kill(pid, 9)
    if stray:
        session.exitstatus = 1
        print(f"\nERROR: test processes outlived their tests: {stray}")


@pytest.fixture
def no_client_threads_left() -> Iterator[None]:
    """Every client thread a test started is gone once its clients were shut down."""
    from support import client_threads, wait_for

    yield
    wait_for(lambda: not client_threads(), 5.0, "client threads to stop")


@pytest.fixture
def consumers() -> Iterator[list[PushConsumer]]:
    """Every push consumer appended here is shut down at the end, pass or fail."""
    started: list[PushConsumer] = []
    yield started
    for c in started:
        c.shutdown()


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    """The one SparkSession of the test run: local[2] on 127.0.0.1, UI off. Started when a
    test first asks for it; every audit after that skips the JVM's and the Python workers'
    start (several seconds each)."""
    from spark_audit.job import SessionOptions, start_session

    os.environ["PYSPARK_PYTHON"] = sys.executable
    session = start_session(
        SessionOptions(master="local[2]", conf=(("spark.sql.shuffle.partitions", "2"),))
    )
    yield session
    session.stop()
