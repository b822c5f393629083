"""Leader-only work of the RocketMQ 5 front end, run here when this node leads and forwarded to
the leader's ``raftmq.broker.v1`` port otherwise, so that a RocketMQ 5 client may talk to any
node and never sees NOT_LEADER.

The leader runs the one send path (:class:`broker.components.sending.SendPath`) either way: a
forwarded send is a ``raftmq.broker.v1.SendMessage`` carrying the same messages with the same ids,
so a forward retried after a lost answer is stored once (the send path's dedup). A failure comes
back as a :class:`Failure`: the stable code of the one error contract
(``broker.frontends.v1.rpcerrors`` for one raised here, the ``ErrorInfo`` of the leader's answer for
a forwarded one).

A forward travels as the node's own security says (``ClientSecurity``: TLS with the node's
member certificate on a secure group) and carries the v2 caller's signature entries
(:func:`broker.frontends.v2.interceptor.caller_signature`), never credentials of the node's own: the
leader's guard checks the original user for the v1 call as the v2 port did for the v2 call, so a
forward can do nothing its caller may not (docs/SECURITY.md, "RocketMQ 5 clients").
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, replace
from typing import TypeVar

import grpc
from raftmq.broker.v1 import broker_pb2 as pb
from raftmq.broker.v1 import broker_pb2_grpc as pb_grpc

from broker.components.applied import require_leader
from broker.components.pop import Pops, Received, ReceiveQuery
from broker.components.raftnode import RaftNode
from broker.components.sending import SendPath
from broker.components.subscriptions import SubscriptionGroups
from broker.components.transactions import Transactions
from broker.frontends.v1.pbmessage import message_from_pb
from broker.frontends.v1.rpcerrors import error_failure
from broker.frontends.v2.interceptor import caller_signature, current_caller
from broker.state.errors import BrokerError
from broker.state.subgroups import SubGroup
from dledger.core import Role
from mqerrors import codes as E
from mqerrors.table import Retry, spec
from mqsecurity.channels import PLAINTEXT, ClientSecurity, open_aio_channel
from rpckit.status import read_error

# How long a send may look for a leader (an election, a forward to a leader that just lost its
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

_T = TypeVar("_T")


class Failure(BrokerError):
    """A leader-only call that failed: ``code`` is the error contract's stable code;
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
class Stored:
    """One stored message of a send."""

    uniq_id: str
    queue_id: int
    queue_offset: int
    duplicate: bool
    position: int = -1  # commitlog position (a half message's is its transaction id)


