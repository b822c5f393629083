"""Processes of the local tools and servers: free ports, children started with their output
in a log file, a child's exit seen by pid, and a server's foreground life (log set-up, run
until SIGTERM/SIGINT). Generic: mqcluster, mqjepsen, mqbench, mqbroker and mqnamesrv use it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import subprocess
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s %(message)s"


def free_ports(n: int, host: str = "127.0.0.1") -> list[int]:
    """``n`` distinct free TCP ports on ``host``: every probe socket stays bound until all are
    picked (one at a time, the kernel may hand out the same port twice)."""
    with contextlib.ExitStack() as stack:
        ports = []
        for _ in range(n):
            s = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            s.bind((host, 0))
            ports.append(int(s.getsockname()[1]))
        return ports


def spawn_logged(
    argv: Sequence[str],
    log_path: str | os.PathLike[str],
    *,
    env: Mapping[str, str] | None = None,
    cwd: str | os.PathLike[str] | None = None,
    new_session: bool = True,
) -> subprocess.Popen[bytes]:
    """Start ``argv`` with no stdin and stdout and stderr appended to ``log_path``. With
    ``new_session`` it leads a session of its own: a terminal's Ctrl-C or hang-up does not
    reach it, only a signal sent to its pid."""
    with open(log_path, "ab") as log:
        return subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=new_session,
            env=None if env is None else dict(env),
            cwd=cwd,
        )


def exited(pid: int) -> bool:
    """True once process ``pid`` has ended: reaped here if it is our child, a zombie, or
    gone from /proc."""
    with contextlib.suppress(ChildProcessError):
        done, _ = os.waitpid(pid, os.WNOHANG)
        if done == pid:
            return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] == "Z"


def setup_logging(level_name: str) -> None:
    """A server's log on stderr at ``level_name`` (DEBUG, INFO, ...; unknown: INFO)."""
    logging.basicConfig(
        level=getattr(logging, str(level_name).upper(), logging.INFO), format=LOG_FORMAT
    )


async def serve_until_signalled(stop: Callable[[], Awaitable[None]]) -> None:
    """Wait for SIGTERM or SIGINT, then run ``stop`` once (a second signal changes nothing)."""
    loop = asyncio.get_running_loop()
    stopping = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopping.set)
    await stopping.wait()
    await stop()
