"""The work directories of mqbench and its siblings, and the sweep of stale ones.

A benchmark run makes a directory under the temp dir and starts groups (brokers, a
NameServer) inside it; its ``finally`` stops them and deletes the directory. SIGKILL (an
OOM kill, a CI job's timeout) skips the ``finally``: the group's processes run on, holding
ports, CPU and disk, and the next run competes with them. So each such directory is made by
:func:`create_work_dir`, which records its owner (the benchmark's PID and that process's
start time, so that a reused PID does not count as the owner) in :data:`OWNER_FILE`, and each
benchmark calls :func:`sweep_stale` at start: a directory of ours whose owner is dead has its
processes stopped and is deleted.

What is touched, and only that:

* a directory directly under the parent whose name starts with one of :data:`PREFIXES`,
  not a symlink, owned by this user, holding an :data:`OWNER_FILE` that parses and names a
  process that is gone (a directory without one, another tool's or an older mqbench's, is
  left alone);
* in it, the processes named by its own pid files (``*.pid``, as ``mqcluster`` writes them,
  at most :data:`MAX_PID_FILES`, at most :data:`MAX_DEPTH` levels down, symlinks not
  followed), and only those whose ``/proc/PID/cmdline`` names a path inside that directory
  (a node's config file is there): a PID reused by another process is never signalled.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

OWNER_FILE = ".mqbench-owner"
# The directory names the benchmarks make ("raftmq-steps-" covers "raftmq-steps-group-").
PREFIXES = (
    "mqbench-",
    "raftmq-backlog-",
    "raftmq-steps-",
    "raftmq-compare-",
    "raftmq-catchup-",
)
# The owner file is one short line; anything longer is not ours.
MAX_OWNER_BYTES = 128
# A work directory holds a few groups of 3 brokers and a NameServer: more pid files than
# this is not a layout we made, and the sweep stops looking.
MAX_PID_FILES = 64
# Where mqcluster puts its pid files: <work>/<group>/nX.pid (depth 2); one more level spare.
MAX_DEPTH = 3
# A pid file holds one decimal PID; a larger file is not one.
MAX_PID_FILE_BYTES = 32
# A stale broker gets this long to stop on SIGTERM (it flushes and exits in well under a
# second when idle) before SIGKILL, and as long again to be gone after SIGKILL.
STOP_GRACE_S = 5.0
POLL_S = 0.02


@dataclass(frozen=True, slots=True)
class Owner:
    pid: int
    start_ticks: int  # the process's start time (field 22 of /proc/PID/stat, clock ticks)


def start_ticks(pid: int) -> int | None:
    """When process ``pid`` started (clock ticks since boot); None when there is none."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses: split after its last ')'.
    fields = stat[stat.rfind(b")") + 2 :].split()
    try:
        return int(fields[19])  # field 22 of the whole line
    except (IndexError, ValueError):
        return None


def _alive(owner: Owner) -> bool:
    return start_ticks(owner.pid) == owner.start_ticks


def create_work_dir(prefix: str, parent: str | os.PathLike[str] | None = None) -> Path:
    """A new directory ``prefix...`` under ``parent`` (the temp dir by default), recording
    this process as its owner."""
    assert prefix.startswith(PREFIXES), prefix
    ticks = start_ticks(os.getpid())
    assert ticks is not None, "no /proc/self/stat"
    work = Path(tempfile.mkdtemp(prefix=prefix, dir=parent))
    (work / OWNER_FILE).write_text(f"pid={os.getpid()} start={ticks}\n")
    return work


def read_owner(work: Path) -> Owner | None:
    """The owner recorded in ``work``; None when there is no owner file or it does not parse
    (then the directory is not ours to sweep)."""
    try:
        with (work / OWNER_FILE).open("rb") as f:
            raw = f.read(MAX_OWNER_BYTES + 1)
        if len(raw) > MAX_OWNER_BYTES:
            return None
        fields = dict(w.split("=", 1) for w in raw.decode("ascii").split())
        owner = Owner(int(fields["pid"]), int(fields["start"]))
    except (OSError, ValueError, KeyError, UnicodeDecodeError):
        return None
    return owner if owner.pid > 0 and owner.start_ticks >= 0 else None


