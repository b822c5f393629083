"""Concurrent v2 sends (and acks) of one user to one topic share one leader call.

The official RocketMQ 5 clients send every message in a call of its own, and ack every message
in a call of its own: sixteen threads of a Python producer make sixteen ``SendMessage`` calls at
once, each a leader operation, a forward when the call came to a follower, and a log entry of
one message; a push consumer's twenty consumption threads make twenty ``AckMessage`` calls, each
a replicated ack record. The raftmq client coalesces on its side (``client.producer``); this
does the same on the server's, for every client of the v2 port. Per lane (what the calls name:
a send's topic, an ack's group and topic; and the user, Super user or not), at most
:data:`MAX_LANE_CALLS` leader calls are in flight: a call that finds a free place goes at once,
on its own (no wait at one call in flight); calls that arrive while every place is taken queue
and leave together in the next one, up to ``max_items`` items (messages, receipt handles) and
``max_bytes`` of bodies. Each call gets its own results, in its own order.

What each call would have had alone is kept:

- Checks: every item was checked by the front end before it queued (a message's id, type,
  properties; an ack's group and topic names); the leader checks the batch's user again (the
  lane's user, the signature of one of its calls, all of that user, all naming the same topic
  and group) and a message's sizes when it encodes.
- Errors: a send batch that fails with an error that is not retryable (a message too large, a
  delivery time out of range, a body past the entry's limit) is split, and each of its calls
  tried alone, so a bad message fails only its own send (an ack answers per handle already: its
  call fails only as a whole, for reasons the same for every call of its lane). A retryable
  failure (no leader, the outcome unknown) is every call's answer, as it would have been.
- Retries: a call naming an item of its lane (a message id or a handle queued, or in the call
  in flight) is not queued: it goes at once, on its own, so the leader's in-flight
  deduplication answers a retry of a send it is still storing (``broker.components.sending``).
- Transactions: a half message goes alone (its own path on the leader).
- A call that ends (deadline, cancel) while it queues is left out of the next batch.

Bounded: :data:`MAX_LANES` lanes and :data:`MAX_QUEUED_CALLS` queued calls per lane; beyond
either, a call goes alone.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Awaitable, Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from broker.components.leaderops import AckRequest, LeaderRequest, SendRequest
from broker.components.sending import OutgoingMessage
from broker.frontends.internal.forwarder import Failure, Origin
from broker.state.machine import SendResult
from broker.state.popstate import MAX_RECORD_ITEMS
from broker.state.transactions import PROPERTY_TRANSACTION_PREPARED

# Messages and body bytes of one coalesced send: as the raftmq client's coalescing
# (client.producer), well under an entry's limit and the broker's 4 MiB message; a single send
# larger than that still goes, alone.
MAX_SEND_ITEMS = 512
MAX_SEND_BYTES = 1 << 20
# Receipt handles of one coalesced ack: what one ack record holds (broker.state.popstate).
MAX_ACK_ITEMS = MAX_RECORD_ITEMS
# Leader calls one lane keeps in flight: a second call goes at once beside the first (the Raft
# round takes both; a single place made the second wait a whole round, and a SimpleConsumer's
# few acks in flight paid that: 10-15% more CPU per message); what arrives while both are out
# queues and leaves together.
MAX_LANE_CALLS = 2
# Lanes with a call in flight at once: one per user and topic (group) in use; past this a call
# goes alone rather than the table growing with hostile names.
MAX_LANES = 4096
# Calls waiting in one lane: the port's concurrent calls bound it already; this keeps one lane
# from holding an unbounded queue whatever the transport allows.
MAX_QUEUED_CALLS = 8192

_I = TypeVar("_I")  # an item: a message, a receipt handle
_R = TypeVar("_R")  # an item's result
Call = Callable[[LeaderRequest[list[_R]], Origin], Awaitable[list[_R]]]
Make = Callable[[tuple[_I, ...]], LeaderRequest[list[_R]]]


@dataclass(slots=True)
class _Waiting(Generic[_I, _R]):
    """One queued call: its items, its origin, and where its results go."""

    items: tuple[_I, ...]
    origin: Origin
    body_bytes: int
    done: asyncio.Future[list[_R]]


@dataclass(slots=True)
class _Lane(Generic[_I, _R]):
    """One lane: how its requests are made, the calls waiting, the items queued or in flight."""

    make: Make[_I, _R]
    calls: int = 0  # leader calls in flight (its own calls' and its pumps')
    queue: deque[_Waiting[_I, _R]] = field(default_factory=deque)
    ids: set[str] = field(default_factory=set)


@dataclass(frozen=True, slots=True)
class Shape(Generic[_I]):
    """What a coalescer carries: an item's identity (for the retry rule), its body bytes,
    whether a call must go alone, the bounds of one batch and whether a failed batch is split."""

    ident: Callable[[_I], str]
    body_bytes: Callable[[_I], int]
    alone: Callable[[tuple[_I, ...]], bool]
    max_items: int
    max_bytes: int
    split: bool


@dataclass(slots=True)
class CoalesceStats:
    """What the coalescing did (counters since start): leader calls made, the front end's
    calls they carried, splits of failed batches."""

    calls: int = 0
    carried: int = 0
    splits: int = 0


class Coalescer(Generic[_I, _R]):
    """Coalesces the v2 port's calls per lane into leader calls made by ``call``
    (:meth:`broker.frontends.internal.forwarder.Forwarder.call`)."""

    def __init__(self, call: Call[_R], shape: Shape[_I]) -> None:
        self._call = call
        self.shape = shape
        self._lanes: dict[Hashable, _Lane[_I, _R]] = {}
        self._pumps: set[asyncio.Task[None]] = set()
        self.stats = CoalesceStats()

    async def run(
        self, what: Hashable, items: Sequence[_I], origin: Origin, make: Make[_I, _R]
    ) -> list[_R]:
        """The results of ``make(items)`` run as ``origin``'s user, one per item; ``what``
        names the lane (every call of a lane makes the same request of its items)."""
        its = tuple(items)
        key = (what, origin.user, origin.unbounded)
        lane = self._lanes.get(key)
        if lane is None:
            if len(self._lanes) >= MAX_LANES or self.shape.alone(its):
                return await self._alone(make, its, origin)
            lane = self._lanes[key] = _Lane(make)
        if self.shape.alone(its) or self._named(lane, its):
            return await self._alone(make, its, origin)
        if lane.calls < MAX_LANE_CALLS and not lane.queue:
            return await self._lead(key, lane, its, origin)
        if len(lane.queue) >= MAX_QUEUED_CALLS:
            return await self._alone(make, its, origin)
        done: asyncio.Future[list[_R]] = asyncio.get_running_loop().create_future()
        size = sum(self.shape.body_bytes(i) for i in its)
        lane.queue.append(_Waiting(its, origin, size, done))
        lane.ids.update(self.shape.ident(i) for i in its)
        return await done

    async def close(self) -> None:
        """Stop the lanes' pumps (the port stops): a call still queued gets CancelledError."""
        for task in list(self._pumps):
            task.cancel()
        for task in list(self._pumps):
            with contextlib.suppress(BaseException):
                await task
        for lane in self._lanes.values():
            for w in lane.queue:
                w.done.cancel()
            lane.queue.clear()
        self._lanes.clear()

    def _named(self, lane: _Lane[_I, _R], its: tuple[_I, ...]) -> bool:
        """Whether an item of ``its`` is queued or in flight in ``lane`` (a retry)."""
        return any(self.shape.ident(i) in lane.ids for i in its)

    async def _alone(self, make: Make[_I, _R], its: tuple[_I, ...], origin: Origin) -> list[_R]:
        self.stats.calls += 1
        self.stats.carried += 1
        return await self._call(make(its), origin)

    async def _lead(
        self, key: Hashable, lane: _Lane[_I, _R], its: tuple[_I, ...], origin: Origin
    ) -> list[_R]:
        """A call that finds a free place in its lane goes at once; what queued meanwhile
        leaves after it (on a task of its own: this call's answer does not wait for theirs)."""
        ident = self.shape.ident
        lane.ids.update(ident(i) for i in its)
        lane.calls += 1
        try:
            return await self._alone(lane.make, its, origin)
        finally:
            lane.calls -= 1
            lane.ids.difference_update(ident(i) for i in its)
            self._next(key, lane)

    def _next(self, key: Hashable, lane: _Lane[_I, _R]) -> None:
        """After a call of ``lane`` ended: a pump for what queued, or the idle lane forgotten."""
        if lane.queue and lane.calls < MAX_LANE_CALLS:
            lane.calls += 1  # the pump's place
            task = asyncio.get_running_loop().create_task(self._pump(key, lane))
            self._pumps.add(task)
            task.add_done_callback(self._pumps.discard)
        elif not lane.queue and not lane.calls and self._lanes.get(key) is lane:
            del self._lanes[key]  # (not when closed meanwhile)

    async def _pump(self, key: Hashable, lane: _Lane[_I, _R]) -> None:
        """Send the lane's queue, one coalesced call at a time, until it is empty."""
        ident = self.shape.ident
        try:
            while batch := self._take(lane):
                await self._carry(lane, batch)
                for w in batch:
                    lane.ids.difference_update(ident(i) for i in w.items)
        finally:
            lane.calls -= 1
            if not lane.calls and self._lanes.get(key) is lane:
                del self._lanes[key]
            if self._lanes.get(key) is not lane:  # closed: nobody sends what is left
                for w in lane.queue:
                    w.done.cancel()

    def _take(self, lane: _Lane[_I, _R]) -> list[_Waiting[_I, _R]]:
        """The next batch: the queue's live calls, in order, within the batch's bounds (the
        first always, whatever its size)."""
        batch: list[_Waiting[_I, _R]] = []
        count = size = 0
        while lane.queue:
            w = lane.queue[0]
            if w.done.done():  # its call ended while it queued
                lane.queue.popleft()
                lane.ids.difference_update(self.shape.ident(i) for i in w.items)
                continue
            count += len(w.items)
            size += w.body_bytes
            if batch and (count > self.shape.max_items or size > self.shape.max_bytes):
                break
            batch.append(lane.queue.popleft())
        return batch

    async def _carry(self, lane: _Lane[_I, _R], batch: list[_Waiting[_I, _R]]) -> None:
        """One call for ``batch``, each call answered with its own results; a batch that
        fails with an error that is not retryable is split into calls alone (when the shape
        says so)."""
        items = tuple(i for w in batch for i in w.items)
        self.stats.calls += 1
        self.stats.carried += len(batch)
        try:
            results = await self._call(lane.make(items), batch[0].origin)
        except Failure as failure:
            if len(batch) > 1 and self.shape.split and not failure.retryable:
                self.stats.splits += 1
                await self._split(lane, batch)
            else:
                _fail(batch, failure)
            return
        except Exception as exc:  # the call's own fault: every call's answer
            _fail(batch, exc)
            return
        at = 0
        for w in batch:
            n = len(w.items)
            if not w.done.done():
                w.done.set_result(results[at : at + n])
            at += n

    async def _split(self, lane: _Lane[_I, _R], batch: list[_Waiting[_I, _R]]) -> None:
        for w in batch:
            if w.done.done():
                continue
            try:
                results = await self._alone(lane.make, w.items, w.origin)
            except Exception as exc:
                _fail([w], exc)
            else:
                if not w.done.done():
                    w.done.set_result(results)


