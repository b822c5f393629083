"""Counting and logging refused calls, one table per process.

Every security refusal (a peer without a member certificate, a bad signature, a missing
permission, an unsigned registration) is counted by reason and logged, at most
`LOG_PER_REASON_PER_S` lines per reason per second so a flood of hostile calls cannot fill the
disk with logs. Servers expose the counts (`raftmq.dledger.v1.MetadataResponse.refusals`, the
NameServer's `GetClusterInfoResponse.refusals`). Reasons are a small fixed vocabulary, never
caller-supplied text, so the table stays bounded.
"""

from __future__ import annotations

import logging
import threading
import time

log = logging.getLogger("raftmq.security")

# The reasons a call may be refused for; `Refusals.count` refuses any other (a bounded table).
PEER_CERTIFICATE = "peer_certificate"  # peer stream without a certificate naming a member
PEER_IDENTITY = "peer_identity"  # peer claims an id its certificate does not name
AUTHENTICATION = "authentication"  # missing, malformed or wrong signature, unknown user
AUTHORIZATION = "authorization"  # a known user without the permission
REGISTRATION = "registration"  # NameServer: (un)registration not signed by a group member
# A TLS handshake of this process failed: a caller on a TLS port without the certificate the
# port requires, with one from another CA, or not speaking TLS (counted from gRPC core's log
# line by mqsecurity.handshakes; also a server this process dialled whose certificate failed).
TLS_HANDSHAKE = "tls_handshake"
REASONS = frozenset(
    {PEER_CERTIFICATE, PEER_IDENTITY, AUTHENTICATION, AUTHORIZATION, REGISTRATION, TLS_HANDSHAKE}
)
LOG_PER_REASON_PER_S = 5
# What a log line quotes of the refusal's detail; the detail never holds a secret.
MAX_DETAIL_CHARS = 200


class Refusals:
    """Counts by reason; thread-safe (servers count from asyncio and from gRPC threads)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: dict[str, int] = dict.fromkeys(sorted(REASONS), 0)
        self._logged: dict[str, tuple[int, int]] = {}  # reason -> (second, lines that second)

    def count(self, reason: str, detail: str) -> None:
        """Count one refusal for ``reason`` and log ``detail`` unless this reason already
        logged `LOG_PER_REASON_PER_S` lines this second."""
        if reason not in REASONS:
            raise ValueError(f"unknown refusal reason {reason!r}")
        second = int(time.monotonic())
        with self._lock:
            self._counts[reason] += 1
            at, lines = self._logged.get(reason, (second, 0))
            lines = lines + 1 if at == second else 1
            self._logged[reason] = (second, lines)
        if lines <= LOG_PER_REASON_PER_S:
            log.warning("refused (%s): %s", reason, detail[:MAX_DETAIL_CHARS])

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self._counts)


# The process's table: every server of a process counts here.
REFUSALS = Refusals()
