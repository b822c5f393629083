"""The producer: sync, async, one-way and batch sends over the broker's gRPC API.

Each message gets its uniq id (32 uppercase hex) before the first attempt and keeps it on
every retry, so a resend of a message whose first outcome is unknown is deduplicated by the
broker group that stored it. A send is reported successful only from the broker's OK answer,
which the leader gives after the entry is on a majority of the group.

Retries: one mechanism, driven by the broker's structured error (``MQClientError`` fields).
Within an attempt, ``RouteClient.call_leader`` follows NOT_LEADER redirects to the leader the
error names and waits out elections. A failed attempt whose error is ``retryable`` is retried
``retry_times_when_send_failed`` times (:meth:`Producer._send`, sync and async sends alike),
after the error's ``retry_after_ms`` (at least ``RETRY_WAIT_S``), each on another broker group
when the topic has one (RocketMQ's behaviour; a message whose first outcome was unknown may
then be stored by two groups). Sends through a ``MessageQueueSelector`` (ordered messages) are
retried on the same queue only. A leader refusing writes for a reason that outlasts a send
(``DISK_FULL``: its disk is over the mark) is never retried in its group: the send moves to
another group when the topic has one, or fails at once with ``DISK_FULL`` (docs/CLIENT.md).

Coalescing: sends to one broker group share RPCs. At most ``MAX_INFLIGHT_PER_GROUP`` (1) SendMessage
calls per group are in flight; sends that arrive meanwhile wait and leave together in the next
call (up to ``MAX_COALESCE_MESSAGES`` messages / ``MAX_COALESCE_BYTES``), so many threads or async
sends cost a few RPCs and a few log entries rather than one each. Each caller's messages keep
their own queue; each caller gets its own results. A coalesced call that fails with a
non-retryable error is split and every caller's messages are sent alone, so one bad message
fails only its own send.

Threads: the calls are blocking gRPC calls made by the producer's sender threads
(:mod:`client.senders`: made when needed, kept while busy, so no thread is started per call),
one per group with a call in flight. The sender that gets an answer hands the group's next call
on, completes the call's sends and runs ``send_async``'s callbacks (one at a time, in the order
the answers came, whichever thread runs them); a send a callback issues leaves from that same
thread once the callbacks are over, with everything else they sent to the group. ``send`` holds
its caller's thread, ``send_async`` none. Redirects, leader searches and splits run on the
sender; the retries of async sends on a small executor.
"""

from __future__ import annotations

import hashlib
import itertools
import logging
import random
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Protocol

import grpc
from raftmq.broker.v1 import broker_pb2 as pb
from raftmq.broker.v1 import broker_pb2_grpc as bpb_grpc

from client.errors import MQClientError
from client.heartbeat import PRODUCER_HEARTBEAT_INTERVAL_S, ProducerHeartbeats
from client.message import (
    Message,
    MessageQueue,
    SendResult,
    local_host,
    new_client_id,
    new_msg_id,
)
from client.route import POLL_NAME_SERVER_INTERVAL_S, ChannelPool, RouteClient, retry_wait_s
from client.senders import Senders
from mqerrors import codes as E
from mqsecurity.channels import PLAINTEXT, ClientSecurity

log = logging.getLogger(__name__)

# RocketMQ's pollNameServerInterval (a cached route's age before it is asked again; a group
# added to the cluster is sent to from then on): at least 100 ms, not to hammer NameServers.
MIN_POLL_NAME_SERVER_INTERVAL_S = 0.1
MAX_POLL_S = 3600.0
# RocketMQ's sendMsgTimeout: one attempt, redirects and waiting for a new leader included.
SEND_MSG_TIMEOUT_S = 3.0
# RocketMQ's retryTimesWhenSendFailed.
RETRY_TIMES_WHEN_SEND_FAILED = 2
# Between retries (a new leader is usually elected within a second or two).
RETRY_WAIT_S = 0.2
# Threads for the retries of async sends (each sleeps RETRY_WAIT_S first). Made only when
# needed.
ASYNC_SEND_THREADS = 64
# Sender threads: they make the SendMessage calls (blocking calls; redirects, leader searches
# and splits included), one call per group at a time (MAX_INFLIGHT_PER_GROUP), so a producer
# uses about one per broker group and topic it sends to at once. Made only when needed; the
# bound is for a producer sending to many topics of many groups while leaders are down (each
# call then waits up to its timeout): beyond it, calls wait for a free sender.
SENDER_THREADS = 64
# A sender idle this long exits: long against the gap between a busy producer's calls (a
# thread start per call is the cost senders exist to avoid), short enough that a producer
# that stopped sending soon holds no sender.
SENDER_IDLE_S = 30.0
# Sends issued by send_async callbacks wait for the callbacks being run to be over (so that
# they leave together, from the thread running them) at most this long; a slow callback does
# not hold back the sends before it longer.
CALLBACKS_DEFER_S = 0.002
# What shutdown waits beyond the sends' own timeouts.
SHUTDOWN_SLACK_S = 5.0
# At most this many async/one-way sends in flight; send_async blocks beyond (back pressure).
ASYNC_MAX_PENDING = 1024
# The round robin's first queue is drawn from [0, RR_START_SPAN): any span that is a multiple of
# every usual queue count spreads starts evenly; 2**20 is far beyond any topic's queues.
RR_START_SPAN = 1 << 20
# RocketMQ's maxMessageSize default (4 MiB); checked again by the broker.
MAX_BATCH_MESSAGES = 1024

