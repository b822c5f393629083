"""4.x producers' transactions on one node's remoting port: the check-back
(CHECK_TRANSACTION_STATE, 39; docs/REMOTING.md, "Transactions").

A 4.x producer names its producer groups in its heartbeats (``producerDataSet``); this node keeps
the connections that carry each group (:class:`RemotingProducers`, bounded). Every member applies
the leader's check records (:mod:`broker.state.transactions`); for each half checked, the member
asks one live producer of the half's producer group on its remoting port, oneway as RocketMQ's
broker does, with the half message in RocketMQ's layout (its real topic and queue) and the ids its
send was answered with. The producer's checker answers with an END_TRANSACTION
(``fromTransactionCheck=true``), which any member forwards to the leader. A producer connects to
one member, so the member holding the connection is the one that asks; a check nobody here could
take is counted in :attr:`RemotingProducers.checks_unsent` (another member may hold it).

A check-back carries the half message and lets its receiver end the transaction, so it goes only
to a connection whose user may ``Pub`` on the half's topic now (asked again at each check: a
right taken away since the heartbeat counts), as on the RocketMQ 5 port
(``broker.frontends.v2.txn``).
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace

from raftmq.broker.v1 import broker_pb2 as bpb

from broker.components.applied import AppliedMessages
from broker.frontends import rpcmap
from broker.frontends.authguard import AuthGuard
from broker.frontends.remoting.messageext import encode_message_ext, offset_msg_id
from broker.state.transactions import Half, transaction_id
from msgcodec import Message
from remoting.codes import RequestCode
from remoting.connection import RemotingConnection
from remoting.protocol import RemotingCommand

logger = logging.getLogger(__name__)

# Producer groups this node keeps connections of: past it, a new group's producers are not
# asked (a check of theirs is counted unsent; their own member or the leader's retries still
# apply). A group's connections: past it, later ones are not kept (the first ones are asked).
MAX_PRODUCER_GROUPS = 1024
MAX_PRODUCERS_PER_GROUP = 64
# Entries (a group's connection) one user's heartbeats may hold here: the table is shared, and
# without a share per user one user naming many groups, or taking a group's every slot, would
# leave other users' producers unasked. 256 is four times a group's slots; sixteen users are
# needed to fill the table. Without users (user "") there is one tenant and no share.
MAX_PRODUCERS_PER_USER = 256
# A check record older than this (by this node's clock) is a replay (a restart applying the
# log again, a member catching up): the producers were asked when it was new (as on the v2 port).
CHECK_REPLAY_MS = 60_000
# The group every 4.x client reports for its own internal producer: it sends no transactions.
CLIENT_INNER_PRODUCER = "CLIENT_INNER_PRODUCER"


@dataclass(frozen=True, slots=True)
class Producer:
    """One connection carrying a producer of a group, and the user its heartbeat was admitted
    for ("" without users)."""

    conn: RemotingConnection
    user: str


class RemotingProducers:
    """The producer connections of this node's remoting port, and the check-backs sent on them."""

    def __init__(
        self, applied: AppliedMessages, store_host: bytes, guard: AuthGuard | None = None
    ) -> None:
        """``store_host``: the node's remoting address as RocketMQ's 8 bytes (the check's
        offsetMsgId and the message's store host)."""
        self.applied = applied
        self.store_host = store_host
        self.guard = guard
        self._groups: dict[str, dict[RemotingConnection, Producer]] = {}
        self._held: dict[str, int] = {}  # entries per user ("" not counted)
        self._turn = itertools.count()
        self.checks_sent = 0  # check-backs written to a producer's connection, since start
        self.checks_unsent = 0  # check-backs no producer here could take
        applied.ctx.sm.txn.add_check_listener(self.on_checked)

    def producing(self, group: str, conn: RemotingConnection, user: str) -> None:
        """A heartbeat from ``conn`` names a producer of ``group`` (for ``user``)."""
        if not group or group == CLIENT_INNER_PRODUCER:
            return
        members = self._groups.get(group)
        if members is None:
            if len(self._groups) >= MAX_PRODUCER_GROUPS:
                self._prune()
                if len(self._groups) >= MAX_PRODUCER_GROUPS:
                    return
            members = self._groups[group] = {}
        for closed in [c for c in members if c.closed]:
            self._drop(members, closed)
        if conn in members:
            self._drop(members, conn)  # its user may have changed: counted again below
        full = user and self._held.get(user, 0) >= MAX_PRODUCERS_PER_USER
        if len(members) < MAX_PRODUCERS_PER_GROUP and not full:
            members[conn] = Producer(conn, user)
            if user:
                self._held[user] = self._held.get(user, 0) + 1
        if not members:
            del self._groups[group]

    def leave(self, group: str, conn: RemotingConnection) -> None:
        """``conn`` unregistered its producer of ``group``."""
        members = self._groups.get(group)
        if members is not None:
            if conn in members:
                self._drop(members, conn)
            if not members:
                del self._groups[group]

    def _drop(self, members: dict[RemotingConnection, Producer], conn: RemotingConnection) -> None:
        user = members.pop(conn).user
        if user:
            left = self._held[user] - 1
            if left:
                self._held[user] = left
            else:
                del self._held[user]

    def _prune(self) -> None:
        """Drop the closed connections, and the groups left with none."""
        for group in list(self._groups):
            members = self._groups[group]
            for closed in [c for c in members if c.closed]:
                self._drop(members, closed)
            if not members:
                del self._groups[group]

    def on_checked(self, halves: Sequence[Half]) -> None:
        """A check record applied here: ask one live producer of each half's group."""
        now_ms = time.time() * 1000
        for half in halves:
            if now_ms - half.last_check_ms > CHECK_REPLAY_MS:
                continue
            if not self._ask(half):
                self.checks_unsent += 1

    def _may_end(self, producer: Producer, topic: str) -> bool:
        """Whether ``producer``'s user may end a transaction of ``topic`` (Pub on it)."""
        if self.guard is None or not self.guard.settings.active:
            return True
        request = bpb.EndTransactionRequest(topic=topic)
        method = rpcmap.BROKER + "EndTransaction"
        return self.guard.authorize(producer.user, method, producer.conn.peer, request) is None

    def _ask(self, half: Half) -> bool:
        try:
            stored = self.applied.message(half.position, half.size)
        except Exception as exc:
            logger.warning("transaction check of %s skipped: %s", half.uniq_id, exc)
            return False
        members = self._groups.get(stored.producer_group, {})
        candidates = [
            p for p in members.values() if not p.conn.closed and self._may_end(p, half.topic)
        ]
        if not candidates:
            return False
        command = self.check_command(
            half, replace(stored, topic=half.topic, queue_id=half.queue_id)
        )
        first = next(self._turn)
        for n in range(len(candidates)):
            producer = candidates[(first + n) % len(candidates)]
            try:
                producer.conn.oneway(command)
            except Exception as exc:  # closed meanwhile, or its write buffer is full
                logger.debug("transaction check not sent to %s: %s", producer.conn.peer, exc)
                continue
            self.checks_sent += 1
            return True
        return False

    def check_command(self, half: Half, message: Message) -> RemotingCommand:
        """CHECK_TRANSACTION_STATE for ``half`` (``message``: the half as its producer sent it,
        real topic and queue): the ids its send was answered with, so that the producer's
        END_TRANSACTION names the same half."""
        body = encode_message_ext(message, 0, half.position, self.store_host)
        fields = {
            "tranStateTableOffset": "0",
            "commitLogOffset": str(half.position),
            "msgId": half.uniq_id,
            "transactionId": transaction_id(half.position),
            "offsetMsgId": offset_msg_id(self.store_host, half.position),
        }
        return RemotingCommand(
            code=RequestCode.CHECK_TRANSACTION_STATE, opaque=0, ext_fields=fields, body=body
        )


__all__ = [
    "CHECK_REPLAY_MS",
    "MAX_PRODUCERS_PER_GROUP",
    "MAX_PRODUCERS_PER_USER",
    "MAX_PRODUCER_GROUPS",
    "RemotingProducers",
]