def _pid_files(work: Path) -> Iterator[Path]:
    """The ``*.pid`` files in ``work``, at most MAX_DEPTH levels down, symlinks not followed."""
    found = 0
    for top, dirs, files in os.walk(work, followlinks=False):
        depth = len(Path(top).relative_to(work).parts)
        if depth >= MAX_DEPTH:
            dirs.clear()
        for name in sorted(files):
            path = Path(top) / name
            if name.endswith(".pid") and not path.is_symlink():
                found += 1
                if found > MAX_PID_FILES:
                    return
                yield path


def _read_pid(path: Path) -> int | None:
    try:
        with path.open("rb") as f:
            raw = f.read(MAX_PID_FILE_BYTES + 1)
        pid = int(raw.decode("ascii").strip())
    except (OSError, ValueError, UnicodeDecodeError):
        return None
    return pid if 1 < pid != os.getpid() and len(raw) <= MAX_PID_FILE_BYTES else None


def names_dir(pid: int, work: Path) -> bool:
    """Whether process ``pid`` is alive and one of its arguments is a path inside ``work``
    (as a node's ``-c .../broker.conf`` is): the pid file's process, not a reuse of its PID."""
    try:
        args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        state = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return False
    if state[state.rfind(b")") + 2 :].startswith(b"Z"):
        return False  # exited; its parent has not reaped it yet
    inside = [os.fsencode(str(work)) + b"/", os.fsencode(os.path.realpath(work)) + b"/"]
    return any(a.startswith(p) for a in args for p in inside)


def _wait_gone(pid: int, work: Path, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not names_dir(pid, work):
            return True
        time.sleep(POLL_S)
    return not names_dir(pid, work)


def stop_processes(work: Path, out: TextIO) -> list[int]:
    """Stop the processes ``work``'s pid files name whose command line names ``work``
    (SIGTERM, then SIGKILL after STOP_GRACE_S); returns those still running after all."""
    pids = []
    for path in _pid_files(work):
        pid = _read_pid(path)
        if pid is None or not names_dir(pid, work):
            continue
        pids.append(pid)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)  # a paused process cannot handle SIGTERM
            os.kill(pid, signal.SIGTERM)
        print(f"mqbench: stale group {work}: stopping PID {pid} ({path.name})", file=out)
    for pid in pids:
        if not _wait_gone(pid, work, STOP_GRACE_S) and names_dir(pid, work):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            _wait_gone(pid, work, STOP_GRACE_S)
    return [pid for pid in pids if names_dir(pid, work)]


def sweep_stale(
    parent: str | os.PathLike[str] | None = None, out: TextIO = sys.stderr
) -> list[Path]:
    """Stop the processes of, and delete, each work directory under ``parent`` (the temp dir
    by default) that a benchmark made and whose owner is dead (module docstring); returns
    the directories deleted."""
    root = Path(parent if parent is not None else tempfile.gettempdir())
    swept = []
    try:
        entries = sorted(os.scandir(root), key=lambda e: e.name)
    except OSError:
        return []
    for entry in entries:
        if not entry.name.startswith(PREFIXES) or not entry.is_dir(follow_symlinks=False):
            continue
        if entry.stat(follow_symlinks=False).st_uid != os.getuid():
            continue
        work = Path(entry.path)
        owner = read_owner(work)
        if owner is None or _alive(owner):
            continue
        print(f"mqbench: {work} was left by PID {owner.pid}, which is gone: sweeping", file=out)
        left = stop_processes(work, out)
        if left:  # its files are still in use: keep them rather than pull them from under it
            print(f"mqbench: {work}: PIDs {left} did not stop; left in place", file=out)
            continue
        shutil.rmtree(work, ignore_errors=True)
        swept.append(work)
    return swept
