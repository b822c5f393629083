"""RocketMQ 5 clients' transactions on one node: the check-back on producers' Telemetry streams.

Every member applies the leader's check records (:mod:`broker.state.transactions`); each one
asks, for every half checked, one live producer of the half's topic among the Telemetry streams
open on this node, with a ``RecoverOrphanedTransactionCommand`` (the half message as the
producer sent it and its transaction id). The producer's checker answers with an
``EndTransaction``, which any node forwards to the leader. A client opens its stream to one
node of the group, so the member holding it is the one that asks; a check nobody here could
take is counted in :attr:`ProducerStreams.checks_unsent` (another member may hold the stream).

A check-back carries the half message (body, keys, properties) and lets its receiver end the
transaction, so it goes only to a stream whose user may ``Pub`` on the half's topic now (the
user's rights are asked again at each check: an ACL taken away since the Settings counts).

A stream's server-to-client commands wait in a bounded outbox that the stream's handler drains
between the client's own commands (:func:`merged`).
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import logging
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from broker.components.applied import AppliedMessages
from broker.frontends import rpcmap
from broker.frontends.v2 import stubs
from broker.frontends.v2.interceptor import ANONYMOUS, Caller
from broker.state.errors import BrokerError
from broker.state.transactions import PROPERTY_TRANSACTION_PREPARED, Half, transaction_id
from msgcodec import PROPERTY_REAL_QID, PROPERTY_REAL_TOPIC, Message

v2, v2_service, _ = stubs.load()

logger = logging.getLogger(__name__)

# Server commands waiting for one stream: a producer is asked about at most this many halves
# at once; beyond, the check goes to another producer of the topic here, or is counted unsent.
MAX_OUTBOX_COMMANDS = 256
# A check record older than this (by this node's clock) is a replay (a restart applying the
# log again, a member catching up): the producers were asked when it was new.
CHECK_REPLAY_MS = 60_000
_BROKER_PROPERTIES = (PROPERTY_REAL_TOPIC, PROPERTY_REAL_QID, PROPERTY_TRANSACTION_PREPARED)


@dataclass(eq=False, slots=True)
class Stream:
    """One open Telemetry stream: its client, the topics it publishes (a producer's Settings;
    empty for other clients) with their namespaces, and the outbox its handler drains."""

    client_id: str
    outbox: asyncio.Queue[Any] = field(default_factory=lambda: asyncio.Queue(MAX_OUTBOX_COMMANDS))
    topics: dict[str, str] = field(default_factory=dict)
    caller: Caller = ANONYMOUS  # the user of the Settings that registered the topics

    def may_end(self, topic: str) -> bool:
        """Whether the stream's user may end a transaction of ``topic`` (Pub on it)."""
        request = v2_service.EndTransactionRequest(topic=v2.Resource(name=topic))
        return self.caller.check(rpcmap.V2 + "EndTransaction", request) is None


class ProducerStreams:
    """The Telemetry streams open on this node, and the check-backs sent on them."""

    def __init__(self, applied: AppliedMessages, store_host: str) -> None:
        self.applied = applied
        self.store_host = store_host
        # Producers' streams by the topics they publish (a check looks up its topic only).
        self._by_topic: dict[str, set[Stream]] = {}
        self._turn = itertools.count()
        self.checks_sent = 0  # check-backs queued on a producer's stream, since start
        self.checks_unsent = 0  # check-backs no producer here could take
        applied.ctx.sm.txn.add_check_listener(self.on_checked)

    def open(self, client_id: str) -> Stream:
        return Stream(client_id)

    def close(self, stream: Stream) -> None:
        for topic in stream.topics:
            streams = self._by_topic.get(topic)
            if streams is not None:
                streams.discard(stream)
                if not streams:
                    del self._by_topic[topic]
        stream.topics = {}

    def publishing(self, stream: Stream, topics: Sequence[Any], caller: Caller = ANONYMOUS) -> None:
        """A producer's accepted Settings: the topics (v2 Resources) it publishes (a repeated
        Settings replaces them), for ``caller``'s user."""
        self.close(stream)
        stream.caller = caller
        stream.topics = {t.name: t.resource_namespace for t in topics}
        for topic in stream.topics:
            self._by_topic.setdefault(topic, set()).add(stream)

    def on_checked(self, halves: Sequence[Half]) -> None:
        """A check record applied here: ask one live producer of each half's topic."""
        now_ms = time.time() * 1000
        for half in halves:
            if now_ms - half.last_check_ms > CHECK_REPLAY_MS:
                continue
            if not self._ask(half):
                self.checks_unsent += 1

    def _ask(self, half: Half) -> bool:
        candidates = [s for s in self._by_topic.get(half.topic, ()) if s.may_end(half.topic)]
        if not candidates:
            return False
        try:
            message = self.applied.message(half.position, half.size)
        except BrokerError as exc:
            logger.warning("transaction check of %s skipped: %s", half.uniq_id, exc)
            return False
        first = next(self._turn)
        for n in range(len(candidates)):
            stream = candidates[(first + n) % len(candidates)]
            command = recover_command(half, message, stream.topics[half.topic], self.store_host)
            try:
                stream.outbox.put_nowait(command)
            except asyncio.QueueFull:
                continue
            self.checks_sent += 1
            return True
        return False


def recover_command(half: Half, m: Message, namespace: str, store_host: str) -> Any:
    """The check-back command for ``half`` (stored as ``m``): the message as its producer
    sent it (real topic and queue, user properties without the broker's), and its
    transaction id."""
    sp = v2.SystemProperties(
        keys=list(m.keys),
        message_id="01" + m.uniq_id,
        body_digest=v2.Digest(type=v2.MD5, checksum=hashlib.md5(m.body).hexdigest().upper()),
        body_encoding=v2.IDENTITY,
        message_type=v2.TRANSACTION,
        born_host=m.born_host,
        store_host=store_host,
        queue_id=half.queue_id,
    )
    sp.born_timestamp.FromMilliseconds(m.born_timestamp_ms)
    sp.store_timestamp.FromMilliseconds(m.store_timestamp_ms)
    if m.tags:
        sp.tag = m.tags
    props = {k: v for k, v in m.properties.items() if k not in _BROKER_PROPERTIES}
    message = v2.Message(
        topic=v2.Resource(resource_namespace=namespace, name=half.topic),
        user_properties=props,
        system_properties=sp,
        body=m.body,
    )
    return v2_service.TelemetryCommand(
        recover_orphaned_transaction_command=v2_service.RecoverOrphanedTransactionCommand(
            message=message, transaction_id=transaction_id(half.position)
        )
    )


async def merged(requests: AsyncIterator[Any], stream: Stream) -> AsyncIterator[tuple[Any, Any]]:
    """The client's commands and the server's queued ones, as they come: ``(command, None)``
    for one the client sent, ``(None, command)`` for one to send it. Ends with the client's
    side of the stream."""
    incoming = aiter(requests)
    read: asyncio.Future[Any] = asyncio.ensure_future(anext(incoming))
    push: asyncio.Future[Any] = asyncio.ensure_future(stream.outbox.get())
    try:
        while True:
            done, _ = await asyncio.wait({read, push}, return_when=asyncio.FIRST_COMPLETED)
            if push in done:
                yield None, push.result()
                push = asyncio.ensure_future(stream.outbox.get())
            if read in done:
                try:
                    command = read.result()
                except StopAsyncIteration:
                    return
                yield command, None
                read = asyncio.ensure_future(anext(incoming))
    finally:
        read.cancel()
        push.cancel()
