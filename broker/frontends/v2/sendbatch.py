"""Concurrent v2 sends of one user to one topic share one leader call and one log entry.

The official RocketMQ 5 clients send every message in a call of its own: sixteen threads of a
Python producer make sixteen ``SendMessage`` calls at once, each a leader operation, a forward
when the call came to a follower, and a log entry of one message. The raftmq client coalesces
on its side (``client.producer``); this does the same on the server's, for every client of the
v2 port. Per lane (topic, user, Super user or not), at most one leader call is in flight: a send
that finds its lane idle goes at once, on its own (no wait at one send in flight); sends that
arrive while a call is in flight queue and leave together in the next one, up to
:data:`MAX_BATCH_MESSAGES` messages and :data:`MAX_BATCH_BYTES` of bodies. Each send gets its
own results, in its own order.

What each send would have had alone is kept:

- Checks: every message was checked by the front end before it queued (its id, type,
  properties); the leader checks the batch's user again (the lane's user, the signature of one
  of its calls, all of that user, all to the same topic) and the sizes when it encodes.
- Errors: a batch that fails with an error that is not retryable (a message too large, a
  delivery time out of range, a body past the entry's limit) is split, and each of its sends
  tried alone, so a bad message fails only its own send. A retryable failure (no leader, the
  outcome unknown) is every send's answer, as it would have been.
- Retries: a send naming a message id of its lane (queued, or in the call in flight) is not
  queued: it goes at once, on its own, so the leader's in-flight deduplication answers a retry
  of a send it is still storing (``broker.components.sending``).
- Transactions: a half message goes alone (its own path on the leader).
- A send whose call ends (deadline, cancel) while it queues is left out of the next batch.

Bounded: :data:`MAX_LANES` lanes and :data:`MAX_QUEUED_SENDS` queued sends per lane; beyond
either, a send goes alone.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

from broker.components.leaderops import SendRequest
from broker.components.sending import OutgoingMessage
from broker.frontends.internal.forwarder import Failure, Origin
from broker.state.machine import SendResult
from broker.state.transactions import PROPERTY_TRANSACTION_PREPARED

# Messages and body bytes of one coalesced call: as the raftmq client's coalescing
# (client.producer), well under an entry's limit and the broker's 4 MiB message; a single send
# larger than that still goes, alone.
MAX_BATCH_MESSAGES = 512
MAX_BATCH_BYTES = 1 << 20
# Lanes (topic, user) with a call in flight at once: one per user and topic in use; past this a
# send goes alone rather than the table growing with hostile topic names.
MAX_LANES = 4096
# Sends waiting in one lane: the port's concurrent calls bound it already; this keeps one lane
# from holding an unbounded queue whatever the transport allows.
MAX_QUEUED_SENDS = 8192

Call = Callable[[SendRequest, Origin], Awaitable[list[SendResult]]]
_Key = tuple[str, str, bool]


@dataclass(slots=True)
class _Send:
    """One queued send: its messages, its call's origin, and where its results go."""

    messages: tuple[OutgoingMessage, ...]
    origin: Origin
    body_bytes: int
    done: asyncio.Future[list[SendResult]]


@dataclass(slots=True)
class _Lane:
    """One topic and user: the sends waiting, and the message ids queued or in flight."""

    queue: deque[_Send] = field(default_factory=deque)
    ids: set[str] = field(default_factory=set)


@dataclass(slots=True)
class SendStats:
    """What the coalescing did (counters since start): leader calls made for sends, and the
    sends they carried; splits of failed batches."""

    calls: int = 0
    sends: int = 0
    splits: int = 0


