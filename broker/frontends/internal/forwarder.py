"""The one way a front end gets a leader operation done, wherever the leader is.

:meth:`Forwarder.call` runs a typed request (:mod:`broker.components.leaderops`) here when this
node leads and otherwise forwards it to the leader's client port as one
``raftmq.broker.internal.v1.LeaderOps.Call``, whose server side
(:mod:`broker.frontends.internal.service`) runs the same handler. A front end whose clients must
never see NOT_LEADER (the RocketMQ 5 port) uses it; the ``raftmq.broker.v1`` port answers
NOT_LEADER on a follower (its clients follow the redirect) and runs the same handlers directly.

While leadership moves (no leader yet, a forward to a member that just lost it, an unreachable
leader) a call is tried again within :data:`FORWARD_BUDGET_MS`, waiting out retry hints up to
:data:`MAX_FORWARD_PAUSE_MS` (the error table's ``retryable`` and ``retry_after_ms``, as the
leader's ``ErrorInfo`` says them). A forwarded send carries its messages' ids, so a send retried
after a lost answer is stored once (the send path's dedup). A failure comes back as a
:class:`Failure` carrying the error contract's stable code.

A forward travels as the node's own security says (``ClientSecurity``: TLS with the node's
member certificate on a secure group) and carries the original caller's proof (:class:`Origin`):
a RocketMQ 5 caller's signature entries, or a remoting caller's AccessKey, Signature and signed
material (:class:`~broker.frontends.internal.codec.RemotingProof`), never credentials of the
node's own: the leader's guard checks the original user's signature and rights for the operation
inside (docs/SECURITY.md, "RocketMQ 5 clients"; docs/REMOTING.md, "ACL"), so a forward can do
nothing its caller may not.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, replace
from typing import TypeVar

import grpc
from raftmq.broker.internal.v1 import leaderops_pb2_grpc as ipb_grpc

from broker.components.leaderops import LeaderOps, LeaderRequest, ReceiveRequest
from broker.components.pop import Received
from broker.components.raftnode import RaftNode
from broker.frontends.internal.codec import RemotingProof, answer_of, call_pb
from broker.frontends.v1.rpcerrors import error_failure
from broker.state.errors import BrokerError
from dledger.core import Role
from mqerrors import codes as E
from mqerrors.table import Retry, spec
from mqsecurity.channels import PLAINTEXT, ClientSecurity, open_aio_channel
from rpckit.status import read_error

# How long a call may look for a leader (an election, a forward to a leader that just lost its
# role) before it is answered as failed: below the clients' default request timeout (3 s), so
# the client gets a status, not a deadline.
FORWARD_BUDGET_MS = 2500
# Deadline of one forwarded call to the leader.
FORWARD_CALL_TIMEOUT_S = 2.0
# Pause before looking again for a leader (none known, or the one asked is no longer it).
LEADER_RETRY_WAIT_S = 0.05
# The longest retry hint the forwarder waits out itself. Leadership moving (a redirect, an
# election, a transfer, a write whose leader lost its majority: hints of 0 to 100 ms) and a
# busy leader's back pressure (50 ms) are absorbed, as the forwarder exists to hide them; a
# longer hint (a full table or quota, 1,000 ms) goes back to the client as TOO_MANY_REQUESTS,
# whose own back-off applies.
MAX_FORWARD_PAUSE_MS = 100
# A forwarded receive waits up to its long-polling time on the leader: its call deadline is that
# plus this much, when its caller named no deadline.
RECEIVE_CALL_MARGIN_S = 2.0
# A forwarded long poll ends this long before the forward's deadline, so that the leader's answer
# (messages it marked in flight) is back in time, not lost to the deadline.
FORWARD_ANSWER_MARGIN_S = 0.5
# The shortest deadline of a forwarded receive (a caller whose own deadline is nearly gone).
MIN_FORWARD_TIMEOUT_S = 0.05

_A = TypeVar("_A")


class Failure(BrokerError):
    """A leader operation that failed: ``code`` is the error contract's stable code;
    ``retryable`` and ``retry_after_ms`` as the failure's ``ErrorInfo`` said."""

    def __init__(
        self, code: str, text: str, retryable: bool = False, retry_after_ms: int = 0
    ) -> None:
        super().__init__(f"{code} {text}")
        self.code = code
        self.text = text
        self.retryable = retryable
        self.retry_after_ms = retry_after_ms

    @property
    def worth_retrying(self) -> bool:
        """Another try within the forward budget may succeed: the failure says it is
        retryable, its code is not one no member of this group cures soon (a full disk: the
        error table's ``other_group``), and its hint is short (:data:`MAX_FORWARD_PAUSE_MS`)."""
        row = spec(self.code)
        if row is not None and row.retry is Retry.OTHER_GROUP:
            return False
        return self.retryable and self.retry_after_ms <= MAX_FORWARD_PAUSE_MS

    def pause_s(self, until: float) -> float:
        """Seconds to wait before the next try: the failure's retry hint, at least
        :data:`LEADER_RETRY_WAIT_S`, never past ``until`` (monotonic s)."""
        wanted = max(LEADER_RETRY_WAIT_S, self.retry_after_ms / 1000)
        return max(0.0, min(wanted, until - time.monotonic()))


@dataclass(frozen=True, slots=True)
class Origin:
    """The original caller of a leader operation: its user ("" without users), whether it is
    a Super user, and what a forward carries to prove it: the RocketMQ 5 signature entries of its
    call, or (a remoting caller) its request's proof."""

    user: str = ""
    unbounded: bool = False
    signature: tuple[tuple[str, str], ...] = ()
    remoting: RemotingProof | None = None

    def __post_init__(self) -> None:
        assert not (self.signature and self.remoting), "one proof per caller"


