"""The broker's remoting front end: RocketMQ 4.x's requests as calls of the broker components
(docs/REMOTING.md, "Broker").

A thin adapter, as the ``raftmq.broker.v1`` and RocketMQ 5 ports are: each request code's
handler reads its header (:mod:`broker.frontends.remoting.fields`), calls one component and writes
the answer RocketMQ's way. Sends go through the forwarder (run here on the leader, else
forwarded to it: a 4.x producer that reaches a member during a failover is still served);
pulls, offsets queries and lookups read this node's applied state; the writes that are not
leader operations (offset commits, send-backs) are answered SERVICE_NOT_AVAILABLE on a
member that does not lead (the routes name the leader as brokerId 0, so clients are there
once the NameServer has the new leader). Every other request code is answered
REQUEST_CODE_NOT_SUPPORTED.

With users on (``authenticationEnabled``/``authorizationEnabled``) every request must carry
RocketMQ's ACL fields (``AccessKey``, ``Signature``): checked by the node's guard against the
same users and ACLs as every other port (:meth:`AuthGuard.check_remoting`), refused with
NO_PERMISSION and a remark before its handler runs. A send or a transaction's verdict forwarded
from a member that does not lead carries the request's proof (its AccessKey, Signature and the
exact signed material): the leader checks the same signature and the same user's rights again,
as for the direct request.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from broker.components.leaderops import EndTransactionRequest, SendRequest
from broker.components.pulling import MAX_PULL_MSGS, PullQuery, PullResult, PullStatus
from broker.components.retry import SendBackItem
from broker.frontends import rpcmap
from broker.frontends.authguard import AuthGuard
from broker.frontends.internal.codec import RemotingProof
from broker.frontends.internal.forwarder import Forwarder, Origin
from broker.frontends.remoting import fields as F
from broker.frontends.remoting import sends
from broker.frontends.remoting.answers import failure_answer
from broker.frontends.remoting.checkback import RemotingProducers
from broker.frontends.remoting.fields import Refused
from broker.frontends.remoting.messageext import (
    MessageExtError,
    encode_message_ext,
    host_bytes,
    offset_msg_id,
)
from broker.state.auth.model import GET, PUB, SUB, Resource
from broker.state.delayrules import RETRY_QUEUE_NUMS, retry_topic
from broker.state.machine import SendResult
from broker.state.names import MAX_GROUP_LENGTH
from broker.state.transactions import HALF_TOPIC, transaction_id
from dledger.core import Role
from msgcodec import PROPERTY_REAL_TOPIC, Message, decode_rows
from remoting.codes import RequestCode, ResponseCode
from remoting.connection import RemotingConnection
from remoting.protocol import RemotingCommand
from remoting.server import not_supported
from rpckit.callguard import Refusal

if TYPE_CHECKING:
    from broker.app import Broker

logger = logging.getLogger(__name__)

Want = tuple[Resource, str]
# PullSysFlag: the pull carries an offset to commit, may be held, carries its subscription.
PULL_COMMIT_OFFSET = 0x1
PULL_SUSPEND = 0x2
PULL_SUBSCRIPTION = 0x4
# A pull answer's body: a remoting frame is at most 16 MiB; the pull path answers at most
# MAX_ANSWER_BYTES of stored messages, which RocketMQ's layout grows by tens of bytes each (plus
# the tags, keys and id in the properties). Past this, the answer stops (a single message is
# always answered).
MAX_PULL_BODY_BYTES = 12 << 20
# EndTransactionRequestHeader.commitOrRollback (MessageSysFlag's transaction types).
TRANSACTION_NOT_TYPE = 0
TRANSACTION_COMMIT_TYPE = 0x8
TRANSACTION_ROLLBACK_TYPE = 0xC
# (group, topic) subscriptions kept from heartbeats (for pulls that carry none): about 200
# bytes each; a broker's consumer groups times their topics, far below this.
MAX_KEPT_SUBSCRIPTIONS = 100_000
# Groups whose consumers are told of a change of members, and connections per group: beyond
# them a consumer learns of the change at its next rebalance period (20 s for the Java client).
MAX_NOTIFIED_GROUPS = 10_000
MAX_NOTIFIED_PER_GROUP = 1024
# A heartbeat's consumer in this model reads every queue itself: no retry topic.
BROADCASTING = "BROADCASTING"
# The subscription expression types a 4.x consumer may send: raftmq filters by tag only.
TAG_EXPRESSION = "TAG"
# Keys of one QUERY_MESSAGE (RocketMQ's maxNum is 32 by default; the lookup caps it at 1024).
MAX_QUERY_NUM = 1024
# A heartbeat's consumer and producer groups (a client process holds a few).
MAX_HEARTBEAT_GROUPS = 256
# RocketMQ's QUERY_CONSUMER_OFFSET answer for a group without an offset whose queue still
# starts at 0: start there (its broker says so while the first message is in memory).
_NOT_FOUND_REMARK = "no committed offset for this group and queue"


@dataclass(frozen=True, slots=True)
class Caller:
    """Who sent the request: the user the guard admitted ("" without users) and whether it is
    a Super user."""

    user: str = ""
    unbounded: bool = False
    # What the request proved (None without users): a forward carries it to the leader.
    proof: RemotingProof | None = None

    @property
    def origin(self) -> Origin:
        """The caller as a forward names it."""
        return Origin(self.user, self.unbounded, remoting=self.proof)


_Handler = Callable[
    [RemotingCommand, RemotingConnection, Caller], Awaitable[RemotingCommand | None]
]
_Wants = Callable[[RemotingCommand], list[Want]]


def _ok(
    cmd: RemotingCommand, ext: Mapping[str, object] | None = None, body: bytes = b""
) -> RemotingCommand:
    return cmd.response(
        ResponseCode.SUCCESS, None, {k: str(v) for k, v in (ext or {}).items()}, body
    )


def _topic_sub(cmd: RemotingCommand) -> list[Want]:
    return [rpcmap.topic(F.text(cmd.ext_fields, "topic", max_chars=F.MAX_TEXT_CHARS), SUB)]


def _group_topic_sub(cmd: RemotingCommand) -> list[Want]:
    group = F.text(cmd.ext_fields, "consumerGroup", max_chars=F.MAX_TEXT_CHARS)
    return [rpcmap.group(group, SUB), *_topic_sub(cmd)]


def _group_sub(name: str) -> _Wants:
    return lambda cmd: [rpcmap.group(F.text(cmd.ext_fields, name, max_chars=F.MAX_TEXT_CHARS), SUB)]


def _send_wants(cmd: RemotingCommand) -> list[Want]:
    ext = sends.v1_fields(cmd.code == RequestCode.SEND_MESSAGE_V2, cmd.ext_fields)
    return [rpcmap.topic(F.text(ext, "topic", max_chars=F.MAX_TEXT_CHARS), PUB)]


def _heartbeat_wants(cmd: RemotingCommand) -> list[Want]:
    data = F.json_body(cmd.body, "heartbeat")
    wants: list[Want] = []
    for c in F.json_list(data.get("consumerDataSet"), "consumerDataSet", MAX_HEARTBEAT_GROUPS):
        wants.append(rpcmap.group(F.json_text(c, "groupName", "consumerData"), SUB))
        subs = F.json_list(c.get("subscriptionDataSet"), "subscriptionDataSet", 1024)
        wants.extend(rpcmap.topic(F.json_text(s, "topic", "subscriptionData"), SUB) for s in subs)
    return list(dict.fromkeys(wants))


def _locks_wants(cmd: RemotingCommand) -> list[Want]:
    data = F.json_body(cmd.body, "lock")
    wants = [rpcmap.group(F.json_text(data, "consumerGroup", "lock request"), SUB)]
    for mq in F.json_list(data.get("mqSet"), "mqSet", 4096):
        wants.append(rpcmap.topic(F.json_text(mq, "topic", "messageQueue"), SUB))
    return list(dict.fromkeys(wants))


def _unregister_wants(cmd: RemotingCommand) -> list[Want]:
    group = F.text(cmd.ext_fields, "consumerGroup", "", F.MAX_TEXT_CHARS)
    return [rpcmap.group(group, SUB)] if group else []


def _query_wants(cmd: RemotingCommand) -> list[Want]:
    return [rpcmap.topic(F.text(cmd.ext_fields, "topic", max_chars=F.MAX_TEXT_CHARS), GET)]


class RemotingBrokerService:
    """Serves one node's remoting port: :meth:`handle` is the server's handler."""

    def __init__(self, broker: Broker, forwarder: Forwarder, store_addr: str) -> None:
        """``store_addr`` is the node's ``storeHost`` and remoting port ("ip:port"): the store
        host of every message it answers, so a 4.x client's offsetMsgId comes back here."""
        self.broker = broker
        self.node = broker.node
        self.forwarder = forwarder
        self.guard: AuthGuard | None = broker.guard
        self.store_host = host_bytes(store_addr)
        # The latest subscription of each (group, topic) a heartbeat named: a pull without its
        # own (PullSysFlag without 0x4) filters by it. At most MAX_KEPT_SUBSCRIPTIONS; pruned
        # when its group has no consumer left.
        self._subscriptions: dict[tuple[str, str], str] = {}
        # The connections carrying producers of each group (transaction check-backs).
        self.producers = RemotingProducers(broker.applied, self.store_host, self.guard)
        # The connections carrying consumers of each group (for NOTIFY_CONSUMER_IDS_CHANGED);
        # closed ones are dropped when the group changes.
        self._members: dict[str, set[RemotingConnection]] = {}
        self._routes: dict[int, tuple[_Wants | None, _Handler]] = {
            RequestCode.SEND_MESSAGE: (_send_wants, self._send),
            RequestCode.SEND_MESSAGE_V2: (_send_wants, self._send),
            RequestCode.SEND_BATCH_MESSAGE: (_send_wants, self._send),
            RequestCode.PULL_MESSAGE: (_group_topic_sub, self._pull),
            RequestCode.QUERY_CONSUMER_OFFSET: (_group_topic_sub, self._query_offset),
            RequestCode.UPDATE_CONSUMER_OFFSET: (_group_topic_sub, self._update_offset),
            RequestCode.GET_MAX_OFFSET: (_topic_sub, self._max_offset),
            RequestCode.GET_MIN_OFFSET: (_topic_sub, self._min_offset),
            RequestCode.SEARCH_OFFSET_BY_TIMESTAMP: (_topic_sub, self._search_offset),
            RequestCode.HEART_BEAT: (_heartbeat_wants, self._heartbeat),
            RequestCode.UNREGISTER_CLIENT: (_unregister_wants, self._unregister),
            RequestCode.GET_CONSUMER_LIST_BY_GROUP: (_group_sub("consumerGroup"), self._consumers),
            RequestCode.CONSUMER_SEND_MSG_BACK: (self._send_back_wants, self._send_back),
            RequestCode.VIEW_MESSAGE_BY_ID: (self._view_wants, self._view),
            RequestCode.QUERY_MESSAGE: (_query_wants, self._query_message),
            RequestCode.GET_EARLIEST_MSG_STORETIME: (_topic_sub, self._earliest_time),
            RequestCode.END_TRANSACTION: (self._end_wants, self._end_transaction),
            RequestCode.LOCK_BATCH_MQ: (_locks_wants, self._lock),
            RequestCode.UNLOCK_BATCH_MQ: (_locks_wants, self._unlock),
        }

    # ------------------------------------------------------------------ dispatch

    async def handle(
        self, cmd: RemotingCommand, conn: RemotingConnection
    ) -> RemotingCommand | None:
        route = self._routes.get(cmd.code)
        if route is None:
            return not_supported(cmd)
        wants, handler = route
        try:
            caller = self._admit(cmd, conn, wants)
            return await handler(cmd, conn, caller)
        except Refused as refused:
            return cmd.response(refused.response_code, refused.remark)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            sending = cmd.code in (
                RequestCode.SEND_MESSAGE,
                RequestCode.SEND_MESSAGE_V2,
                RequestCode.SEND_BATCH_MESSAGE,
            )
            code, remark = failure_answer(exc, self.node, sending)
            if code == ResponseCode.SYSTEM_ERROR and "INTERNAL" in remark[:16]:
                logger.exception("remoting request %d from %s failed", cmd.code, conn.peer)
            return cmd.response(code, remark)

    def _admit(
        self, cmd: RemotingCommand, conn: RemotingConnection, wants: _Wants | None
    ) -> Caller:
        """The caller of ``cmd`` after the node's guard (none: anybody); refused with
        NO_PERMISSION when its signature or rights fail."""
        guard = self.guard
        if guard is None or not guard.settings.active:
            return Caller()
        ext = cmd.ext_fields
        signed = "".join(ext[k] for k in sorted(ext) if k != "Signature").encode() + cmd.body
        proof = RemotingProof(ext.get("AccessKey", ""), ext.get("Signature", ""), signed)
        needed = wants(cmd) if wants is not None else []
        ip = conn.peer.rpartition(":")[0].strip("[]")
        method = f"remoting/{cmd.code}"
        admitted = guard.check_remoting(
            proof.access_key, proof.signature, proof.signed, needed, ip, method
        )
        if isinstance(admitted, Refusal):
            raise Refused(ResponseCode.NO_PERMISSION, f"{admitted.code} {admitted.reason}")
        return Caller(*admitted, proof)

    def _require_leader(self, what: str) -> None:
        if self.node.role is not Role.LEADER:
            raise Refused(
                ResponseCode.SERVICE_NOT_AVAILABLE,
                f"NOT_LEADER {what} is served by the group's leader (brokerId 0 in the routes)",
            )

    # ------------------------------------------------------------------ sends

    async def _send(
        self, cmd: RemotingCommand, conn: RemotingConnection, caller: Caller
    ) -> RemotingCommand:
        ext = sends.v1_fields(cmd.code == RequestCode.SEND_MESSAGE_V2, cmd.ext_fields)
        header = sends.send_header(ext)
        max_bytes = self.broker.cfg.max_message_size_bytes
        if cmd.code == RequestCode.SEND_BATCH_MESSAGE or header.batch:
            messages = sends.batch_messages(header, cmd.body, conn.peer, max_bytes)
        else:
            one = sends.outgoing(
                header, cmd.body, header.properties, header.flag, conn.peer, max_bytes
            )
            messages = (one,)
        # A forward carries the caller's proof: the leader checks the same user's rights.
        results = await self.forwarder.call(SendRequest(header.topic, messages), caller.origin)
        return _ok(cmd, self._send_answer(results))

    def _send_answer(self, results: list[SendResult]) -> dict[str, object]:
        first = results[0]
        ids = ",".join(offset_msg_id(self.store_host, r.position) for r in results)
        return {
            "msgId": ids,
            "queueId": first.queue_id,
            "queueOffset": first.queue_offset,
            # A half message's transaction (the others ignore it): END_TRANSACTION names it.
            "transactionId": transaction_id(first.position),
        }

    # ------------------------------------------------------------------ transactions

    def _half_at(self, position: int) -> tuple[Message, str]:
        """The half message stored at ``position`` and its real topic; refused when there is
        none."""
        try:
            half = self.broker.applied.message(position)
        except Exception:
            half = None
        topic = half.properties.get(PROPERTY_REAL_TOPIC, "") if half is not None else ""
        if half is None or half.topic != HALF_TOPIC or not topic:
            raise Refused(
                ResponseCode.SYSTEM_ERROR,
                f"no half message at commitLogOffset {position}: not a transaction",
            )
        return half, topic

    def _end_wants(self, cmd: RemotingCommand) -> list[Want]:
        position = F.integer(cmd.ext_fields, "commitLogOffset", 0, F.INT64_MAX)
        return [rpcmap.topic(self._half_at(position)[1], PUB)]

    async def _end_transaction(
        self, cmd: RemotingCommand, conn: RemotingConnection, caller: Caller
    ) -> RemotingCommand:
        """A producer's verdict on its half message (the one at ``commitLogOffset``, the
        position its send was answered with): commit (8) or roll back (12); 0 (unknown) leaves
        the half to the transaction check (docs/REMOTING.md)."""
        ext = cmd.ext_fields
        position = F.integer(ext, "commitLogOffset", 0, F.INT64_MAX)
        verdict = F.integer(ext, "commitOrRollback", F.INT32_MIN, F.INT32_MAX)
        if verdict == TRANSACTION_NOT_TYPE:
            return _ok(cmd)
        if verdict not in (TRANSACTION_COMMIT_TYPE, TRANSACTION_ROLLBACK_TYPE):
            raise Refused(ResponseCode.SYSTEM_ERROR, f"commitOrRollback {verdict}: not 0, 8 or 12")
        half, topic = self._half_at(position)
        named = F.text(ext, "msgId", "", 64).upper()
        if named and named not in (half.uniq_id, offset_msg_id(self.store_host, position)):
            raise Refused(ResponseCode.SYSTEM_ERROR, f"msgId {named} is not the half's")
        commit = verdict == TRANSACTION_COMMIT_TYPE
        end = EndTransactionRequest(topic, half.uniq_id, transaction_id(position), commit)
        await self.forwarder.call(end, caller.origin)
        return _ok(cmd)

    # ------------------------------------------------------------------ pulls

    async def _pull(
        self, cmd: RemotingCommand, conn: RemotingConnection, caller: Caller
    ) -> RemotingCommand:
        ext = cmd.ext_fields
        group = F.text(ext, "consumerGroup", max_chars=F.MAX_TEXT_CHARS)
        topic = F.text(ext, "topic", max_chars=F.MAX_TEXT_CHARS)
        queue_id = F.integer(ext, "queueId", 0, F.INT32_MAX)
        queue_offset = F.integer(ext, "queueOffset", 0, F.INT64_MAX)
        max_msgs = F.integer(ext, "maxMsgNums", 1, F.INT32_MAX)
        sys_flag = F.integer(ext, "sysFlag", 0, F.INT32_MAX, 0)
        suspend_ms = F.integer(ext, "suspendTimeoutMillis", 0, F.INT64_MAX, 0)
        kind = F.text(ext, "expressionType", TAG_EXPRESSION)
        if kind.upper() != TAG_EXPRESSION:
            raise Refused(
                ResponseCode.SUBSCRIPTION_PARSE_FAILED,
                f"expression type {kind!r}: this broker filters by tag only",
            )
        if sys_flag & PULL_SUBSCRIPTION:
            subscription = F.text(ext, "subscription", "*", F.MAX_TEXT_CHARS)
        else:
            subscription = self._subscriptions.get((group, topic), "*")
        if sys_flag & PULL_COMMIT_OFFSET and self.node.role is Role.LEADER:
            commit = F.integer(ext, "commitOffset", 0, F.INT64_MAX, 0)
            await self._commit_quietly(group, topic, queue_id, commit, caller)
        suspend = bool(sys_flag & PULL_SUSPEND)
        query = PullQuery(
            topic,
            queue_id,
            queue_offset,
            min(max_msgs, MAX_PULL_MSGS),
            subscription,
            min(suspend_ms, F.INT32_MAX) if suspend else 0,
            not suspend,
            caller.user,
            caller.unbounded,
        )
        result = await self.broker.puller.pull(query, conn.peer)
        return self._pull_answer(cmd, result)

    async def _commit_quietly(
        self, group: str, topic: str, queue_id: int, offset: int, caller: Caller
    ) -> None:
        """The offset a pull carries (as RocketMQ's master commits it): a failure is the
        pull's business no more than RocketMQ's is; the consumer commits it again."""
        try:
            await self.broker.offsets.commit(
                group, topic, queue_id, offset, sync=False, owner=(caller.user, caller.unbounded)
            )
        except Exception as exc:
            logger.debug("pull's offset commit %s/%s/%d: %s", group, topic, queue_id, exc)

    def _pull_answer(self, cmd: RemotingCommand, r: PullResult) -> RemotingCommand:
        ext: dict[str, object] = {
            "nextBeginOffset": r.next_begin_offset,
            "minOffset": r.min_offset,
            "maxOffset": r.max_offset,
            "suggestWhichBrokerId": 0,
        }
        if r.status is not PullStatus.FOUND:
            code = {
                PullStatus.NO_NEW_MSG: ResponseCode.PULL_NOT_FOUND,
                PullStatus.NO_MATCHED_MSG: ResponseCode.PULL_RETRY_IMMEDIATELY,
                PullStatus.OFFSET_ILLEGAL: ResponseCode.PULL_OFFSET_MOVED,
            }[r.status]
            return cmd.response(code, None, {k: str(v) for k, v in ext.items()})
        body, taken = self._encode_found(r)
        if taken < len(r.queue_offsets):
            ext["nextBeginOffset"] = r.queue_offsets[taken]
        return _ok(cmd, ext, body)

    def _encode_found(self, r: PullResult) -> tuple[bytes, int]:
        """The found messages in RocketMQ's layout, as many as fit the answer; how many."""
        rows = decode_rows(r.raw, 0, len(r.positions))
        parts: list[bytes] = []
        size = 0
        for row, qoff, position in zip(rows, r.queue_offsets, r.positions, strict=True):
            try:
                part = encode_message_ext(Message(*row[1:]), qoff, position, self.store_host)
            except MessageExtError as exc:
                if parts:
                    break  # answered up to it; the next pull starts there and is refused
                raise Refused(
                    ResponseCode.SYSTEM_ERROR, f"message at offset {qoff}: {exc}"
                ) from None
            if parts and size + len(part) > MAX_PULL_BODY_BYTES:
                break
            parts.append(part)
            size += len(part)
        return b"".join(parts), len(parts)

    # ------------------------------------------------------------------ offsets

    async def _query_offset(
        self, cmd: RemotingCommand, conn: RemotingConnection, caller: Caller
    ) -> RemotingCommand:
        ext = cmd.ext_fields
        group = F.text(ext, "consumerGroup", max_chars=F.MAX_TEXT_CHARS)
        topic = F.text(ext, "topic", max_chars=F.MAX_TEXT_CHARS)
        queue_id = F.integer(ext, "queueId", 0, F.INT32_MAX)
        offsets = self.broker.offsets
        committed = offsets.committed(group, topic, queue_id)
        if committed < 0:
            low, _high = offsets.queue_range(topic, queue_id)
            if low > 0:
                return cmd.response(ResponseCode.QUERY_NOT_FOUND, _NOT_FOUND_REMARK)
            committed = 0
        return _ok(cmd, {"offset": committed})

    async def _update_offset(
        self, cmd: RemotingCommand, conn: RemotingConnection, caller: Caller
    ) -> RemotingCommand:
        ext = cmd.ext_fields
        group = F.text(ext, "consumerGroup", max_chars=F.MAX_TEXT_CHARS)
        topic = F.text(ext, "topic", max_chars=F.MAX_TEXT_CHARS)
        queue_id = F.integer(ext, "queueId", 0, F.INT32_MAX)
        offset = F.integer(ext, "commitOffset", 0, F.INT64_MAX)
        self._require_leader("an offset commit")
        owner = (caller.user, caller.unbounded)
        await self.broker.offsets.commit(group, topic, queue_id, offset, sync=False, owner=owner)
        return _ok(cmd)

    def _queue(self, cmd: RemotingCommand) -> tuple[str, int]:
        topic = F.text(cmd.ext_fields, "topic", max_chars=F.MAX_TEXT_CHARS)
        return topic, F.integer(cmd.ext_fields, "queueId", 0, F.INT32_MAX)

    async def _max_offset(
        self, cmd: RemotingCommand, conn: RemotingConnection, caller: Caller
    ) -> RemotingCommand:
        return _ok(cmd, {"offset": self.broker.offsets.queue_range(*self._queue(cmd))[1]})

    async def _min_offset(
        self, cmd: RemotingCommand, conn: RemotingConnection, caller: Caller
    ) -> RemotingCommand:
        return _ok(cmd, {"offset": self.broker.offsets.queue_range(*self._queue(cmd))[0]})

    async def _earliest_time(
        self, cmd: RemotingCommand, conn: RemotingConnection, caller: Caller
    ) -> RemotingCommand:
        """The store time of the queue's first message; -1 when the queue is empty."""
        topic, queue_id = self._queue(cmd)
        low, high = self.broker.offsets.queue_range(topic, queue_id)
        cq = self.broker.sm.cqs.find(topic, queue_id)
        if low >= high or cq is None:
            return _ok(cmd, {"timestamp": -1})
        position = cq.get(low)[0]
        return _ok(cmd, {"timestamp": self.broker.applied.message(position).store_timestamp_ms})

    async def _search_offset(
        self, cmd: RemotingCommand, conn: RemotingConnection, caller: Caller
    ) -> RemotingCommand:
        topic, queue_id = self._queue(cmd)
        timestamp_ms = F.integer(cmd.ext_fields, "timestamp", 0, F.INT64_MAX)
        return _ok(cmd, {"offset": self.broker.offsets.search(topic, queue_id, timestamp_ms)})

    # ------------------------------------------------------------------ clients

    async def _heartbeat(
        self, cmd: RemotingCommand, conn: RemotingConnection, caller: Caller
    ) -> RemotingCommand:
        data = F.json_body(cmd.body, "heartbeat")
        client_id = F.json_text(data, "clientID", "heartbeat")
        owner = (caller.user, caller.unbounded)
        consumers = F.json_list(
            data.get("consumerDataSet"), "consumerDataSet", MAX_HEARTBEAT_GROUPS
        )
        for c in consumers:
            group = F.json_text(c, "groupName", "consumerData")
            subs = F.json_list(c.get("subscriptionDataSet"), "subscriptionDataSet", 1024)
            pairs = [
                (
                    F.json_text(s, "topic", "subscriptionData"),
                    F.json_text(s, "subString", "subscriptionData", F.MAX_TEXT_CHARS),
                )
                for s in subs
            ]
            self.broker.consumers.heartbeat(group, client_id, pairs, [], owner)
            self._remember(group, pairs)
            self._join(group, conn)
            if c.get("messageModel") != BROADCASTING:
                await self._ensure_retry_topic(group, owner)
        producers = F.json_list(
            data.get("producerDataSet"), "producerDataSet", MAX_HEARTBEAT_GROUPS
        )
        for p in producers:
            group = F.json_text(p, "groupName", "producerData", MAX_GROUP_LENGTH)
            self.producers.producing(group, conn, caller.user)
        return _ok(cmd)

    def _remember(self, group: str, pairs: list[tuple[str, str]]) -> None:
        """The subscriptions a pull without its own filters by. Past
        :data:`MAX_KEPT_SUBSCRIPTIONS` the table starts again (such a pull then gets every tag
        until the group's next heartbeat, 30 s: a 4.x consumer filters tags itself too)."""
        if len(self._subscriptions) + len(pairs) > MAX_KEPT_SUBSCRIPTIONS:
            self._subscriptions.clear()
        for topic, expression in pairs:
            self._subscriptions[(group, topic)] = expression

    def _join(self, group: str, conn: RemotingConnection) -> None:
        """``conn`` carries a consumer of ``group``: when it is new there, the group's other
        consumers on this node are told to rebalance now (NOTIFY_CONSUMER_IDS_CHANGED, as
        RocketMQ's broker does), not at their next period."""
        members = self._members.get(group)
        if members is None:
            if len(self._members) >= MAX_NOTIFIED_GROUPS:
                return  # the clients' own rebalance period still applies
            members = self._members[group] = set()
        members.difference_update([c for c in members if c.closed])
        if conn in members or len(members) >= MAX_NOTIFIED_PER_GROUP:
            return
        members.add(conn)
        self._notify(group, members - {conn})

    def _leave(self, group: str, conn: RemotingConnection) -> None:
        members = self._members.get(group)
        if members is None or conn not in members:
            return
        members.discard(conn)
        members.difference_update([c for c in members if c.closed])
        if not members:
            del self._members[group]
            return
        self._notify(group, members)

    @staticmethod
    def _notify(group: str, conns: set[RemotingConnection]) -> None:
        note = RemotingCommand(
            code=RequestCode.NOTIFY_CONSUMER_IDS_CHANGED,
            opaque=0,
            ext_fields={"consumerGroup": group},
        )
        for other in conns:
            try:
                other.oneway(note)
            except Exception as exc:  # closed meanwhile, or its write buffer is full
                logger.debug("consumer ids of %s not notified to %s: %s", group, other.peer, exc)

    async def _ensure_retry_topic(self, group: str, owner: tuple[str, bool]) -> None:
        """A clustering consumer's ``%RETRY%{group}`` exists once it heartbeats, as RocketMQ's
        broker makes it then: its consumers subscribe to it at start and find its route
        before their first send-back. Created by the leader; a failure is the next
        heartbeat's to retry (the first send-back creates it too)."""
        if self.node.role is not Role.LEADER:
            return
        try:
            await self.broker.topics.ensure_system(retry_topic(group), RETRY_QUEUE_NUMS, owner)
        except Exception as exc:
            logger.debug("retry topic of %s not created: %s", group, exc)

    async def _unregister(
        self, cmd: RemotingCommand, conn: RemotingConnection, caller: Caller
    ) -> RemotingCommand:
        ext = cmd.ext_fields
        client_id = F.text(ext, "clientID")
        producer_group = F.text(ext, "producerGroup", "", F.MAX_TEXT_CHARS)
        if producer_group:
            self.producers.leave(producer_group, conn)
        group = F.text(ext, "consumerGroup", "", F.MAX_TEXT_CHARS)
        if group:
            self.broker.consumers.unregister(group, client_id, (caller.user, caller.unbounded))
            self._leave(group, conn)
            if not self.broker.consumers.clients(group):
                for key in [k for k in self._subscriptions if k[0] == group]:
                    del self._subscriptions[key]
        return _ok(cmd)

    async def _consumers(
        self, cmd: RemotingCommand, conn: RemotingConnection, caller: Caller
    ) -> RemotingCommand:
        group = F.text(cmd.ext_fields, "consumerGroup", max_chars=F.MAX_TEXT_CHARS)
        clients = self.broker.consumers.clients(group)
        return _ok(cmd, body=json.dumps({"consumerIdList": clients}).encode())

    async def _lock(
        self, cmd: RemotingCommand, conn: RemotingConnection, caller: Caller
    ) -> RemotingCommand:
        group, client_id, queues, named = _lock_request(cmd.body)
        self._require_leader("a queue lock")
        locked = self.broker.consumers.lock(
            group, client_id, queues, (caller.user, caller.unbounded)
        )
        body = {"lockOKMQSet": [named[q] for q in locked if q in named]}
        return _ok(cmd, body=json.dumps(body).encode())

    async def _unlock(
        self, cmd: RemotingCommand, conn: RemotingConnection, caller: Caller
    ) -> RemotingCommand:
        group, client_id, queues, _named = _lock_request(cmd.body)
        self.broker.consumers.unlock(group, client_id, queues, (caller.user, caller.unbounded))
        return _ok(cmd)

    # ------------------------------------------------------------------ retries, lookups

    def _send_back_wants(self, cmd: RemotingCommand) -> list[Want]:
        group = F.text(cmd.ext_fields, "group", max_chars=F.MAX_TEXT_CHARS)
        position = F.integer(cmd.ext_fields, "offset", 0, F.INT64_MAX)
        return [rpcmap.group(group, SUB), *self._stored_topic(position)]

    def _stored_topic(self, position: int) -> list[Want]:
        """``Sub`` on the topic of the message at ``position`` (none when there is no such
        message: the handler answers that)."""
        try:
            return [rpcmap.topic(self.broker.applied.message(position).topic, SUB)]
        except Exception:
            return []

    async def _send_back(
        self, cmd: RemotingCommand, conn: RemotingConnection, caller: Caller
    ) -> RemotingCommand:
        ext = cmd.ext_fields
        group = F.text(ext, "group", max_chars=F.MAX_TEXT_CHARS)
        position = F.integer(ext, "offset", 0, F.INT64_MAX)
        delay_level = F.integer(ext, "delayLevel", F.INT32_MIN, F.INT32_MAX, 0)
        max_times = F.integer(ext, "maxReconsumeTimes", 0, F.INT32_MAX, -1)
        origin_id = F.text(ext, "originMsgId", "", 64).upper()
        # 4.x clients name the message by its offsetMsgId (ali-ons) or its UNIQ_KEY (Java): the
        # former is checked by its position, the latter against the stored id.
        if origin_id == offset_msg_id(self.store_host, position):
            origin_id = ""
        self._require_leader("a send-back")
        await self.broker.retries.send_back(
            group,
            [SendBackItem(position, origin_id)],
            delay_level,
            None if max_times < 0 else max_times,
            owner=(caller.user, caller.unbounded),
        )
        return _ok(cmd)

    def _view_wants(self, cmd: RemotingCommand) -> list[Want]:
        position = F.integer(cmd.ext_fields, "offset", 0, F.INT64_MAX)
        topic = self._stored_topic(position)
        return [(topic[0][0], GET)] if topic else []

    async def _view(
        self, cmd: RemotingCommand, conn: RemotingConnection, caller: Caller
    ) -> RemotingCommand:
        position = F.integer(cmd.ext_fields, "offset", 0, F.INT64_MAX)
        applied = self.broker.applied
        try:
            msg = applied.message(position)
        except Exception:
            raise Refused(
                ResponseCode.SYSTEM_ERROR, f"no message starts at physical offset {position}"
            ) from None
        qoff = applied.queue_offset(msg.topic, msg.queue_id, position)
        return _ok(cmd, body=encode_message_ext(msg, qoff, position, self.store_host))

    async def _query_message(
        self, cmd: RemotingCommand, conn: RemotingConnection, caller: Caller
    ) -> RemotingCommand:
        ext = cmd.ext_fields
        topic = F.text(ext, "topic", max_chars=F.MAX_TEXT_CHARS)
        key = F.text(ext, "key", max_chars=F.MAX_TEXT_CHARS)
        max_num = F.integer(ext, "maxNum", 1, F.INT32_MAX, 32)
        begin_ms = F.integer(ext, "beginTimestamp", 0, F.INT64_MAX, 0)
        end_ms = F.integer(ext, "endTimestamp", 0, F.INT64_MAX, 0)
        found = self.broker.lookups.by_key(
            topic, key, min(max_num, MAX_QUERY_NUM), begin_ms, end_ms
        )
        if not found:
            return cmd.response(
                ResponseCode.QUERY_NOT_FOUND, f"no message of {topic!r} has key {key!r}"
            )
        body = b"".join(
            encode_message_ext(f.message, f.queue_offset, f.position, self.store_host)
            for f in found
        )
        newest = max(f.message.store_timestamp_ms for f in found)
        last = max(f.position for f in found)
        ext_out = {"indexLastUpdateTimestamp": newest, "indexLastUpdatePhyoffset": last}
        return _ok(cmd, ext_out, body)


def _lock_request(
    body: bytes,
) -> tuple[str, str, list[tuple[str, int]], dict[tuple[str, int], object]]:
    """A LOCK_BATCH_MQ / UNLOCK_BATCH_MQ body: group, client id, the queues, and each queue's
    JSON as the client sent it (answered back as sent)."""
    data = F.json_body(body, "lock")
    group = F.json_text(data, "consumerGroup", "lock request")
    client_id = F.json_text(data, "clientId", "lock request")
    named: dict[tuple[str, int], object] = {}
    for mq in F.json_list(data.get("mqSet"), "mqSet", 4096):
        key = (
            F.json_text(mq, "topic", "messageQueue"),
            F.json_int(mq, "queueId", "messageQueue", 0, F.INT32_MAX),
        )
        named[key] = mq
    return group, client_id, list(named), named