class SendBatcher:
    """Coalesces the v2 port's sends per (topic, user) into leader calls made by ``call``
    (:meth:`broker.frontends.internal.forwarder.Forwarder.call`)."""

    def __init__(self, call: Call) -> None:
        self._call = call
        self._lanes: dict[_Key, _Lane] = {}
        self._pumps: set[asyncio.Task[None]] = set()
        self.stats = SendStats()

    async def send(
        self, topic: str, messages: Sequence[OutgoingMessage], origin: Origin
    ) -> list[SendResult]:
        """``messages`` stored in ``topic`` as ``origin``'s user: one result per message."""
        msgs = tuple(messages)
        key = (topic, origin.user, origin.unbounded)
        lane = self._lanes.get(key)
        if lane is None:
            if len(self._lanes) >= MAX_LANES or _is_half(msgs):
                return await self._alone(topic, msgs, origin)
            lane = self._lanes[key] = _Lane()
            return await self._lead(key, lane, msgs, origin)
        if len(lane.queue) >= MAX_QUEUED_SENDS or _is_half(msgs) or _named(lane, msgs):
            return await self._alone(topic, msgs, origin)
        done: asyncio.Future[list[SendResult]] = asyncio.get_running_loop().create_future()
        lane.queue.append(_Send(msgs, origin, _body_bytes(msgs), done))
        lane.ids.update(m.msg_id for m in msgs)
        return await done

    async def close(self) -> None:
        """Stop the lanes' pumps (the port stops): a send still queued gets CancelledError."""
        for task in list(self._pumps):
            task.cancel()
        for task in list(self._pumps):
            with contextlib.suppress(BaseException):
                await task
        for lane in self._lanes.values():
            for s in lane.queue:
                s.done.cancel()
            lane.queue.clear()
        self._lanes.clear()

    async def _alone(
        self, topic: str, msgs: tuple[OutgoingMessage, ...], origin: Origin
    ) -> list[SendResult]:
        self.stats.calls += 1
        self.stats.sends += 1
        return await self._call(SendRequest(topic, msgs), origin)

    async def _lead(
        self, key: _Key, lane: _Lane, msgs: tuple[OutgoingMessage, ...], origin: Origin
    ) -> list[SendResult]:
        """The first send of an idle lane goes at once; what queued meanwhile leaves after it
        (on a task of its own: this send's answer does not wait for theirs)."""
        lane.ids.update(m.msg_id for m in msgs)
        try:
            return await self._alone(key[0], msgs, origin)
        finally:
            lane.ids.difference_update(m.msg_id for m in msgs)
            if lane.queue:
                task = asyncio.get_running_loop().create_task(self._pump(key, lane))
                self._pumps.add(task)
                task.add_done_callback(self._pumps.discard)
            elif self._lanes.get(key) is lane:  # (not when closed meanwhile)
                del self._lanes[key]

    async def _pump(self, key: _Key, lane: _Lane) -> None:
        """Send the lane's queue, one coalesced call at a time, until it is empty."""
        try:
            while batch := _take(lane):
                await self._carry(key[0], batch)
                for s in batch:
                    lane.ids.difference_update(m.msg_id for m in s.messages)
        finally:
            if self._lanes.get(key) is lane:
                del self._lanes[key]
            for s in lane.queue:  # only when cancelled (close): nobody sends them
                s.done.cancel()

    async def _carry(self, topic: str, batch: list[_Send]) -> None:
        """One call for ``batch``, each send answered with its own results; a batch that
        fails with an error that is not retryable is split into sends alone."""
        messages = tuple(m for s in batch for m in s.messages)
        self.stats.calls += 1
        self.stats.sends += len(batch)
        try:
            results = await self._call(SendRequest(topic, messages), batch[0].origin)
        except Failure as failure:
            if len(batch) > 1 and not failure.retryable:
                self.stats.splits += 1
                await self._split(topic, batch)
            else:
                _fail(batch, failure)
            return
        except Exception as exc:  # the call's own fault: every send's answer
            _fail(batch, exc)
            return
        at = 0
        for s in batch:
            n = len(s.messages)
            if not s.done.done():
                s.done.set_result(results[at : at + n])
            at += n

    async def _split(self, topic: str, batch: list[_Send]) -> None:
        for s in batch:
            if s.done.done():
                continue
            try:
                results = await self._alone(topic, s.messages, s.origin)
            except Exception as exc:
                _fail([s], exc)
            else:
                if not s.done.done():
                    s.done.set_result(results)


def _take(lane: _Lane) -> list[_Send]:
    """The next batch: the queue's live sends, in order, within the batch's bounds (the first
    always, whatever its size)."""
    batch: list[_Send] = []
    count = size = 0
    while lane.queue:
        s = lane.queue[0]
        if s.done.done():  # its call ended while it queued
            lane.queue.popleft()
            lane.ids.difference_update(m.msg_id for m in s.messages)
            continue
        count += len(s.messages)
        size += s.body_bytes
        if batch and (count > MAX_BATCH_MESSAGES or size > MAX_BATCH_BYTES):
            break
        batch.append(lane.queue.popleft())
    return batch


def _fail(batch: list[_Send], exc: Exception) -> None:
    for s in batch:
        if not s.done.done():
            s.done.set_exception(exc)
            s.done.exception()  # retrieved: its caller may have gone


def _named(lane: _Lane, msgs: tuple[OutgoingMessage, ...]) -> bool:
    """Whether a message id of ``msgs`` is queued or in flight in ``lane`` (a retry)."""
    return any(m.msg_id in lane.ids for m in msgs)


def _is_half(msgs: tuple[OutgoingMessage, ...]) -> bool:
    return any(PROPERTY_TRANSACTION_PREPARED in m.properties for m in msgs)


def _body_bytes(msgs: tuple[OutgoingMessage, ...]) -> int:
    return sum(len(m.body) for m in msgs)


__all__ = ["MAX_BATCH_BYTES", "MAX_BATCH_MESSAGES", "SendBatcher", "SendStats"]
