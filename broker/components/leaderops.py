"""The leader's operations as typed requests, each handled once (docs/ARCHITECTURE.md,
"Leader operations and the forwarder").

Sends and POP consumption change replicated state, so only the leader runs them. Every front end
asks for one as a request of this module (a frozen dataclass naming its answer's type) and
:meth:`LeaderOps.run` handles it here, whoever asked: the ``raftmq.broker.v1`` port on the leader,
the RocketMQ 5 port on the leader, or a member that does not lead forwarding its client's
request over ``raftmq.broker.internal.v1.LeaderOps`` (``broker.frontends.internal``), whose
server side runs the same :meth:`LeaderOps.run`.

Protocol-neutral: nothing here knows gRPC, protobuf or a front end. ``owner`` is the original
caller's user and whether it is a Super user (("", False) without users): the one an
auto-created topic or group belongs to and whose quotas a waiting receive counts against.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar, cast

from broker.components.applied import require_leader
from broker.components.pop import Pops, Received, ReceiveQuery
from broker.components.raftnode import RaftNode
from broker.components.sending import OutgoingMessage, SendPath
from broker.components.subscriptions import SubscriptionGroups
from broker.components.transactions import Transactions
from broker.state.machine import SendResult
from broker.state.subgroups import SubGroup

_A = TypeVar("_A")
# The original caller: (user, Super user); ("", False) without users.
Owner = tuple[str, bool]
NOBODY: Owner = ("", False)


class LeaderRequest(Generic[_A]):
    """A leader operation whose answer is an ``_A``."""

    __slots__ = ()


@dataclass(frozen=True, slots=True)
class SendRequest(LeaderRequest[list[SendResult]]):
    """Store ``messages`` in ``topic`` as one entry; one result per message, in order."""

    topic: str
    messages: tuple[OutgoingMessage, ...]


@dataclass(frozen=True, slots=True)
class ReceiveRequest(LeaderRequest[list[Received]]):
    """A POP receive (long polling ``poll_timeout_ms`` on the leader): ``queue_id`` -1 for
    every readable queue of the topic."""

    group: str
    topic: str
    queue_id: int
    batch_size: int
    invisible_ms: int
    subscription: str = ""
    poll_timeout_ms: int = 0


@dataclass(frozen=True, slots=True)
class AckRequest(LeaderRequest[list[str]]):
    """Acknowledge received messages: per handle "" (done) or the error's stable code."""

    group: str
    topic: str
    handles: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class RenewRequest(LeaderRequest[list[str]]):
    """A new invisible time for received messages (a v2 consumer's auto-renewal): per handle
    "" (renewed) or the error's stable code."""

    group: str
    topic: str
    handles: tuple[str, ...]
    invisible_ms: int


@dataclass(frozen=True, slots=True)
class ChangeInvisibleRequest(LeaderRequest[Received]):
    """A new invisible time for one received message; the message with its new handle.
    ``backoff_floor``: at least the group's backoff (:meth:`Pops.change_invisible`)."""

    group: str
    topic: str
    handle: str
    invisible_ms: int
    backoff_floor: bool = False


@dataclass(frozen=True, slots=True)
class DeadLetterRequest(LeaderRequest[None]):
    """A received message to ``%DLQ%{group}`` and out of flight."""

    group: str
    topic: str
    handle: str


@dataclass(frozen=True, slots=True)
class EndTransactionRequest(LeaderRequest[str]):
    """Commit or roll back a transaction's half message; the verdict applied."""

    topic: str
    msg_id: str
    transaction_id: str
    commit: bool


@dataclass(frozen=True, slots=True)
class CreateGroupRequest(LeaderRequest[None]):
    """The subscription group ``group`` with the defaults, unless it exists (a consumer naming
    a new group); it belongs to the caller."""

    group: str


_Handler = Callable[[Any, Owner], Awaitable[Any]]


class LeaderOps:
    """The one handler of each :class:`LeaderRequest`, on the leader."""

    def __init__(
        self,
        node: RaftNode,
        sender: SendPath,
        pops: Pops,
        txns: Transactions,
        subgroups: SubscriptionGroups,
    ) -> None:
        self.node = node
        self.sender = sender
        self.pops = pops
        self.txns = txns
        self.subgroups = subgroups
        self._handlers: Mapping[type, _Handler] = {
            SendRequest: self._send,
            ReceiveRequest: self._receive,
            AckRequest: self._ack,
            RenewRequest: self._renew,
            ChangeInvisibleRequest: self._change_invisible,
            DeadLetterRequest: self._dead_letter,
            EndTransactionRequest: self._end_transaction,
            CreateGroupRequest: self._create_group,
        }

    async def run(self, request: LeaderRequest[_A], owner: Owner = NOBODY) -> _A:
        """Handle ``request`` for ``owner`` here; raises unless this node leads (NOT_LEADER)
        and with the component's error when it fails."""
        handler = self._handlers.get(type(request))
        assert handler is not None, f"no handler for {type(request).__name__}"
        require_leader(self.node)
        return cast(_A, await handler(request, owner))

    async def _send(self, r: SendRequest, owner: Owner) -> list[SendResult]:
        return await self.sender.send(r.topic, r.messages, owner)

    async def _receive(self, r: ReceiveRequest, owner: Owner) -> list[Received]:
        query = ReceiveQuery(
            r.group,
            r.topic,
            r.queue_id,
            r.batch_size,
            r.invisible_ms,
            r.subscription,
            r.poll_timeout_ms,
            owner[0],
            owner[1],
        )
        return await self.pops.receive(query)

    async def _ack(self, r: AckRequest, owner: Owner) -> list[str]:
        errors = await self.pops.ack(r.group, r.topic, r.handles)
        return ["" if e is None else e.code for e in errors]

    async def _renew(self, r: RenewRequest, owner: Owner) -> list[str]:
        errors = await self.pops.renew(r.group, r.topic, r.handles, r.invisible_ms)
        return ["" if e is None else e.code for e in errors]

    async def _change_invisible(self, r: ChangeInvisibleRequest, owner: Owner) -> Received:
        return await self.pops.change_invisible(
            r.group, r.topic, r.handle, r.invisible_ms, r.backoff_floor
        )

    async def _dead_letter(self, r: DeadLetterRequest, owner: Owner) -> None:
        await self.pops.dead_letter(r.group, r.topic, r.handle)

    async def _end_transaction(self, r: EndTransactionRequest, owner: Owner) -> str:
        return await self.txns.end(r.topic, r.msg_id, r.transaction_id, r.commit)

    async def _create_group(self, r: CreateGroupRequest, owner: Owner) -> None:
        await self.subgroups.update(SubGroup(r.group), True, owner[0], owner[1])


__all__ = [
    "NOBODY",
    "AckRequest",
    "ChangeInvisibleRequest",
    "CreateGroupRequest",
    "DeadLetterRequest",
    "EndTransactionRequest",
    "LeaderOps",
    "LeaderRequest",
    "ReceiveRequest",
    "RenewRequest",
    "SendRequest",
]
