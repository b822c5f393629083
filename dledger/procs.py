"""Processes of the local tools and servers: free ports, children started with their output
in a log file, a child's exit seen by pid, and a server's foreground life (log set-up, run
until SIGTERM/SIGINT). Generic: mqcluster, mqjepsen, mqbench, mqbroker and mqnamesrv use it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import signal
import socket
import subprocess
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s %(message)s"


# Where free_ports looks first: below Linux's default ephemeral range (32768-60999), so that a
# port picked here and bound a second later by a starting child is not taken meanwhile by an
# outgoing connection's local port or another process's bind to port 0 (both drawn from the
# ephemeral range). Ports here are taken only by processes that ask for them by number.
PICK_PORT_LOW = 20000
PICK_PORT_HIGH = 32768
# Random draws in that range before falling back to the kernel's choice (port 0).
PICK_PORT_ATTEMPTS = 64


def free_ports(n: int, host: str = "127.0.0.1") -> list[int]:
    """``n`` distinct free TCP ports on ``host``, drawn at random from [PICK_PORT_LOW,
    PICK_PORT_HIGH) (the kernel's choice when that range looks full): every probe socket stays
    bound until all are picked, so no port is handed out twice."""
    draw = random.SystemRandom()
    with contextlib.ExitStack() as stack:
        ports = []
        for _ in range(n):
            s = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            ports.append(_bind_free(s, host, draw))
        return ports


def _bind_free(s: socket.socket, host: str, draw: random.Random) -> int:
    for _ in range(PICK_PORT_ATTEMPTS):
        try:
            s.bind((host, draw.randrange(PICK_PORT_LOW, PICK_PORT_HIGH)))
        except OSError:
            continue  # in use (or bound by another probe of ours): draw again
        return int(s.getsockname()[1])
    s.bind((host, 0))
    return int(s.getsockname()[1])


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