ANYONE = Origin()


class Forwarder:
    """Leader operations on the leader of this node's group, wherever it is."""

    def __init__(
        self, node: RaftNode, ops: LeaderOps, security: ClientSecurity = PLAINTEXT
    ) -> None:
        self.node = node
        self.ops = ops
        if security.credentials is not None:
            # A forward must act as its caller, never as a configured identity.
            raise ValueError("forwards carry the caller's signature, not credentials of their own")
        self.security = security
        # One channel per leader address; the addresses come from configuration (the group's
        # members), never from clients, so this holds at most the group's size.
        self._channels: dict[str, grpc.aio.Channel] = {}

    async def close(self) -> None:
        for ch in self._channels.values():
            await ch.close()
        self._channels.clear()

    async def call(self, request: LeaderRequest[_A], origin: Origin = ANYONE) -> _A:
        """``request``'s answer from the leader: run here when this node leads, else
        forwarded; tried again within :data:`FORWARD_BUDGET_MS` while leadership moves."""
        deadline = time.monotonic() + FORWARD_BUDGET_MS / 1000
        while True:
            try:
                return await self._once(request, origin, FORWARD_CALL_TIMEOUT_S)
            except Failure as failure:
                if not failure.worth_retrying or time.monotonic() >= deadline:
                    raise
                await asyncio.sleep(failure.pause_s(deadline))

    async def receive(
        self, q: ReceiveRequest, origin: Origin = ANYONE, answer_within_ms: int | None = None
    ) -> list[Received]:
        """A POP receive on the leader (long polling there), answered within
        ``answer_within_ms`` (the caller's deadline less a margin; None: the long poll and
        :data:`RECEIVE_CALL_MARGIN_S`).

        A leader that dies or steps down while the receive waits costs the client the election,
        not its next receive: the receive goes to the new leader with what is left of its long
        poll, and a long poll whose window closes before a leader answers gets no message (as
        any long poll that found none: an error status would make a push consumer wait 1 s
        before it receives again). A receive without long polling has the forward budget and
        its error, as every other leader operation."""
        now = time.monotonic()
        poll_end = now + q.poll_timeout_ms / 1000
        if answer_within_ms is None:
            answer_by = poll_end + RECEIVE_CALL_MARGIN_S
        else:
            answer_by = now + max(answer_within_ms, q.poll_timeout_ms) / 1000
        retry_until = min(max(poll_end, now + FORWARD_BUDGET_MS / 1000), answer_by)
        while True:
            try:
                return await self._receive_once(q, origin, poll_end, answer_by)
            except Failure as failure:
                if not failure.worth_retrying:
                    raise
                if time.monotonic() >= retry_until:
                    if q.poll_timeout_ms > 0:
                        return []  # the long poll's window closed while leadership moved
                    raise
                await asyncio.sleep(failure.pause_s(retry_until))

    async def _receive_once(
        self, q: ReceiveRequest, origin: Origin, poll_end: float, answer_by: float
    ) -> list[Received]:
        """One try of :meth:`receive`, long polling what is left of the window (here: all of
        it; forwarded: less the answer's margin), its answer back by ``answer_by``."""
        now = time.monotonic()
        leading = self.node.role is Role.LEADER
        margin = 0.0 if leading else FORWARD_ANSWER_MARGIN_S
        poll_s = max(0.0, min(poll_end, answer_by - margin) - now)
        timeout_s = max(MIN_FORWARD_TIMEOUT_S, answer_by - now)
        return await self._once(replace(q, poll_timeout_ms=int(poll_s * 1000)), origin, timeout_s)

    async def _once(self, request: LeaderRequest[_A], origin: Origin, timeout_s: float) -> _A:
        """One try: here when this node leads, else one forward; every failure a
        :class:`Failure`."""
        if self.node.role is Role.LEADER:
            return await self._here(request, origin)
        stub = self._leader_stub()
        try:
            answer = await stub.Call(
                call_pb(request, origin.remoting), timeout=timeout_s, metadata=origin.signature
            )
        except grpc.RpcError as exc:
            raise _forward_failure(exc) from None
        try:
            return answer_of(request, answer)  # type: ignore[no-any-return]
        except BrokerError as exc:
            raise Failure(E.INTERNAL, str(exc)) from None

    async def _here(self, request: LeaderRequest[_A], origin: Origin) -> _A:
        try:
            return await self.ops.run(request, (origin.user, origin.unbounded))
        except Exception as exc:
            f = error_failure(exc, self.node)
            raise Failure(f.code, f.text, f.retryable, f.retry_after_ms) from exc

    def _leader_stub(self) -> ipb_grpc.LeaderOpsStub:
        leader_id, addr = self.node.leader_client_addr()
        if not addr:
            what = f"leader {leader_id} has no client address" if leader_id else "no leader yet"
            raise Failure(E.NO_LEADER, what, retryable=True)
        ch = self._channels.get(addr)
        if ch is None:
            ch = self._channels[addr] = open_aio_channel(addr, self.security)
        return ipb_grpc.LeaderOpsStub(ch)


def _forward_failure(exc: grpc.RpcError) -> Failure:
    info = read_error(exc)
    if info is not None:
        return Failure(info.code, _details(exc), info.retryable, info.retry_after_ms)
    code = exc.code() if isinstance(exc, grpc.aio.AioRpcError) else None
    if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
        return Failure(E.UNAVAILABLE, f"leader unreachable: {_details(exc)}", retryable=True)
    return Failure(E.INTERNAL, _details(exc))


def _details(exc: grpc.RpcError) -> str:
    return (exc.details() or "") if isinstance(exc, grpc.aio.AioRpcError) else str(exc)


__all__ = ["ANYONE", "Failure", "Forwarder", "Origin"]