# Coalescing, per broker group: SendMessage calls in flight at once, and the size of one
# coalesced call (well under the broker's 4 MiB message and per-entry limits). A call costs the
# leader far more than a message does (gRPC, Raft, replication, fsync wake-ups), so one call in
# flight, carrying everything that queued meanwhile, beat four: mqbench, 1 KiB, 16 / 256 in
# flight, ASYNC_FLUSH 538 -> 1,033 / 2,895 -> 4,006 msg/s, SYNC_FLUSH 2,243 -> 2,506 at 256.
MAX_INFLIGHT_PER_GROUP = 1
# MessageQueue objects kept for send results (one per topic, group and queue id in use).
MAX_CACHED_QUEUES = 4096
MAX_COALESCE_MESSAGES = 512
MAX_COALESCE_BYTES = 1 << 20
# RocketMQ's producer keeps away from a broker that just failed (sendLatencyFaultEnable). Ours
# keeps away from a group whose leader refused writes (DISK_FULL) for this long while the topic
# has another writable group, so sends stop paying a refused call each; then the next send that
# picks it probes it again (a refusal still only moves that send). A freed disk is written to
# again within this bound. One entry per group at most.
FULL_GROUP_AVOID_S = 10.0


class MessageQueueSelector(Protocol):
    """Picks the queue for a message (ordered messages: the same ``arg``, the same queue)."""

    def select(self, queues: Sequence[MessageQueue], msg: Message, arg: Any) -> MessageQueue: ...


class SelectMessageQueueByHash:
    """``queues[hash(arg) % len(queues)]`` with a stable hash (same in every process)."""

    def select(self, queues: Sequence[MessageQueue], msg: Message, arg: Any) -> MessageQueue:
        digest = hashlib.md5(str(arg).encode(), usedforsecurity=False).digest()
        return queues[int.from_bytes(digest[:8], "big") % len(queues)]


class _PendingSend:
    """One caller's messages waiting in a group's coalescing queue. ``on_done(results, error)``
    runs once, on the thread that got the broker's answer: it must not block."""

    __slots__ = ("mq", "on_done", "pbs", "size")

    def __init__(
        self,
        mq: MessageQueue,
        pbs: list[pb.Message],
        size: int,
        on_done: Callable[[list[SendResult] | None, BaseException | None], None],
    ) -> None:
        self.mq = mq
        self.pbs = pbs
        # The bodies' bytes, from the caller's messages: reading ``body`` of a protobuf
        # message copies it.
        self.size = size
        self.on_done = on_done


class _Outcome:
    """What a synchronous caller waits for."""

    __slots__ = ("error", "event", "results")

    def __init__(self) -> None:
        self.event = threading.Event()
        self.results: list[SendResult] | None = None
        self.error: BaseException | None = None

    def __call__(self, results: list[SendResult] | None, error: BaseException | None) -> None:
        self.results, self.error = results, error
        self.event.set()


# An async send's outcome waiting for its callbacks to run: settle(result, error).
_Settle = tuple[
    Callable[[SendResult | None, BaseException | None], None],
    SendResult | None,
    BaseException | None,
]


class _GroupQueue:
    __slots__ = ("broker_name", "inflight", "topic", "waiting")

    def __init__(self, topic: str, broker_name: str) -> None:
        self.topic = topic
        self.broker_name = broker_name
        self.inflight = 0
        self.waiting: deque[_PendingSend] = deque()


