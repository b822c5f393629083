"""bench.sweep: a benchmark killed with SIGKILL leaves its group running; the next run stops
the processes of its OWN stale work directories (by the pid files in them, only those whose
command line names the directory) and deletes them, touching nothing else."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench import sweep

pytestmark = pytest.mark.processes  # it starts idle processes (fake nodes)

# A fake node: a process that idles until stopped, with a path inside its group's directory
# on its command line (as a broker's ``-c .../broker.conf``).
IDLE = "import time\nwhile True: time.sleep(1)"
STOP_S = 10.0  # bound on each wait for a process to end


@pytest.fixture
def started() -> Iterator[list[subprocess.Popen[bytes]]]:
    """The processes a test starts: whatever is left is stopped at the end, by PID."""
    procs: list[subprocess.Popen[bytes]] = []
    yield procs
    for p in procs:
        if p.poll() is None:
            p.kill()
            p.wait(timeout=STOP_S)


def _idle(procs: list[subprocess.Popen[bytes]], *args: str) -> subprocess.Popen[bytes]:
    p = subprocess.Popen([sys.executable, "-c", IDLE, *args])
    procs.append(p)
    return p


def _dead_owner(work: Path) -> None:
    """Rewrite ``work``'s owner as a process that has exited (one this test ran)."""
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait(timeout=STOP_S)
    (work / sweep.OWNER_FILE).write_text(f"pid={gone.pid} start=12345\n")


def test_a_stale_group_is_stopped_and_deleted_and_nothing_else_is_touched(
    tmp_path: Path, started: list[subprocess.Popen[bytes]]
) -> None:
    stale = sweep.create_work_dir("mqbench-", tmp_path)
    conf = stale / "sync_flush" / "n0" / "broker.conf"
    conf.parent.mkdir(parents=True)
    conf.write_text("")
    node = _idle(started, str(conf))
    (stale / "sync_flush" / "n0.pid").write_text(f"{node.pid}\n")
    # A pid file naming a process that is not this group's (its PID reused): left alone.
    other = _idle(started, str(tmp_path / "elsewhere.conf"))
    (stale / "sync_flush" / "n1.pid").write_text(f"{other.pid}\n")
    _dead_owner(stale)
    # Still owned (this process), not ours (no owner file), not our prefix: all kept.
    live = sweep.create_work_dir("raftmq-steps-", tmp_path)
    live_node = _idle(started, str(live / "n0.conf"))
    (live / "n0.pid").write_text(f"{live_node.pid}\n")
    foreign = tmp_path / "mqbench-foreign"
    foreign.mkdir()
    (foreign / "n0.pid").write_text(f"{other.pid}\n")
    unrelated = tmp_path / "other-tool"
    unrelated.mkdir()
    (unrelated / sweep.OWNER_FILE).write_text("pid=1 start=1\n")

    out = io.StringIO()
    assert sweep.sweep_stale(tmp_path, out) == [stale]
    assert node.wait(timeout=STOP_S) is not None  # stopped (SIGTERM)
    assert not stale.exists()
    assert other.poll() is None and live_node.poll() is None
    assert live.exists() and foreign.exists() and unrelated.exists()
    text = out.getvalue()
    assert "left by PID" in text and f"stopping PID {node.pid} (n0.pid)" in text
    assert str(other.pid) not in text


def test_owner_files_that_do_not_parse_leave_the_directory_alone(tmp_path: Path) -> None:
    for n, junk in enumerate((b"", b"pid=x start=1", b"pid=5", b"\xff" * 10, b"p" * 200)):
        work = tmp_path / f"raftmq-backlog-{n}"
        work.mkdir()
        (work / sweep.OWNER_FILE).write_bytes(junk)
    assert sweep.sweep_stale(tmp_path, io.StringIO()) == []
    assert len(list(tmp_path.iterdir())) == 5


def test_the_owner_is_this_process_and_its_start_time(tmp_path: Path) -> None:
    work = sweep.create_work_dir("raftmq-compare-", tmp_path)
    owner = sweep.read_owner(work)
    assert owner is not None and owner.pid == os.getpid()
    assert owner.start_ticks == sweep.start_ticks(os.getpid())
    assert sweep.sweep_stale(tmp_path, io.StringIO()) == []  # alive: kept
    # The same PID with another start time is a reused PID: the owner is gone.
    (work / sweep.OWNER_FILE).write_text(f"pid={os.getpid()} start={owner.start_ticks + 1}\n")
    assert sweep.sweep_stale(tmp_path, io.StringIO()) == [work]
