"""``mqcluster status`` for a node that ended on its own: EXITED and its log's FATAL line.

No broker runs here: a node's pid file names a process that already exited, and its log is
written by the test, as prockit/fatal.py would have written it.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

from mqcluster.cluster import (
    LOG_TAIL_BYTES,
    ClusterError,
    LocalCluster,
    format_table,
    last_exit_line,
    main,
)

FATAL = "FATAL component=ready cause=FailpointError: failpoint ready (hit 50)"


def _dead_pid() -> int:
    """The pid of a process that has exited (and was reaped)."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait(30)
    return proc.pid


@pytest.fixture
def cluster(tmp_path: Path) -> LocalCluster:
    c = LocalCluster(tmp_path / "c")
    c.configure(2, auto_ports=True)
    return c


def test_a_node_that_exited_shows_exited_with_its_fatal_line(cluster: LocalCluster) -> None:
    n0 = cluster.node("n0")
    Path(n0.pid_file).write_text(f"{_dead_pid()}\n")
    Path(n0.log).write_text(
        "2026-11-24 14:00:00,000 INFO dledger.server.node started\n"
        f"2026-11-24 14:00:01,000 CRITICAL prockit.fatal {FATAL}\n"
        "Traceback (most recent call last):\n"
        "dledger.failpoints.FailpointError: failpoint ready (hit 50)\n"
    )
    rows = {r["node"]: r for r in cluster.status_rows()}
    assert rows["n0"]["role"] == "EXITED"
    assert rows["n0"]["exit"] == FATAL  # the FATAL line, not the traceback after it
    assert rows["n1"]["role"] == "DOWN" and "exit" not in rows["n1"]  # never started
    text = format_table(list(rows.values()))
    assert text.splitlines()[-1] == f"n0 exited: {FATAL}"


def test_cli_status_prints_the_exit_line(
    cluster: LocalCluster, capsys: pytest.CaptureFixture[str]
) -> None:
    n1 = cluster.node("n1")
    Path(n1.pid_file).write_text(f"{_dead_pid()}\n")
    Path(n1.log).write_text("some line\nTraceback: OSError: [Errno 28] No space left on device\n")
    assert main(["--base-dir", str(cluster.base), "status"]) == 1  # no leader
    out = capsys.readouterr().out
    assert "EXITED" in out
    assert "n1 exited: Traceback: OSError: [Errno 28] No space left on device" in out


def test_exit_line_reads_only_the_tail_of_a_large_log(tmp_path: Path) -> None:
    log = tmp_path / "n0.log"
    filler = "filler line\n" * (LOG_TAIL_BYTES // 6)
    early = f"x FATAL component=old cause=long ago\n{filler}"
    log.write_text(early + "last words\n")
    assert last_exit_line(log) == "last words"  # the early FATAL is outside the tail
    log.write_text(early + f"{'y' * 5000} {FATAL}\n")
    line = last_exit_line(log)
    assert line.startswith(FATAL) and len(line) <= 600
    assert last_exit_line(tmp_path / "missing.log") == ""


def test_a_node_mqcluster_killed_is_down_not_exited(cluster: LocalCluster) -> None:
    """`mqcluster kill` is deliberate: the node is DOWN (its pid file is removed)."""
    n0 = cluster.node("n0")
    # A stand-in process whose command line carries the node's config, as a node's does.
    proc = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)", n0.conf],
        start_new_session=True,
    )
    try:
        Path(n0.pid_file).write_text(f"{proc.pid}\n")
        assert cluster.pid(n0) == proc.pid
        assert cluster.signal("n0", signal.SIGKILL) == proc.pid
        rows = {r["node"]: r for r in cluster.status_rows()}
        assert rows["n0"]["role"] == "DOWN" and "exit" not in rows["n0"]
    finally:
        proc.kill()
        proc.wait(10)


def _stand_in(n_conf: str, code: str) -> subprocess.Popen[bytes]:
    """A process whose command line carries a node's config, as a node's does, running
    ``code`` instead of a broker (it listens on nothing)."""
    return subprocess.Popen([sys.executable, "-c", code, n_conf], start_new_session=True)


def test_up_waits_for_every_running_node_to_answer(cluster: LocalCluster) -> None:
    """`up` returns once a leader is elected *and* every node answers: a node still importing
    its modules (here: a process that never listens) is named when the wait runs out."""
    n0 = cluster.node("n0")
    proc = _stand_in(n0.conf, "import time; time.sleep(60)")
    try:
        Path(n0.pid_file).write_text(f"{proc.pid}\n")
        expected = rf"not answering after 0.5 s: n0 \({n0.client_addr}"
        with pytest.raises(ClusterError, match=expected):
            cluster.wait_serving(0.5)
    finally:
        proc.kill()
        proc.wait(10)


def test_a_node_that_exits_while_awaited_is_named_with_its_exit_line(
    cluster: LocalCluster,
) -> None:
    n1 = cluster.node("n1")
    Path(n1.log).write_text(f"x CRITICAL prockit.fatal {FATAL}\n")
    proc = _stand_in(n1.conf, "import time; time.sleep(0.3)")
    try:
        Path(n1.pid_file).write_text(f"{proc.pid}\n")
        with pytest.raises(ClusterError, match=r"node n1 exited while starting: FATAL component"):
            cluster.wait_serving(30)
    finally:
        proc.kill()
        proc.wait(10)


def test_nodes_not_started_are_not_awaited(cluster: LocalCluster) -> None:
    cluster.wait_serving(0.1)  # neither node runs: nothing to wait for, no error