class Producer:
    """``Producer(group, namesrv_addr)``; ``start()``, then ``send``/``send_async``/
    ``send_oneway``/``send_batch``; ``shutdown()`` (or use it as a context manager).
    ``security``: TLS and the credentials that sign every call (default: plaintext,
    anonymous), for the NameServers and the broker nodes alike."""

    def __init__(
        self,
        group: str,
        namesrv_addr: str,
        *,
        send_msg_timeout_s: float = SEND_MSG_TIMEOUT_S,
        retry_times_when_send_failed: int = RETRY_TIMES_WHEN_SEND_FAILED,
        security: ClientSecurity = PLAINTEXT,
        poll_name_server_interval_s: float = POLL_NAME_SERVER_INTERVAL_S,
        heartbeat_interval_s: float = PRODUCER_HEARTBEAT_INTERVAL_S,
        client_id: str = "",
    ) -> None:
        if not MIN_POLL_NAME_SERVER_INTERVAL_S <= poll_name_server_interval_s <= MAX_POLL_S:
            raise MQClientError(
                E.INVALID_ARGUMENT,
                "INVALID_ARGUMENT",
                f"poll_name_server_interval_s {poll_name_server_interval_s} is outside "
                f"[{MIN_POLL_NAME_SERVER_INTERVAL_S}, {MAX_POLL_S}]",
            )
        self.poll_name_server_interval_s = poll_name_server_interval_s
        self.group = group
        self.namesrv_addr = namesrv_addr
        self.send_msg_timeout_s = send_msg_timeout_s
        self.retry_times_when_send_failed = retry_times_when_send_failed
        self._channels = ChannelPool(security)
        self._routes: RouteClient | None = None
        self._executor: ThreadPoolExecutor | None = None
        # Async and one-way sends not yet answered, at most ASYNC_MAX_PENDING (back pressure).
        # Entered through the bare lock (a C call) on every send; the Condition only to wait.
        self._slot_lock = threading.Lock()
        self._slots = threading.Condition(self._slot_lock)
        self._async_pending = 0
        self._slot_waiters = 0
        # Round robin from a random queue (as RocketMQ's clients start): from queue 0, many
        # short-lived producers sending a few messages each would all pile onto the first
        # queue and the first broker group.
        self._rr = itertools.count(random.randrange(RR_START_SPAN))
        self._full_lock = threading.Lock()
        self._full_until: dict[str, float] = {}  # group -> monotonic end of its avoidance
        self._born_host = local_host()
        self._coalesce_lock = threading.Lock()
        self._idle = threading.Condition(self._coalesce_lock)
        self._outstanding = 0  # sends submitted and not yet completed
        self._groups: dict[tuple[str, str], _GroupQueue] = {}
        self._queues: dict[tuple[str, str, int], MessageQueue] = {}  # results share them
        # send_async's callbacks, run one at a time in the order the answers came, by the
        # thread that found none running (_settle_later).
        self._callback_lock = threading.Lock()
        self._callbacks_done = threading.Condition(self._callback_lock)
        self._callbacks: deque[_Settle] = deque()
        self._running_callbacks = False
        self._callback_runner = threading.local()  # .active: this thread runs callbacks
        self._senders = Senders("producer-sender", SENDER_THREADS, SENDER_IDLE_S)
        # RocketMQ's ip@instance: who this producer is in producerConnection.
        self.client_id = client_id or new_client_id(self._born_host)
        self._heartbeats = ProducerHeartbeats(
            group, self.client_id, self._channels, lambda: self._routes, heartbeat_interval_s
        )

    def start(self) -> None:
        if self._routes is not None:
            return
        self._routes = RouteClient(
            self.namesrv_addr, self._channels, self.poll_name_server_interval_s
        )
        self._executor = ThreadPoolExecutor(ASYNC_SEND_THREADS, thread_name_prefix="producer")
        self._senders = Senders("producer-sender", SENDER_THREADS, SENDER_IDLE_S)
        self._heartbeats.start()

    def shutdown(self) -> None:
        """Waits for the sends in flight (their callbacks included), then closes every
        channel. Bounded: a send gives up after its attempts' timeouts."""
        if self._executor is not None:
            bound_s = (self.send_msg_timeout_s + RETRY_WAIT_S) * (
                self.retry_times_when_send_failed + 1
            ) + SHUTDOWN_SLACK_S
            self._wait_idle(bound_s)
            self._executor.shutdown(wait=True)  # retries in progress
            self._executor = None
            self._wait_idle(bound_s)
            self._senders.close(SHUTDOWN_SLACK_S)
            self._wait_callbacks(SHUTDOWN_SLACK_S)
        self._heartbeats.stop()
        self._channels.close()
        self._routes = None

    def _wait_callbacks(self, timeout_s: float) -> None:
        """Until the callbacks of answered sends have run (not from a callback: it is one)."""
        if getattr(self._callback_runner, "active", False):
            return
        with self._callbacks_done:
            if not self._callbacks_done.wait_for(
                lambda: not self._running_callbacks and not self._callbacks, timeout_s
            ):
                log.warning("shutdown: %d send callbacks still to run", len(self._callbacks))

    def _wait_idle(self, timeout_s: float) -> None:
        self._senders.release_deferred()  # from a callback: its sends must leave to end
        with self._idle:
            if not self._idle.wait_for(lambda: self._outstanding == 0, timeout_s):
                log.warning("shutdown: %d sends still unanswered", self._outstanding)

    def __enter__(self) -> Producer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    def _route_client(self) -> RouteClient:
        if self._routes is None:
            raise MQClientError.local(E.NOT_STARTED, "call start() first")
        return self._routes

    # -- queue choice ---------------------------------------------------------------------------

    def _pick_queue(self, topic: str, avoid: str) -> MessageQueue:
        """Round robin over the topic's writable queues, past ``avoid`` (the group this send
        just failed on) and past groups that refused writes lately, while another is left."""
        queues = self._route_client().get_route(topic).write_queue_tuple()
        if not queues:
            raise MQClientError.local(E.NO_ROUTE, f"no writable queue for {topic}")
        start = next(self._rr)
        full = self._full_groups() if self._full_until else ()
        second: MessageQueue | None = None
        for i in range(len(queues)):
            mq = queues[(start + i) % len(queues)]
            if mq.broker_name == avoid:
                continue
            if mq.broker_name not in full:
                return mq
            second = second or mq
        return second or queues[start % len(queues)]

    def _full_groups(self) -> frozenset[str]:
        """The groups whose leader refused writes less than FULL_GROUP_AVOID_S ago."""
        now = time.monotonic()
        with self._full_lock:
            for group in [g for g, until in self._full_until.items() if until <= now]:
                del self._full_until[group]
            return frozenset(self._full_until)

    def _mark_full(self, group: str) -> None:
        with self._full_lock:
            self._full_until[group] = time.monotonic() + FULL_GROUP_AVOID_S

    def _send_once(self, mq: MessageQueue, msgs: Sequence[Message]) -> list[SendResult]:
        """One attempt, coalesced with other callers' sends to the same group."""
        outcome = _Outcome()
        self._submit(
            _PendingSend(
                mq,
                [m.to_pb(mq.queue_id, self.group, self._born_host) for m in msgs],
                sum(len(m.body) for m in msgs),
                outcome,
            )
        )
        # Called from a callback, this thread may hold deferred calls (Senders.hand_after):
        # they leave now, as this one may wait behind them.
        self._senders.release_deferred()
        outcome.event.wait()
        if outcome.error is not None:
            raise outcome.error
        assert outcome.results is not None
        return outcome.results

    # -- coalescing -----------------------------------------------------------------------------
    #
    # A send joins its group's queue. When the group has no call in flight, the send takes the
    # group's slot and hands the call to a sender thread (client/senders.py), which takes
    # everything queued by then and makes one blocking call: to the known leader, or with
    # redirects and leader search. With the answer the sender hands the group's next call (if
    # sends queued meanwhile) to another sender, then completes the call's sends, running
    # send_async's callbacks itself when no other thread is running them. A send issued by such
    # a callback is deferred (Senders.hand_after) until the callbacks are over and then leaves
    # from the same thread with everything the callbacks sent: a chain of sends costs no
    # thread wake-up, and no thread start, per send.

    def _submit(self, pending: _PendingSend, deferrable: bool = False) -> None:
        """Queues ``pending``; starts the group's call when none is in flight. ``deferrable``:
        the caller does not wait for the answer (an async send), so a call started from a
        callback may wait for the callbacks to be over (Senders.hand_after)."""
        key = (pending.mq.topic, pending.mq.broker_name)
        with self._coalesce_lock:
            gq = self._groups.get(key)
            if gq is None:
                gq = self._groups[key] = _GroupQueue(*key)
            gq.waiting.append(pending)
            self._outstanding += 1
            if gq.inflight >= MAX_INFLIGHT_PER_GROUP:
                return
            gq.inflight += 1
        if deferrable:
            self._senders.hand_after(self._call_next, gq)
        else:
            self._senders.hand(self._call_next, gq)

    @staticmethod
    def _take(gq: _GroupQueue) -> list[_PendingSend]:
        """The next call's sends (the coalescing lock is held)."""
        first = gq.waiting.popleft()
        batch = [first]
        count, size = len(first.pbs), first.size
        while gq.waiting:
            nxt = gq.waiting[0]
            count, size = count + len(nxt.pbs), size + nxt.size
            if count > MAX_COALESCE_MESSAGES or size > MAX_COALESCE_BYTES:
                break
            batch.append(gq.waiting.popleft())
        return batch

    def _next_call(self, gq: _GroupQueue) -> None:
        """The call of ``gq`` in flight is over: hand on the next one, or free the slot."""
        with self._coalesce_lock:
            if not gq.waiting:
                gq.inflight -= 1
                return
        self._senders.hand(self._call_next, gq)

    def _call_next(self, gq: _GroupQueue) -> None:
        """On a sender thread holding ``gq``'s slot: one call of what is queued now."""
        with self._coalesce_lock:
            assert gq.inflight > 0 and gq.waiting, (gq.inflight, len(gq.waiting))
            batch = self._take(gq)
        self._call(gq, batch)

    def _call(self, gq: _GroupQueue, batch: list[_PendingSend]) -> None:
        """On a sender thread: one coalesced call, answered (:meth:`_finish`) or failed. A
        blocking call to the known leader; when none is known, or its answer is a retryable
        failure (a redirect, an election, a dead node, a busy leader), the call with redirects
        and leader search for what is left of the send's timeout."""
        pbs = [m for p in batch for m in p.pbs]
        deadline = time.monotonic() + self.send_msg_timeout_s
        try:
            answer = self._ask_known_leader(gq, pbs)
            if isinstance(answer, pb.SendMessageResponse):
                # A bad answer fails the call as it is (resending each caller's part would
                # store what may be stored already).
                self._finish_parsed(gq, batch, answer, len(pbs))
                return
            results = self._call_searching(gq, pbs, deadline, answer)
        except MQClientError as exc:  # refused, or no answer within the timeout
            self._fail_or_split(gq, batch, exc)
            return
        except BaseException as exc:  # the channel pool was closed under us (shutdown)
            self._finish(gq, batch, None, exc)
            return
        self._finish(gq, batch, results, None)

    def _finish_parsed(
        self, gq: _GroupQueue, batch: list[_PendingSend], resp: pb.SendMessageResponse, n: int
    ) -> None:
        try:
            results = self._results(gq.topic, gq.broker_name, resp, n)
        except MQClientError as exc:
            self._finish(gq, batch, None, exc)
            return
        self._finish(gq, batch, results, None)

    def _ask_known_leader(
        self, gq: _GroupQueue, pbs: list[pb.Message]
    ) -> pb.SendMessageResponse | MQClientError | None:
        """The answer of the group's known leader, its retryable failure (learnt from), or
        None when no leader is known. A failure that is not retryable is raised."""
        routes = self._route_client()
        addr = routes.known_leader(gq.broker_name)
        if not addr:
            return None
        request = pb.SendMessageRequest(topic=gq.topic, messages=pbs)
        try:
            resp: pb.SendMessageResponse = self._channels.broker(addr).SendMessage(
                request, timeout=self.send_msg_timeout_s
            )
        except grpc.RpcError as exc:
            err = MQClientError.from_rpc(exc)
            if not err.retryable or err.group_refuses_writes:
                raise err from None
            routes.learn_from_error(gq.broker_name, err, addr)
            return err
        return resp

    def _call_searching(
        self,
        gq: _GroupQueue,
        pbs: list[pb.Message],
        deadline: float,
        after: MQClientError | None,
    ) -> list[SendResult]:
        """The call with redirects and leader search; ``after``: the known leader's retryable
        failure, whose retry hint is waited out first."""
        if after is not None and after.retry_after_ms:
            time.sleep(min(retry_wait_s(after, 0.0), max(deadline - time.monotonic(), 0.0)))
        try:
            return self._call_send(
                gq.topic, gq.broker_name, pbs, max(deadline - time.monotonic(), 0.05)
            )
        except MQClientError as exc:
            raise exc.marked_unknown(after is not None and after.outcome_unknown) from None

    def _fail_or_split(
        self, gq: _GroupQueue, batch: list[_PendingSend], exc: MQClientError
    ) -> None:
        if len(batch) > 1 and not exc.retryable:
            # One bad message must fail only its own send: each caller's messages alone.
            self._split(gq, batch)
            return
        self._finish(gq, batch, None, exc)

    def _split(self, gq: _GroupQueue, batch: list[_PendingSend]) -> None:
        outcomes: list[tuple[_PendingSend, list[SendResult] | None, BaseException | None]] = []
        for p in batch:
            try:
                mine = self._call_send(gq.topic, gq.broker_name, p.pbs, self.send_msg_timeout_s)
            except BaseException as exc:
                outcomes.append((p, None, exc))
            else:
                outcomes.append((p, mine, None))
        self._next_call(gq)
        for p, results, error in outcomes:
            self._complete(p, results, error)
        self._run_callbacks()

    def _finish(
        self,
        gq: _GroupQueue,
        batch: list[_PendingSend],
        results: list[SendResult] | None,
        error: BaseException | None,
    ) -> None:
        self._next_call(gq)  # first: the next call is on the wire while we hand out answers
        at = 0
        for p in batch:
            n = len(p.pbs)
            self._complete(p, None if results is None else results[at : at + n], error)
            at += n
        self._run_callbacks()  # after the sends are complete (a callback may shut down)

    def _complete(
        self,
        p: _PendingSend,
        results: list[SendResult] | None,
        error: BaseException | None,
    ) -> None:
        try:
            p.on_done(results, error)
        except Exception:
            log.exception("send completion failed")
        with self._coalesce_lock:
            self._outstanding -= 1
            if self._outstanding == 0:
                self._idle.notify_all()

    def _in_background(self, fn: Callable[..., None], *args: Any) -> None:
        """Runs a rare, blocking path on the executor (a thread of its own once it is shut
        down, so that no send is ever left without an answer)."""
        executor = self._executor
        if executor is not None:
            try:
                executor.submit(fn, *args)
                return
            except RuntimeError:  # shut down meanwhile
                pass
        threading.Thread(target=fn, args=args, daemon=True).start()

    def _message_queue(self, topic: str, broker_name: str, queue_id: int) -> MessageQueue:
        """One shared ``MessageQueue`` per queue for the results (a bounded cache)."""
        key = (topic, broker_name, queue_id)
        mq = self._queues.get(key)
        if mq is None:
            if len(self._queues) >= MAX_CACHED_QUEUES:
                self._queues.clear()
            mq = self._queues[key] = MessageQueue(*key)
            self._heartbeats.note(topic)  # a topic new to this producer: its groups hear of it
        return mq

    def _results(
        self, topic: str, broker_name: str, resp: pb.SendMessageResponse, n: int
    ) -> list[SendResult]:
        """The results of a send answer (packed columns, one element per message), checked
        whole."""
        msg_ids = resp.packed_msg_ids
        queue_ids = resp.packed_queue_ids
        offsets = resp.packed_queue_offsets
        positions = resp.packed_positions
        duplicates = resp.packed_duplicates
        prefix = resp.offset_msg_id_prefix
        lengths = {len(msg_ids), len(queue_ids), len(offsets), len(positions), len(duplicates)}
        if lengths != {n} or len(prefix) != 16:
            raise MQClientError(
                E.BAD_RESPONSE,
                "INTERNAL",
                f"packed answer for {n} messages has columns of {sorted(lengths)} and an "
                f"offset msg id prefix of {len(prefix)} characters",
            )
        if min(positions) < 0:
            raise MQClientError(
                E.BAD_RESPONSE, "INTERNAL", f"negative commitlog position {min(positions)}"
            )
        mq_of = self._message_queue
        return [
            SendResult(
                msg_id,
                f"{prefix}{position:016X}",
                mq_of(topic, broker_name, queue_id),
                offset,
                position,
                duplicate,
            )
            for msg_id, queue_id, offset, position, duplicate in zip(
                msg_ids, queue_ids, offsets, positions, duplicates, strict=True
            )
        ]

    def _call_send(
        self, topic: str, broker_name: str, pbs: list[pb.Message], timeout_s: float
    ) -> list[SendResult]:
        routes = self._route_client()
        request = pb.SendMessageRequest(topic=topic, messages=pbs)

        def call(stub: bpb_grpc.BrokerStub, rpc_timeout_s: float) -> pb.SendMessageResponse:
            resp: pb.SendMessageResponse = stub.SendMessage(request, timeout=rpc_timeout_s)
            return resp

        resp = routes.call_leader(topic, broker_name, call, timeout_s)
        return self._results(topic, broker_name, resp, len(pbs))

    def _note_failure(self, mq: MessageQueue, exc: MQClientError) -> None:
        """Log a failed attempt; a route that named a missing topic is fetched afresh."""
        log.warning(
            "send topic=%s group=%s queue=%d failed: %s",
            mq.topic,
            mq.broker_name,
            mq.queue_id,
            exc,
        )
        if exc.status == "NOT_FOUND":
            self._route_client().invalidate(mq.topic)
        if exc.group_refuses_writes:
            self._mark_full(mq.broker_name)

    def _send(
        self,
        msgs: Sequence[Message],
        pick: Callable[[str], MessageQueue],
        retries: int,
        after: MQClientError | None = None,
        failed_group: str = "",
    ) -> list[SendResult]:
        """One attempt and up to ``retries`` more while the error is retryable, each after the
        error's retry hint (at least ``RETRY_WAIT_S``); ``after``: the failure of an attempt
        made elsewhere (the async path's first, on ``failed_group``), waited out before the
        first attempt here. A group that refuses writes (``DISK_FULL``) is not asked again:
        the send moves to another group, or fails at once when the topic has none."""
        if not msgs:
            raise MQClientError.local(E.INVALID_MESSAGE, "no message to send")
        topic = msgs[0].topic
        if any(m.topic != topic for m in msgs):
            raise MQClientError.local(E.INVALID_MESSAGE, "a batch has one topic")
        for m in msgs:
            if not m.msg_id:  # fixed before attempt one, kept by every retry
                m.msg_id = new_msg_id()
        error = after
        unknown = after is not None and after.outcome_unknown  # raised with the last error
        if after is not None and after.group_refuses_writes:
            self._mark_full(failed_group)
        for left in range(retries, -1, -1):
            mq = pick(failed_group)
            if error is not None and error.group_refuses_writes:
                if mq.broker_name == failed_group:
                    raise error  # the only group it may go to has a full disk
                # Another group, another disk: nothing to wait for.
            elif error is not None:
                time.sleep(retry_wait_s(error, RETRY_WAIT_S))
            try:
                return self._send_once(mq, msgs)
            except grpc.RpcError as exc:  # not expected: call_leader converts
                error = MQClientError.from_rpc(exc)
            except MQClientError as exc:
                error = exc
            error = error.marked_unknown(unknown)
            unknown = error.outcome_unknown
            failed_group = mq.broker_name
            self._note_failure(mq, error)
            if left == 0 or not error.retryable:
                raise error
        raise AssertionError("unreachable: the last attempt returns or raises")

    # -- public API -----------------------------------------------------------------------------

    def send(
        self,
        msg: Message,
        selector: MessageQueueSelector | None = None,
        arg: Any = None,
    ) -> SendResult:
        """Send and wait for the broker's OK; raises ``MQClientError`` otherwise."""
        if selector is None:
            return self._send(
                [msg],
                lambda avoid: self._pick_queue(msg.topic, avoid),
                self.retry_times_when_send_failed,
            )[0]
        chosen: list[MessageQueue] = []

        def pick(avoid: str) -> MessageQueue:
            if not chosen:  # ordered: the same queue on every attempt
                queues = self._route_client().get_route(msg.topic).write_queues()
                if not queues:
                    raise MQClientError.local(E.NO_ROUTE, f"no queue for {msg.topic}")
                chosen.append(selector.select(queues, msg, arg))
            return chosen[0]

        return self._send([msg], pick, self.retry_times_when_send_failed)[0]

    def send_batch(self, msgs: Sequence[Message]) -> list[SendResult]:
        """One topic, one queue, one replicated unit: all stored or none."""
        if len(msgs) > MAX_BATCH_MESSAGES:
            raise MQClientError(
                E.BATCH_TOO_LARGE, "INVALID_ARGUMENT", f"at most {MAX_BATCH_MESSAGES} messages"
            )
        topic = msgs[0].topic if msgs else ""
        return self._send(
            msgs, lambda avoid: self._pick_queue(topic, avoid), self.retry_times_when_send_failed
        )

    def send_async(
        self,
        msg: Message,
        on_success: Callable[[SendResult], None] | None = None,
        on_exception: Callable[[BaseException], None] | None = None,
        selector: MessageQueueSelector | None = None,
        arg: Any = None,
    ) -> Future[SendResult]:
        """Send without waiting: a ``Future`` of the ``SendResult``. The callbacks, when given,
        run on a producer thread (the sender that got the answer), one at a time and in the
        order the answers came (keep them short: they delay the callbacks behind them and, by
        up to CALLBACKS_DEFER_S, the sends they issue; they may send again, even with
        ``send``).
        Failed attempts are retried like ``send``'s. Blocks while ``ASYNC_MAX_PENDING`` sends
        are pending (back pressure); inside a send callback, where that wait could never end,
        raises TOO_MANY_PENDING_SENDS instead."""
        if self._executor is None:
            raise MQClientError.local(E.NOT_STARTED, "call start() first")
        if not msg.msg_id:
            msg.msg_id = new_msg_id()
        future: Future[SendResult] = Future()
        future.set_running_or_notify_cancel()
        self._take_slot()

        def settle(result: SendResult | None, exc: BaseException | None) -> None:
            self._free_slot()
            if exc is None:
                assert result is not None
                future.set_result(result)
                if on_success is not None:
                    on_success(result)
            else:
                future.set_exception(exc)
                if on_exception is not None:
                    on_exception(exc)

        try:
            self._send_nowait(msg, selector, arg, settle)
        except BaseException as exc:  # no route, bad message: the caller hears it at once
            self._free_slot()
            raise exc from None
        return future

    def send_oneway(self, msg: Message) -> None:
        """Fire and forget: one attempt, no result, failures only logged."""
        if self._executor is None:
            raise MQClientError.local(E.NOT_STARTED, "call start() first")
        self._take_slot()

        def settle(result: SendResult | None, exc: BaseException | None) -> None:
            self._free_slot()
            if exc is not None:
                log.debug("one-way send failed: %s", exc)

        try:
            self._send_nowait(msg, None, None, settle, retries=0)
        except BaseException:
            self._free_slot()
            raise

    def _take_slot(self) -> None:
        """One of the ASYNC_MAX_PENDING slots, waiting for one to be freed; on the thread
        running send callbacks, TOO_MANY_PENDING_SENDS instead of the wait: slots are freed by
        the answers' callbacks, which that thread runs only once the current one returns."""
        with self._slot_lock:
            if self._async_pending >= ASYNC_MAX_PENDING and getattr(
                self._callback_runner, "active", False
            ):
                raise MQClientError.local(
                    E.TOO_MANY_PENDING_SENDS,
                    f"{self._async_pending} sends are unanswered (at most {ASYNC_MAX_PENDING}):"
                    " a send callback cannot wait for room, which only the callbacks after it"
                    " free; nothing was sent (send later, or with send())",
                )
            while self._async_pending >= ASYNC_MAX_PENDING:
                self._slot_waiters += 1
                try:
                    self._slots.wait()
                finally:
                    self._slot_waiters -= 1
            self._async_pending += 1

    def _free_slot(self) -> None:
        with self._slot_lock:
            self._async_pending -= 1
            if self._slot_waiters:
                self._slots.notify()

    def _send_nowait(
        self,
        msg: Message,
        selector: MessageQueueSelector | None,
        arg: Any,
        settle: Callable[[SendResult | None, BaseException | None], None],
        retries: int | None = None,
    ) -> None:
        """The first attempt of an async send, coalesced; a failed one is retried (blocking,
        as ``send`` does) on the executor. ``settle`` runs on the callback thread."""
        if selector is None:
            mq = self._pick_queue(msg.topic, "")
        else:
            queues = self._route_client().get_route(msg.topic).write_queues()
            if not queues:
                raise MQClientError.local(E.NO_ROUTE, f"no queue for {msg.topic}")
            mq = selector.select(queues, msg, arg)
        retries = self.retry_times_when_send_failed if retries is None else retries

        def on_done(results: list[SendResult] | None, error: BaseException | None) -> None:
            if error is None:
                assert results is not None
                self._settle_later(settle, results[0], None)
                return
            if isinstance(error, MQClientError):
                self._note_failure(mq, error)
                if retries > 0 and error.retryable:
                    self._in_background(
                        self._retry_async, msg, selector, arg, mq, retries, error, settle
                    )
                    return
            self._settle_later(settle, None, error)

        self._submit(
            _PendingSend(
                mq, [msg.to_pb(mq.queue_id, self.group, self._born_host)], len(msg.body), on_done
            ),
            deferrable=True,
        )

    def _retry_async(
        self,
        msg: Message,
        selector: MessageQueueSelector | None,
        arg: Any,
        failed: MessageQueue,
        retries: int,
        error: MQClientError,
        settle: Callable[[SendResult | None, BaseException | None], None],
    ) -> None:
        """On the executor: the retries of an async send whose first attempt failed with
        ``error`` (retryable), through :meth:`_send` like a sync send's."""

        def pick(avoid: str) -> MessageQueue:
            if selector is not None:
                return failed  # ordered: the same queue on every attempt
            return self._pick_queue(msg.topic, avoid)

        try:
            result = self._send(
                [msg], pick, retries - 1, after=error, failed_group=failed.broker_name
            )[0]
        except BaseException as exc:
            self._settle_later(settle, None, exc)
        else:
            self._settle_later(settle, result, None)
        self._run_callbacks()

    def _settle_later(
        self,
        settle: Callable[[SendResult | None, BaseException | None], None],
        result: SendResult | None,
        error: BaseException | None,
    ) -> None:
        """Queues an async send's outcome for :meth:`_run_callbacks`, which the thread that
        completed the send calls once it is done with its sends."""
        with self._callback_lock:
            self._callbacks.append((settle, result, error))

    def _run_callbacks(self) -> None:
        """Runs the queued callbacks until none is left, unless another thread is running
        them (so: one at a time, in the order the answers came). Sends they issue wait for
        the end (Senders.hand_after), for at most CALLBACKS_DEFER_S: then they leave."""
        with self._callback_lock:
            if self._running_callbacks or not self._callbacks:
                return
            self._running_callbacks = True
        runner = self._callback_runner
        runner.active = True
        started = time.monotonic()
        try:
            while True:
                with self._callback_lock:
                    if not self._callbacks:
                        self._running_callbacks = False
                        self._callbacks_done.notify_all()
                        return
                    settle, result, error = self._callbacks.popleft()
                try:
                    settle(result, error)
                except Exception:
                    log.exception("send callback failed")
                # More callbacks to run after a long one: the sends deferred so far leave now.
                if self._callbacks and time.monotonic() - started > CALLBACKS_DEFER_S:
                    self._senders.release_deferred()
                    started = time.monotonic()
        finally:
            runner.active = False