class LeaderCalls:
    """Sends and POP consumption on the leader of this node's group, wherever it is."""

    def __init__(
        self,
        node: RaftNode,
        sender: SendPath,
        pops: Pops,
        subgroups: SubscriptionGroups,
        security: ClientSecurity = PLAINTEXT,
        txns: Transactions | None = None,
    ) -> None:
        self.node = node
        self.sender = sender
        self.pops = pops
        self.txns = txns
        self.subgroups = subgroups
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

    async def _on_leader(
        self,
        here: Callable[[], Awaitable[_T]],
        forward: Callable[[pb_grpc.BrokerStub], Awaitable[_T]],
    ) -> _T:
        """``here()`` when this node leads, else ``forward`` to the leader's client port;
        tried again within the budget while leadership moves."""
        deadline = time.monotonic() + FORWARD_BUDGET_MS / 1000
        while True:
            try:
                if self.node.role is Role.LEADER:
                    return await self._here(here)
                return await forward(self._leader_stub())
            except grpc.RpcError as exc:
                failure = _forward_failure(exc)
            except Failure as exc:
                failure = exc
            if not failure.worth_retrying or time.monotonic() >= deadline:
                raise failure
            await asyncio.sleep(failure.pause_s(deadline))

    async def _here(self, here: Callable[[], Awaitable[_T]]) -> _T:
        try:
            require_leader(self.node)
            return await here()
        except Exception as exc:
            f = error_failure(exc, self.node)
            raise Failure(f.code, f.text, f.retryable, f.retry_after_ms) from exc

    def _leader_stub(self) -> pb_grpc.BrokerStub:
        leader_id, addr = self.node.leader_client_addr()
        if not addr:
            what = f"leader {leader_id} has no client address" if leader_id else "no leader yet"
            raise Failure(E.NO_LEADER, what, retryable=True)
        return pb_grpc.BrokerStub(self._channel(addr))

    async def send(self, topic: str, messages: Sequence[pb.Message]) -> list[Stored]:
        """Store ``messages`` in ``topic`` on the leader; one :class:`Stored` per message."""
        return await self._on_leader(
            lambda: self._send_here(topic, messages),
            lambda stub: self._forward(stub, topic, messages),
        )

    async def _send_here(self, topic: str, messages: Sequence[pb.Message]) -> list[Stored]:
        who = current_caller()  # the v2 caller; an auto-created topic is its user's
        results = await self.sender.send(topic, messages, (who.user, who.unbounded))
        return [
            Stored(r.uniq_id, r.queue_id, r.queue_offset, r.duplicate, r.position) for r in results
        ]

    async def receive(self, q: ReceiveQuery, answer_within_ms: int | None = None) -> list[Received]:
        """POP receive on the leader (long polling there), answered within
        ``answer_within_ms`` (the caller's deadline less a margin; None: the long poll and
        :data:`RECEIVE_CALL_MARGIN_S`).

        A leader that dies or steps down while the receive waits costs the client the election,
        not its next receive: the receive goes to the new leader with what is left of its long
        poll, and a long poll whose window closes before a leader answers gets no message (as
        any long poll that found none: an error status would make a push consumer wait 1 s
        before it receives again). A receive without long polling has the forward budget and
        its error, as every other leader call."""
        now = time.monotonic()
        poll_end = now + q.poll_timeout_ms / 1000
        if answer_within_ms is None:
            answer_by = poll_end + RECEIVE_CALL_MARGIN_S
        else:
            answer_by = now + max(answer_within_ms, q.poll_timeout_ms) / 1000
        retry_until = min(max(poll_end, now + FORWARD_BUDGET_MS / 1000), answer_by)
        while True:
            try:
                return await self._receive_once(q, poll_end, answer_by)
            except grpc.RpcError as exc:
                failure = _forward_failure(exc)
            except Failure as exc:
                failure = exc
            if not failure.worth_retrying:
                raise failure
            if time.monotonic() >= retry_until:
                if q.poll_timeout_ms > 0:
                    return []  # the long poll's window closed while leadership moved
                raise failure
            await asyncio.sleep(failure.pause_s(retry_until))

    async def _receive_once(
        self, q: ReceiveQuery, poll_end: float, answer_by: float
    ) -> list[Received]:
        """One try of :meth:`receive`: here when this node leads, else forwarded, long polling
        what is left of the window, its answer back by ``answer_by`` (monotonic s)."""
        now = time.monotonic()
        if self.node.role is Role.LEADER:
            here = replace(q, poll_timeout_ms=int(max(0.0, poll_end - now) * 1000))
            return await self._here(lambda: self.pops.receive(here))
        poll_s = max(0.0, min(poll_end, answer_by - FORWARD_ANSWER_MARGIN_S) - now)
        resp = await self._leader_stub().PopMessage(
            pb.PopMessageRequest(
                group=q.group,
                topic=q.topic,
                queue_id=q.queue_id,
                max_msgs=q.batch_size,
                invisible_ms=q.invisible_ms,
                subscription=q.subscription,
                poll_timeout_ms=int(poll_s * 1000),
            ),
            timeout=max(MIN_FORWARD_TIMEOUT_S, answer_by - now),
            metadata=caller_signature(),
        )
        return [_received(p) for p in resp.messages]

    async def ack(self, group: str, topic: str, handles: Sequence[str]) -> list[str]:
        """Acknowledge on the leader: per handle "" (done) or the error's stable code."""

        async def here() -> list[str]:
            errors = await self.pops.ack(group, topic, handles)
            return ["" if e is None else e.code for e in errors]

        async def forward(stub: pb_grpc.BrokerStub) -> list[str]:
            request = pb.AckPopRequest(group=group, topic=topic, receipt_handles=handles)
            resp = await stub.AckPop(
                request, timeout=FORWARD_CALL_TIMEOUT_S, metadata=caller_signature()
            )
            return list(resp.codes)

        return await self._on_leader(here, forward)

    async def change_invisible(
        self, group: str, topic: str, handle: str, invisible_ms: int, backoff_floor: bool = False
    ) -> Received:
        """A new invisible time on the leader; the message with its new handle.
        ``backoff_floor``: at least the group's backoff (see :meth:`Pops.change_invisible`)."""

        async def forward(stub: pb_grpc.BrokerStub) -> Received:
            request = pb.ChangeInvisibleTimeRequest(
                group=group,
                topic=topic,
                receipt_handle=handle,
                invisible_ms=invisible_ms,
                backoff_floor=backoff_floor,
            )
            resp = await stub.ChangeInvisibleTime(
                request, timeout=FORWARD_CALL_TIMEOUT_S, metadata=caller_signature()
            )
            return _received(resp.message)

        return await self._on_leader(
            lambda: self.pops.change_invisible(group, topic, handle, invisible_ms, backoff_floor),
            forward,
        )

    async def end_transaction(self, topic: str, uniq_id: str, txn_id: str, commit: bool) -> str:
        """Commit or roll back a transaction on the leader; the verdict applied."""

        async def here() -> str:
            if self.txns is None:
                raise Failure(E.NOT_SERVED, "transactions are not wired on this node")
            return await self.txns.end(topic, uniq_id, txn_id, commit)

        async def forward(stub: pb_grpc.BrokerStub) -> str:
            request = pb.EndTransactionRequest(
                topic=topic, msg_id=uniq_id, transaction_id=txn_id, commit=commit
            )
            resp = await stub.EndTransaction(
                request, timeout=FORWARD_CALL_TIMEOUT_S, metadata=caller_signature()
            )
            return str(resp.outcome)

        return await self._on_leader(here, forward)

    async def renew(
        self, group: str, topic: str, handles: Sequence[str], invisible_ms: int
    ) -> list[str]:
        """auto_renew on the leader: per handle "" (renewed) or the error's stable code."""

        async def here() -> list[str]:
            errors = await self.pops.renew(group, topic, handles, invisible_ms)
            return ["" if e is None else e.code for e in errors]

        async def forward(stub: pb_grpc.BrokerStub) -> list[str]:
            request = pb.AckPopRequest(
                group=group, topic=topic, receipt_handles=handles, renew_ms=invisible_ms
            )
            resp = await stub.AckPop(
                request, timeout=FORWARD_CALL_TIMEOUT_S, metadata=caller_signature()
            )
            return list(resp.codes)

        return await self._on_leader(here, forward)

    async def dead_letter(self, group: str, topic: str, handle: str) -> None:
        """A received message to ``%DLQ%{group}`` and out of flight, on the leader."""

        async def forward(stub: pb_grpc.BrokerStub) -> None:
            request = pb.AckPopRequest(
                group=group, topic=topic, receipt_handles=[handle], dead_letter=True
            )
            await stub.AckPop(request, timeout=FORWARD_CALL_TIMEOUT_S, metadata=caller_signature())

        await self._on_leader(lambda: self.pops.dead_letter(group, topic, handle), forward)

    async def create_group(self, name: str, owner: str = "", unbounded: bool = False) -> None:
        """The subscription group ``name`` with the defaults, unless it exists (a consumer's
        Settings naming a new group), on the leader, for user ``owner`` (``unbounded``: a
        Super user); a forward is the caller's own call (the leader reads its user from it)."""

        async def here() -> None:
            await self.subgroups.update(SubGroup(name), True, owner, unbounded)

        async def forward(stub: pb_grpc.BrokerStub) -> None:
            request = pb.UpdateSubscriptionGroupRequest(
                config=pb.SubscriptionGroup(group=name), create_only=True
            )
            await stub.UpdateSubscriptionGroup(
                request, timeout=FORWARD_CALL_TIMEOUT_S, metadata=caller_signature()
            )

        await self._on_leader(here, forward)

    async def _forward(
        self, stub: pb_grpc.BrokerStub, topic: str, messages: Sequence[pb.Message]
    ) -> list[Stored]:
        resp = await stub.SendMessage(
            pb.SendMessageRequest(topic=topic, messages=messages),
            timeout=FORWARD_CALL_TIMEOUT_S,
            metadata=caller_signature(),
        )
        return [
            Stored(uid, q, off, dup, pos)
            for uid, q, off, dup, pos in zip(
                resp.packed_msg_ids,
                resp.packed_queue_ids,
                resp.packed_queue_offsets,
                resp.packed_duplicates,
                resp.packed_positions,
                strict=True,
            )
        ]

    def _channel(self, addr: str) -> grpc.aio.Channel:
        ch = self._channels.get(addr)
        if ch is None:
            ch = self._channels[addr] = open_aio_channel(addr, self.security)
        return ch


def _received(p: pb.PoppedMessage) -> Received:
    """A message a forwarded receive got, as the leader's own receive answers it."""
    m = p.message
    return Received(
        message_from_pb(m),
        m.queue_id,
        m.queue_offset,
        m.commitlog_position,
        p.delivery_attempt,
        p.receipt_handle,
    )


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


__all__ = ["Failure", "LeaderCalls", "Stored"]
