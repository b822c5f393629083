"""Counting the TLS handshakes a server process refuses (``tls_handshake`` in `refusals`).

A caller without a certificate on a mutual-TLS port (the peer port), with one from another CA,
or not speaking TLS at all, is refused by the TLS handshake inside gRPC core, before any RPC
exists, and grpcio (1.85.1) has no hook after a failed handshake: no interceptor, servicer or
credentials callback sees it. What gRPC core does is write one log line per failed handshake,
at INFO:

    I1124 22:40:54.830304  2257 ssl_transport_security.cc:2563] Handshake failed with error
    SSL_ERROR_SSL: error:100000c0:SSL routines:OPENSSL_internal:PEER_DID_NOT_RETURN_A_CERTIFICATE

:func:`install` counts those lines. It makes the process's file descriptor 2 (where gRPC core,
Python's logging and crash traces write) a pipe read by a small child process (this module's
:func:`tap`), and raises gRPC's verbosity to INFO so that the line exists. The child:

- writes every byte it reads to the real stderr, except gRPC core's own lines below the
  verbosity the operator asked for (``GRPC_VERBOSITY``, default ERROR as every raftmq server
  sets it): the operator's log shows what it showed before, and a flood of refused handshakes
  costs no disk (each is counted; `refusals` logs at most a few lines per second);
- for each handshake-failure line, sends one line naming the TLS error (a bounded token, never
  caller text) to the server on a second pipe; a thread of the server counts it.

Nothing of this runs on a request's path: the child only sees what is written to stderr. The
child is a process of its own so that nothing written just before the server dies (a FATAL
line, a crash trace) can be lost: it reads until every writer is gone, then exits. It ignores
SIGINT and SIGTERM for the same reason (a Ctrl-C reaches the whole process group). Should it die
anyway, the server's thread sees the counting pipe close and puts the real stderr back on
file descriptor 2 (one warning says so); lines written meanwhile may be lost.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import logging
import os
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator

from mqsecurity.refusals import REFUSALS, TLS_HANDSHAKE

log = logging.getLogger("raftmq.security")

# gRPC core's line for a failed TLS handshake (either side of a connection), and the OpenSSL
# reason it names (upper-case words: never caller-supplied text).
_FAILED = re.compile(rb"ssl_transport_security\.cc:\d+\] Handshake failed with error ")
_REASON = re.compile(rb":([A-Z0-9_]{3,64})(?::|$)")
# A gRPC core log line: severity letter, date, time, thread id, file:line].
_GRPC_LINE = re.compile(rb"([IWEF])\d{4} \d\d:\d\d:\d\d\.\d+ +\d+ [^ \]]+:\d+\] ")
_SEVERITY_RANK = {b"I": 0, b"W": 1, b"E": 2, b"F": 3}
# GRPC_VERBOSITY values -> the lowest severity printed (NONE: gRPC prints nothing).
_THRESHOLD = {"DEBUG": 0, "INFO": 0, "WARNING": 1, "WARN": 1, "ERROR": 2, "NONE": 4}
DEFAULT_VERBOSITY = "ERROR"
# A line longer than this is passed on in pieces and never examined (gRPC's are far shorter);
# it bounds the child's memory whatever is written to stderr.
MAX_LINE_BYTES = 16 << 10
READ_BYTES = 64 << 10
# Bytes of pipe between the server and the child, so a burst of log lines never waits on the
# child (Linux F_SETPIPE_SZ; best effort, the default 64 KiB otherwise).
PIPE_BYTES = 1 << 20
_F_SETPIPE_SZ = 1031
UNKNOWN_REASON = "UNKNOWN"
# How a server re-executed by `count_refused_handshakes` finds its tap: "<count fd>,<stderr fd>".
TAP_ENV = "RAFTMQ_HANDSHAKE_TAP"
# A config file line turning TLS on, and how much of the file that quick look reads.
_TLS_LINE = re.compile(r"\s*tlsEnable\s*[=:]\s*true\s*$", re.IGNORECASE)
MAX_CONFIG_PEEK_BYTES = 1 << 20


def handshake_reason(line: bytes) -> str | None:
    """The TLS error a gRPC handshake-failure line names (``UNKNOWN`` when it names none), or
    None when ``line`` is not such a line."""
    found = _FAILED.search(line)
    if found is None:
        return None
    reasons = _REASON.findall(line, found.end())
    return reasons[0].decode() if reasons else UNKNOWN_REASON


def shown(line: bytes, threshold: int) -> bool:
    """Whether the operator's verbosity (``threshold``, a `_THRESHOLD` value) shows ``line``:
    every line that is not gRPC core's is shown."""
    grpc_line = _GRPC_LINE.match(line)
    return grpc_line is None or _SEVERITY_RANK[grpc_line.group(1)] >= threshold


