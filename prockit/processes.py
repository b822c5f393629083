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
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
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
# "LOW-HIGH" (HIGH excluded) narrows that range for this process and its children: two runs
# side by side on one machine, each in a range of its own, never pick the same port (make
# test's two pytest sessions do this). Inside [PICK_PORT_LOW, PICK_PORT_HIGH), at least
# MIN_PICK_PORTS wide (a group takes about 15).
PICK_PORTS_ENV = "RAFTMQ_PICK_PORTS"
MIN_PICK_PORTS = 256


def pick_port_range() -> tuple[int, int]:
    """[low, high) of the ports `free_ports` draws from: ``RAFTMQ_PICK_PORTS`` if set, else
    [PICK_PORT_LOW, PICK_PORT_HIGH); a malformed setting raises ValueError saying why."""
    spec = os.environ.get(PICK_PORTS_ENV, "").strip()
    if not spec:
        return PICK_PORT_LOW, PICK_PORT_HIGH
    low_s, sep, high_s = spec.partition("-")
    if not (sep and low_s.isdigit() and high_s.isdigit()):
        raise ValueError(f"{PICK_PORTS_ENV}={spec!r}: expected LOW-HIGH, e.g. 20000-26000")
    low, high = int(low_s), int(high_s)
    if not (low >= PICK_PORT_LOW and low + MIN_PICK_PORTS <= high <= PICK_PORT_HIGH):
        raise ValueError(
            f"{PICK_PORTS_ENV}={spec!r}: must lie in {PICK_PORT_LOW}-{PICK_PORT_HIGH} "
            f"and span at least {MIN_PICK_PORTS} ports"
        )
    return low, high


def free_ports(n: int, host: str = "127.0.0.1", avoid: Collection[int] = ()) -> list[int]:
    """``n`` distinct free TCP ports on ``host``, drawn at random from `pick_port_range` (the
    kernel's choice when that range looks full): every probe socket stays bound until all are
    picked, so no port is handed out twice. ``avoid``: ports that are free now but promised
    to a process not started yet (another group's configured ports); never picked."""
    draw = random.SystemRandom()
    span = pick_port_range()
    taken = frozenset(avoid)
    with contextlib.ExitStack() as probes:
        return [_bind_free(probes, host, draw, span, taken) for _ in range(n)]


def _bind_free(
    probes: contextlib.ExitStack,
    host: str,
    draw: random.Random,
    span: tuple[int, int],
    taken: frozenset[int],
) -> int:
    """One port outside ``taken``, left bound by a probe socket in ``probes``."""
    s = probes.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
    for _ in range(PICK_PORT_ATTEMPTS):
        port = draw.randrange(*span)
        if port in taken:
            continue
        try:
            s.bind((host, port))
        except OSError:
            continue  # in use (or bound by another probe of ours): draw again
        return port
    for _ in range(PICK_PORT_ATTEMPTS):  # the kernel's choice; a taken one stays bound aside
        s.bind((host, 0))
        port = int(s.getsockname()[1])
        if port not in taken:
            return port
        s = probes.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
    raise OSError(f"no free port on {host} outside the {len(taken)} avoided ones")


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