def _fail(batch: Sequence[_Waiting[_I, _R]], exc: Exception) -> None:
    for w in batch:
        if not w.done.done():
            w.done.set_exception(exc)
            w.done.exception()  # retrieved: its caller may have gone


def _is_half(msgs: tuple[OutgoingMessage, ...]) -> bool:
    return any(PROPERTY_TRANSACTION_PREPARED in m.properties for m in msgs)


SEND_SHAPE: Shape[OutgoingMessage] = Shape(
    ident=lambda m: m.msg_id,
    body_bytes=lambda m: len(m.body),
    alone=_is_half,
    max_items=MAX_SEND_ITEMS,
    max_bytes=MAX_SEND_BYTES,
    split=True,
)
ACK_SHAPE: Shape[str] = Shape(
    ident=lambda handle: handle,
    body_bytes=lambda handle: 0,
    alone=lambda handles: False,
    max_items=MAX_ACK_ITEMS,
    max_bytes=0,  # no bodies: only the count bounds a batch
    split=False,
)


class Coalescers:
    """The v2 port's coalescers: sends (per topic and user) and acks (per group, topic and
    user)."""

    def __init__(self, call: Callable[[LeaderRequest[Any], Origin], Awaitable[Any]]) -> None:
        self.sends: Coalescer[OutgoingMessage, SendResult] = Coalescer(call, SEND_SHAPE)
        self.acks: Coalescer[str, str] = Coalescer(call, ACK_SHAPE)

    async def send(
        self, topic: str, messages: Sequence[OutgoingMessage], origin: Origin
    ) -> list[SendResult]:
        """``messages`` stored in ``topic`` as ``origin``'s user: one result per message."""

        def make(ms: tuple[OutgoingMessage, ...]) -> SendRequest:
            return SendRequest(topic, ms)

        return await self.sends.run(topic, messages, origin, make)

    async def ack(
        self, group: str, topic: str, handles: Sequence[str], origin: Origin
    ) -> list[str]:
        """``handles`` acknowledged for ``group``: per handle "" or the error's stable code."""

        def make(hs: tuple[str, ...]) -> AckRequest:
            return AckRequest(group, topic, hs)

        return await self.acks.run((group, topic), handles, origin, make)

    async def close(self) -> None:
        await self.sends.close()
        await self.acks.close()


__all__ = ["ACK_SHAPE", "SEND_SHAPE", "CoalesceStats", "Coalescer", "Coalescers", "Shape"]