class LineFilter:
    """Splits what is written to stderr into lines (each at most `MAX_LINE_BYTES` examined):
    :meth:`feed` returns the bytes to pass on and the handshake reasons found."""

    def __init__(self, threshold: int) -> None:
        self.threshold = threshold
        self._partial = b""
        self._long = False  # inside a line already passed on unexamined

    def feed(self, data: bytes) -> tuple[bytes, list[str]]:
        out: list[bytes] = []
        reasons: list[str] = []
        lines = (self._partial + data).split(b"\n")
        self._partial = lines.pop()
        for line in lines:
            self._line(line + b"\n", out, reasons)
            self._long = False
        if len(self._partial) > MAX_LINE_BYTES:
            out.append(self._partial)
            self._partial, self._long = b"", True
        return b"".join(out), reasons

    def _line(self, line: bytes, out: list[bytes], reasons: list[str]) -> None:
        if self._long:
            out.append(line)
            return
        reason = handshake_reason(line)
        if reason is not None:
            reasons.append(reason)
        if shown(line, self.threshold):
            out.append(line)

    def flush(self) -> bytes:
        """What is left at the end (a last line without its newline), as it came."""
        rest, self._partial = self._partial, b""
        return rest


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def tap(threshold: int, count_fd: int) -> int:
    """The child: stdin to stdout filtered by ``threshold``; one line per handshake failure to
    ``count_fd``. Ends when every writer of stdin is gone."""
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)
    lines = LineFilter(threshold)
    counting = True
    while chunk := os.read(0, READ_BYTES):
        out, reasons = lines.feed(chunk)
        with contextlib.suppress(OSError):  # stderr gone: keep draining, keep counting
            _write_all(1, out)
        if reasons and counting:
            try:
                _write_all(count_fd, "".join(f"{r}\n" for r in reasons).encode())
            except OSError:  # the server is gone
                counting = False
    with contextlib.suppress(OSError):
        _write_all(1, lines.flush())
    return 0


class HandshakeTap:
    """The server's side: the child, and the thread counting what it reports."""

    def __init__(
        self,
        child: subprocess.Popen[bytes] | None,
        count_fd: int,
        real_stderr: int,
        on_refused: Callable[[str], None],
    ) -> None:
        self.child = child  # None in a re-executed server (its former image started it)
        self.count_fd = count_fd
        self.real_stderr = real_stderr
        self._on_refused = on_refused
        self.thread = threading.Thread(target=self._run, name="handshake-tap", daemon=True)

    def _reasons(self) -> Iterator[str]:
        with os.fdopen(self.count_fd, "rb") as reports:
            for line in reports:
                yield line[:64].strip().decode("ascii", "replace") or UNKNOWN_REASON

    def _run(self) -> None:
        try:
            for reason in self._reasons():
                self._on_refused(reason)
        finally:  # the child is gone: stderr straight to where it went before
            os.dup2(self.real_stderr, 2)
            log.warning("the stderr tap ended; TLS handshake refusals are no longer counted")


def _set_pipe_size(fd: int) -> None:
    with contextlib.suppress(OSError):
        fcntl.fcntl(fd, _F_SETPIPE_SZ, PIPE_BYTES)


