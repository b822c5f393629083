"""Leader-only calls to one broker group over the generated stubs, for the demo and the tests.

:meth:`LeaderClient.call` sends to the node it last found leading; a failure is acted on by its
structured error (``raftmq.common.v1.ErrorInfo``, :func:`rpckit.status.read_error`):
``NOT_LEADER`` with a leader address goes there, a retryable failure (no leader yet, a
transfer, back pressure) tries the next node after the error's retry hint, and a failure gRPC
itself made (node down, deadline) tries the next node too. Anything else is raised. A retried
send carries the same message ids, which the broker deduplicates. (Applications use
``client.Producer``, which does the same with routes from the NameServer.)
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Sequence
from typing import TypeVar

import grpc
from raftmq.broker.v1 import broker_pb2_grpc as pb_grpc

from mqerrors import codes as E
from mqsecurity.channels import PLAINTEXT, ClientSecurity, open_channel
from rpckit.status import read_error

# Wait before trying the next node when the error gave no longer hint (an election, a node
# down): short, the group elects within a second.
NEXT_NODE_WAIT_S = 0.05
# Statuses gRPC itself gives a call no server answered: the node is down or cut off.
TRANSPORT_STATUSES = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED})

T = TypeVar("T")


class LeaderClient:
    """Broker stubs per node; ``addrs()`` lists the client addresses to try (e.g. the live
    nodes). ``retries`` counts the failures retried, by code. ``security``: how to reach the
    nodes (TLS, certificate, credentials; plaintext by default)."""

    def __init__(
        self, addrs: Callable[[], Sequence[str]], security: ClientSecurity = PLAINTEXT
    ) -> None:
        self.addrs = addrs
        self.security = security
        self.channels: dict[str, grpc.Channel] = {}
        self.leader = ""
        self.retries: Counter[str] = Counter()

    def stub(self, addr: str) -> pb_grpc.BrokerStub:
        if addr not in self.channels:
            self.channels[addr] = open_channel(addr, self.security)
        return pb_grpc.BrokerStub(self.channels[addr])

    def close(self) -> None:
        for ch in self.channels.values():
            ch.close()
        self.channels.clear()

    def call(self, fn: Callable[[pb_grpc.BrokerStub], T], timeout_s: float = 15.0) -> T:
        """``fn(stub)`` on the leader, following redirects until ``timeout_s`` passes."""
        deadline = time.monotonic() + timeout_s
        addr = self.leader or self.addrs()[0]
        while True:
            try:
                result = fn(self.stub(addr))
            except grpc.RpcError as exc:
                if time.monotonic() > deadline:
                    raise
                addr, wait_s = self._after_failure(exc, addr)
                time.sleep(wait_s)
                continue
            self.leader = addr
            return result

    def _after_failure(self, exc: grpc.RpcError, addr: str) -> tuple[str, float]:
        """Where to go next and how long to wait first; raises ``exc`` when it is final."""
        info = read_error(exc)
        if info is None:
            code = exc.code() if isinstance(exc, grpc.Call) else None
            if code not in TRANSPORT_STATUSES:
                raise exc
            self.retries[code.name if code else "UNKNOWN"] += 1
            return self._next(addr), NEXT_NODE_WAIT_S
        if not info.retryable:
            raise exc
        self.retries[info.code] += 1
        if info.code == E.NOT_LEADER and info.leader_addr:
            return info.leader_addr, 0.0
        return self._next(addr), max(info.retry_after_ms / 1000, NEXT_NODE_WAIT_S)

    def _next(self, addr: str) -> str:
        addrs = list(self.addrs())
        return addrs[(addrs.index(addr) + 1) % len(addrs)] if addr in addrs else addrs[0]