def install(on_refused: Callable[[str], None], start: bool = True) -> HandshakeTap:
    """Route file descriptor 2 through the tap and count every failed TLS handshake with
    ``on_refused(<TLS error>)`` (from a thread, once ``start``ed). Call it before ``grpc`` is
    imported (gRPC reads its verbosity then), in a process that owns its stderr."""
    wanted = os.environ.get("GRPC_VERBOSITY", DEFAULT_VERBOSITY).upper()
    threshold = _THRESHOLD.get(wanted, _THRESHOLD[DEFAULT_VERBOSITY])
    data_r, data_w = os.pipe()
    count_r, count_w = os.pipe()
    _set_pipe_size(data_w)
    real_stderr = os.dup(2)
    sys.stderr.flush()
    argv = [sys.executable, "-m", "mqsecurity.handshakes", str(threshold), str(count_w)]
    child = subprocess.Popen(
        argv, stdin=data_r, stdout=real_stderr, stderr=real_stderr, pass_fds=(count_w,)
    )
    os.close(data_r)
    os.close(count_w)
    os.dup2(data_w, 2)
    os.close(data_w)
    os.environ["GRPC_VERBOSITY"] = "INFO"  # the handshake line is an INFO line
    handshakes = HandshakeTap(child, count_r, real_stderr, on_refused)
    if start:
        handshakes.thread.start()
    return handshakes


def _count(tls_error: str) -> None:
    REFUSALS.count(TLS_HANDSHAKE, f"TLS handshake failed: {tls_error}")


def _inherited() -> tuple[int, int] | None:
    """The counting pipe and the real stderr a re-executed server was handed (`TAP_ENV`)."""
    value = os.environ.pop(TAP_ENV, "")
    fds = value.split(",")
    if len(fds) != 2 or not all(f.isdigit() for f in fds):
        return None
    return int(fds[0]), int(fds[1])


def _config_says_tls(argv: list[str]) -> bool:
    """Whether the file of ``-c``/``--config`` in ``argv`` holds a ``tlsEnable=true`` line (a
    quick look before ``grpc`` is imported; the server's own configuration decides later)."""
    path = ""
    for i, arg in enumerate(argv):
        if arg in ("-c", "--config") and i + 1 < len(argv):
            path = argv[i + 1]
        elif arg.startswith("--config="):
            path = arg.split("=", 1)[1]
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return any(_TLS_LINE.match(line) for line in f.read(MAX_CONFIG_PEEK_BYTES).splitlines())
    except OSError:
        return False


def tap_before_grpc(argv: list[str]) -> None:
    """In a server started as ``python -m broker`` / ``python -m nameserver``, before
    ``grpc`` is imported: when its config file turns TLS on, install the tap now and hand it
    to :func:`count_refused_handshakes` (through `TAP_ENV`), which then needs no re-execution."""
    if _config_says_tls(argv) and TAP_ENV not in os.environ:
        _hand_over(install(_count, start=False))


def _hand_over(tap_: HandshakeTap) -> None:
    for fd in (tap_.count_fd, tap_.real_stderr):
        os.set_inheritable(fd, True)
    os.environ[TAP_ENV] = f"{tap_.count_fd},{tap_.real_stderr}"


def count_refused_handshakes(tls: bool) -> HandshakeTap | None:
    """Count each failed TLS handshake of this server process in `REFUSALS` as
    ``tls_handshake`` (what ``Metadata`` and ``GetClusterInfo`` report). Only for a process
    started from its command line: a server's ``main`` called in-process must not call this.

    gRPC reads its verbosity once, when ``grpc`` is imported. A tap installed before that
    (:func:`tap_before_grpc`, or this process's former image) is found in `TAP_ENV` and
    counted from, TLS or not (its reports must be read). Otherwise, with ``tls``, this call
    installs the tap and re-executes the process's own command line (same pid, same
    arguments: ``mqbroker`` started by its console script) with gRPC at INFO."""
    handed = _inherited()
    if handed is not None:
        count_fd, real_stderr = handed
        tap_ = HandshakeTap(None, count_fd, real_stderr, _count)
        tap_.thread.start()
        return tap_
    if not tls:
        return None
    _hand_over(install(_count, start=False))
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os.execv(sys.executable, sys.orig_argv)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="the stderr tap of a raftmq server (internal)")
    parser.add_argument("threshold", type=int, choices=sorted(set(_THRESHOLD.values())))
    parser.add_argument("count_fd", type=int)
    ns = parser.parse_args(argv)
    return tap(ns.threshold, ns.count_fd)


if __name__ == "__main__":
    sys.exit(main())
