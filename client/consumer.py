"""Consumers: ``PullConsumer`` (the caller picks queues and offsets) and ``PushConsumer``
(a long-polling loop per assigned queue calling a listener, with rebalancing).

PushConsumer in **clustering** mode splits a topic's queues among the live consumers of its
group: every ``HEARTBEAT_INTERVAL_S`` it heartbeats to every node of every broker group of its
topics, reads the group's consumer list and, when the list or the route changed (and at least
every ``REBALANCE_INTERVAL_S``), recomputes its share with the allocation strategy
(``client.allocate``). Offsets are committed to the broker after the listener returned
``CONSUME_SUCCESS`` (every ``OFFSET_PERSIST_INTERVAL_S``, synchronously when a queue is given
up and on shutdown). In **broadcasting** mode every consumer takes every queue and keeps its
offsets in a local JSON file.

In clustering mode a queue is consumed only while this consumer holds its lock on the broker
group's leader (``LockBatchMQ``, renewed every ``LOCK_RENEW_INTERVAL_S`` and in every
heartbeat). A consumer giving a queue up commits its offset, then unlocks; the next owner gets
the lock only then and reads the committed offset after locking. So a queue is never consumed
by two consumers at once, and a graceful rebalance redelivers nothing. A consumer that cannot
renew a lock for ``LOCK_LOCAL_LIVE_S`` stops consuming the queue (the broker frees it after 60 s).

Each assigned queue is served by one thread that pulls and calls the listener in queue order,
so messages of one queue are consumed one batch at a time in queue order (orderly per queue).

``RECONSUME_LATER`` (or an exception from the listener), clustering mode: every message of the
batch is sent back to the broker (``ConsumerSendMsgBack``), which redelivers it through the
group's retry topic ``%RETRY%{group}`` (every consumer of the group subscribes to it) after
the delay of level ``3 + reconsume_times`` (10 s, 30 s, 1 m, ...), and after
``max_reconsume_times`` (16) failures parks it in ``%DLQ%{group}``; the queue moves on. A
message whose send-back fails is retried in place. **Orderly** listeners
(``register_listener(fn, orderly=True)``) and broadcasting consumers instead retry the batch in
place after ``RECONSUME_DELAY_S``, holding back the queue, so order is kept.

A consumer that shuts down unregisters from every node, so the rest of the group takes its
queues at the next heartbeat; one that dies silently is forgotten after 120 s without heartbeats.
"""

from __future__ import annotations

import enum
import json
import logging
import os
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import grpc
from raftmq.broker.v1 import broker_pb2 as pb
from raftmq.broker.v1 import broker_pb2_grpc as bpb_grpc

from client.allocate import AllocateMessageQueueAveragely, AllocateStrategy
from client.errors import MQClientError
from client.heartbeat import CLIENT_LANGUAGE, CLIENT_VERSION
from client.message import RETRY_PREFIX, MessageExt, MessageQueue, local_host, new_client_id
from client.route import ChannelPool, RouteClient
from client.wire import decode_messages
from mqerrors import codes as E
from mqsecurity.channels import PLAINTEXT, ClientSecurity

log = logging.getLogger(__name__)

# How often a push consumer heartbeats and checks the consumer list and routes.
HEARTBEAT_INTERVAL_S = 1.0
# A rebalance at least this often even when nothing seems to have changed (RocketMQ: 20 s).
REBALANCE_INTERVAL_S = 5.0
# Offsets of consumed messages reach the broker (or the local file) at least this often.
OFFSET_PERSIST_INTERVAL_S = 1.0
# Long-polling hold asked of the broker (its default; the broker caps it at 60 s).
LONG_POLL_SUSPEND_MS = 15_000
# Extra time on top of the hold before a pull RPC is given up.
PULL_RPC_MARGIN_S = 5.0
# Unary calls other than pulls.
RPC_TIMEOUT_S = 3.0
# One heartbeat to one node: short, so an unreachable node does not delay the others' view.
HEARTBEAT_RPC_S = 1.0
# Messages per pull (RocketMQ's pullBatchSize) and per listener call (consumeMessageBatchMaxSize).
PULL_BATCH_SIZE = 32
CONSUME_BATCH_SIZE = 1
# Before a RECONSUME_LATER batch is delivered again in place (until retry topics, issue #7).
RECONSUME_DELAY_S = 1.0
# After a failed pull, before the next (the route is refreshed meanwhile).
PULL_ERROR_BACKOFF_S = 0.5
# A queue offset beyond a node's max offset usually means that node has not applied as far as
# another had (failover); the consumer waits this long for it before accepting the correction
# (which would redeliver), as after a topic was deleted and re-created.
AHEAD_OF_BROKER_WAIT_S = 30.0
# Threads serving assigned queues; queues beyond wait for a free thread.
MAX_QUEUE_THREADS = 64
# How often a waiting thread checks for shutdown.
STOP_POLL_S = 0.1
# Where broadcasting consumers keep offsets by default (RocketMQ: ~/.rocketmq_offsets).
DEFAULT_OFFSET_STORE_DIR = Path.home() / ".raftmq_offsets"
# Queue locks (clustering), RocketMQ's figures: renew every 20 s; trust a lock for 30 s after
# its last renewal, well inside the broker's 60 s expiry (broker.components.locks.LOCK_MAX_LIVE_MS).
LOCK_RENEW_INTERVAL_S = 20.0
LOCK_LOCAL_LIVE_S = 30.0
# Between attempts to lock a queue another consumer still holds (it is committing, then unlocks).
LOCK_RETRY_S = 0.3
# RocketMQ's maxReconsumeTimes default: send-backs before a message goes to %DLQ%{group}.
MAX_RECONSUME_TIMES = 16
# A send-back is one RPC to the group's leader (redirects and elections included).
SEND_BACK_TIMEOUT_S = 3.0


class ConsumeStatus(enum.Enum):
    CONSUME_SUCCESS = "CONSUME_SUCCESS"
    RECONSUME_LATER = "RECONSUME_LATER"


class MessageModel(enum.Enum):
    CLUSTERING = "CLUSTERING"
    BROADCASTING = "BROADCASTING"


class ConsumeFromWhere(enum.Enum):
    """Where a queue without a stored offset starts."""

    CONSUME_FROM_FIRST_OFFSET = "CONSUME_FROM_FIRST_OFFSET"
    CONSUME_FROM_LAST_OFFSET = "CONSUME_FROM_LAST_OFFSET"


@dataclass(frozen=True, slots=True)
class PullResult:
    status: str  # FOUND, NO_NEW_MSG, NO_MATCHED_MSG, OFFSET_ILLEGAL
    messages: list[MessageExt]
    next_begin_offset: int
    min_offset: int
    max_offset: int


def pulled_messages(resp: pb.PullMessageResponse, broker_name: str) -> list[MessageExt]:
    """The messages of a pull answer (stored bytes back to back, docs/BROKER.md), in queue
    order; ``MQClientError("BAD_RESPONSE")`` when they do not decode."""
    if not resp.raw_positions and not resp.raw_messages:
        return []
    return decode_messages(
        resp.raw_messages,
        resp.raw_queue_offsets,
        resp.raw_positions,
        resp.offset_msg_id_prefix,
        broker_name,
    )


MessageListener = Callable[[list[MessageExt]], ConsumeStatus]


def parse_tags(expression: str) -> frozenset[str] | None:
    """``"TagA || TagB"`` -> {TagA, TagB}; ``"*"`` or empty -> None (everything)."""
    expr = expression.strip()
    if expr in ("", "*"):
        return None
    tags = frozenset(t.strip() for t in expr.split("||") if t.strip())
    if not tags:
        raise MQClientError.local(E.INVALID_SUBSCRIPTION, repr(expression))
    return tags


class _ClientBase:
    def __init__(self, group: str, namesrv_addr: str, security: ClientSecurity = PLAINTEXT) -> None:
        if not group:
            raise MQClientError.local(E.INVALID_GROUP, "a consumer group is required")
        self.group = group
        self.namesrv_addr = namesrv_addr
        self._channels = ChannelPool(security)
        self._routes_client: RouteClient | None = None

    @property
    def _routes(self) -> RouteClient:
        if self._routes_client is None:
            raise MQClientError.local(E.NOT_STARTED, "call start() first")
        return self._routes_client

    def _start_routes(self) -> None:
        if self._routes_client is None:
            self._routes_client = RouteClient(self.namesrv_addr, self._channels)

    def _close(self) -> None:
        self._channels.close()
        self._routes_client = None

    def fetch_queues(self, topic: str) -> list[MessageQueue]:
        """The topic's readable queues over every broker group, sorted."""
        return sorted(self._routes.get_route(topic).read_queues())

    def _pull_request(
        self, mq: MessageQueue, offset: int, max_nums: int, expression: str, suspend_ms: int
    ) -> pb.PullMessageRequest:
        return pb.PullMessageRequest(
            consumer_group=self.group,
            topic=mq.topic,
            queue_id=mq.queue_id,
            queue_offset=offset,
            max_msgs=max_nums,
            subscription=expression,
            suspend_timeout_ms=suspend_ms,
            no_suspend=suspend_ms <= 0,
        )

    @staticmethod
    def _to_result(
        mq: MessageQueue, resp: pb.PullMessageResponse, tags: frozenset[str] | None
    ) -> PullResult:
        messages = pulled_messages(resp, mq.broker_name)
        if tags is not None:  # the broker filtered by tag hash only
            messages = [m for m in messages if m.tags in tags]
        status = pb.PullStatus.Name(resp.status)
        if status == "FOUND" and not messages:  # every one a tag hash collision
            status = "NO_MATCHED_MSG"
        return PullResult(
            status,
            messages,
            resp.next_begin_offset,
            resp.min_offset,
            resp.max_offset,
        )

    def fetch_offset(self, mq: MessageQueue) -> int:
        """The group's committed offset of the queue (the leader's newest); -1 when none."""

        def call(stub: bpb_grpc.BrokerStub, timeout_s: float) -> int:
            resp = stub.QueryConsumerOffset(
                pb.QueryConsumerOffsetRequest(
                    consumer_group=self.group, topic=mq.topic, queue_id=mq.queue_id
                ),
                timeout=min(timeout_s, RPC_TIMEOUT_S),
            )
            return int(resp.queue_offset)

        return self._routes.call_leader(mq.topic, mq.broker_name, call, RPC_TIMEOUT_S * 2)

    def update_offset(self, mq: MessageQueue, offset: int, sync: bool = True) -> None:
        """Commit the group's offset of the queue (``sync``: answered after the commit)."""

        def call(stub: bpb_grpc.BrokerStub, timeout_s: float) -> None:
            stub.UpdateConsumerOffset(
                pb.UpdateConsumerOffsetRequest(
                    consumer_group=self.group,
                    topic=mq.topic,
                    queue_id=mq.queue_id,
                    queue_offset=offset,
                    sync=sync,
                ),
                timeout=min(timeout_s, RPC_TIMEOUT_S),
            )

        self._routes.call_leader(mq.topic, mq.broker_name, call, RPC_TIMEOUT_S * 2)

    def search_offset(self, mq: MessageQueue, timestamp_ms: int) -> int:
        """The offset of the first message of ``mq`` stored at or after ``timestamp_ms`` (the
        queue's max offset when none is)."""

        def call(stub: bpb_grpc.BrokerStub, timeout_s: float) -> int:
            resp = stub.SearchOffset(
                pb.SearchOffsetRequest(
                    topic=mq.topic, queue_id=mq.queue_id, timestamp_ms=timestamp_ms
                ),
                timeout=min(timeout_s, RPC_TIMEOUT_S),
            )
            return int(resp.queue_offset)

        return self._routes.call_leader(mq.topic, mq.broker_name, call, RPC_TIMEOUT_S * 2)

    def max_offset(self, mq: MessageQueue) -> int:
        def call(stub: bpb_grpc.BrokerStub, timeout_s: float) -> int:
            resp = stub.GetQueueOffsets(
                pb.GetQueueOffsetsRequest(topic=mq.topic, queue_id=mq.queue_id),
                timeout=min(timeout_s, RPC_TIMEOUT_S),
            )
            return int(resp.max_offset)

        return self._routes.call_leader(mq.topic, mq.broker_name, call, RPC_TIMEOUT_S * 2)


class PullConsumer(_ClientBase):
    """The caller picks queues and offsets: ``fetch_queues``, ``pull``, ``update_offset``,
    ``fetch_offset``. ``PullConsumer(group, namesrv_addr, security)``: see ``Producer``."""

    def start(self) -> None:
        self._start_routes()

    def shutdown(self) -> None:
        self._close()

    def __enter__(self) -> PullConsumer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    def pull(
        self,
        mq: MessageQueue,
        offset: int,
        max_nums: int = PULL_BATCH_SIZE,
        expression: str = "*",
        suspend_timeout_ms: int = 0,
    ) -> PullResult:
        """Up to ``max_nums`` messages of ``mq`` from ``offset`` matching ``expression``; with
        ``suspend_timeout_ms`` the broker holds the call until a message arrives (long poll).
        Tries the group's leader first, then the other nodes while one is unreachable."""
        tags = parse_tags(expression)
        request = self._pull_request(mq, offset, max_nums, expression, suspend_timeout_ms)
        timeout_s = suspend_timeout_ms / 1000 + PULL_RPC_MARGIN_S
        last: MQClientError | None = None
        for addr in self._routes.any_addr(mq.topic, mq.broker_name):
            try:
                resp = self._channels.broker(addr).PullMessage(request, timeout=timeout_s)
            except grpc.RpcError as exc:
                last = MQClientError.from_rpc(exc)
                if not last.retryable:
                    raise last from exc
                continue
            return self._to_result(mq, resp, tags)
        self._routes.invalidate(mq.topic)
        raise last or MQClientError.local(E.NO_ROUTE, f"no node for {mq.key()}")


class _ProcessQueue:
    """One assigned queue: its pull/consume thread's state."""

    def __init__(self, mq: MessageQueue, expression: str) -> None:
        self.mq = mq
        self.expression = expression
        self.tags = parse_tags(expression)
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.consumed_offset = -1  # next offset to consume; -1 until known
        self.persisted_offset = -1
        # Held while an offset of this queue is being committed, so commits never reorder.
        self.persist_lock = threading.Lock()
        self.future: Future[None] | None = None
        # Monotonic time of the last successful lock or renewal on the leader; None: not held.
        self.locked_at: float | None = None

    def lock_valid(self) -> bool:
        at = self.locked_at
        return at is not None and time.monotonic() - at < LOCK_LOCAL_LIVE_S

    def running(self) -> bool:
        return self.future is not None and not self.future.done()


class PushConsumer(_ClientBase):
    """``PushConsumer(group, namesrv_addr)``; ``subscribe(topic, "TagA || TagB")``,
    ``register_listener(fn)``, ``start()``, ``shutdown()``. See the module docstring.
    ``security``: TLS and the credentials that sign every call, as for ``Producer``."""

    def __init__(
        self,
        group: str,
        namesrv_addr: str,
        message_model: MessageModel = MessageModel.CLUSTERING,
        *,
        allocate_strategy: AllocateStrategy = AllocateMessageQueueAveragely,
        consume_from_where: ConsumeFromWhere = ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET,
        consume_batch_size: int = CONSUME_BATCH_SIZE,
        pull_batch_size: int = PULL_BATCH_SIZE,
        offset_store_dir: str | os.PathLike[str] | None = None,
        client_id: str | None = None,
        max_reconsume_times: int = MAX_RECONSUME_TIMES,
        security: ClientSecurity = PLAINTEXT,
    ) -> None:
        super().__init__(group, namesrv_addr, security)
        if not 0 <= max_reconsume_times <= 64:
            raise MQClientError(
                E.INVALID_ARGUMENT, "INVALID_ARGUMENT", "max_reconsume_times must be in [0, 64]"
            )
        self.max_reconsume_times = max_reconsume_times
        self.orderly = False
        self.message_model = message_model
        self.allocate_strategy = allocate_strategy
        self.consume_from_where = consume_from_where
        self.consume_batch_size = max(1, consume_batch_size)
        self.pull_batch_size = max(1, pull_batch_size)
        self.client_id = client_id or new_client_id(local_host())
        self._subscriptions: dict[str, str] = {}
        self._listener: MessageListener | None = None
        self._queues: dict[MessageQueue, _ProcessQueue] = {}
        self._dropping: list[_ProcessQueue] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._executor: ThreadPoolExecutor | None = None
        self._last_view: dict[str, tuple[tuple[MessageQueue, ...], tuple[str, ...]]] = {}
        store_dir = Path(offset_store_dir) if offset_store_dir else DEFAULT_OFFSET_STORE_DIR
        safe_id = "".join(c if c.isalnum() or c in "-_." else "_" for c in self.client_id)
        self._offset_file = store_dir / safe_id / self.group / "offsets.json"
        self._local_offsets: dict[str, int] = {}

    # -- setup ----------------------------------------------------------------------------------

    def subscribe(self, topic: str, expression: str = "*") -> None:
        parse_tags(expression)
        self._subscriptions[topic] = expression

    def register_listener(self, listener: MessageListener, *, orderly: bool = False) -> None:
        """``orderly``: a failed batch is retried in place, holding back its queue (RocketMQ's
        MessageListenerOrderly); otherwise failed messages go through the retry topic."""
        self._listener = listener
        self.orderly = orderly

    def assigned_queues(self) -> list[MessageQueue]:
        with self._lock:
            return sorted(self._queues)

    def start(self) -> None:
        if self._thread is not None:
            return
        if self._listener is None or not self._subscriptions:
            raise MQClientError(
                E.NOT_READY, "FAILED_PRECONDITION", "subscribe() and register_listener() first"
            )
        self._start_routes()
        if self.message_model is MessageModel.CLUSTERING:
            # Redeliveries of this group's failed messages (RocketMQ subscribes the same way).
            self._subscriptions.setdefault(RETRY_PREFIX + self.group, "*")
        if self.message_model is MessageModel.BROADCASTING and self._offset_file.exists():
            self._local_offsets = {
                k: int(v) for k, v in json.loads(self._offset_file.read_text()).items()
            }
        self._stop.clear()
        self._executor = ThreadPoolExecutor(MAX_QUEUE_THREADS, thread_name_prefix="consume")
        self._thread = threading.Thread(
            target=self._run, name=f"rebalance-{self.client_id}", daemon=True
        )
        self._thread.start()

    def shutdown(self) -> None:
        """Stops every thread, then commits every consumed offset (synchronously)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        with self._lock:
            pqs = list(self._queues.values()) + self._dropping
            self._queues, self._dropping = {}, []
        for pq in pqs:
            pq.stop.set()
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None
        self._persist(pqs, sync=True)
        if self.message_model is MessageModel.CLUSTERING:
            self._unregister()
        self._close()

    def _unregister(self) -> None:
        """Tell every node of every subscribed group that this consumer left, so the rest of
        the group rebalances at its next heartbeat rather than after the broker's expiry."""
        request = pb.UnregisterConsumerRequest(client_id=self.client_id, consumer_group=self.group)
        calls = []
        for topic in self._subscriptions:
            try:
                route = self._routes.get_route(topic)
            except MQClientError as exc:
                log.debug("unregister: no route for topic=%s: %s", topic, exc)
                continue
            calls += [
                self._channels.broker(addr).UnregisterConsumer.future(
                    request, timeout=HEARTBEAT_RPC_S
                )
                for g in route.groups
                for addr in g.addrs
            ]
        for call in calls:
            try:
                call.result()
            except grpc.RpcError as exc:
                log.debug("unregister failed: %s", MQClientError.from_rpc(exc))

    def __enter__(self) -> PushConsumer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    # -- rebalance ------------------------------------------------------------------------------

    def _run(self) -> None:
        last_rebalance = 0.0
        last_persist = last_lock = time.monotonic()
        while not self._stop.is_set():
            changed = False
            for topic in list(self._subscriptions):
                try:
                    changed |= self._refresh_view(topic)
                except MQClientError as exc:
                    # The retry topic exists only once a message of the group failed.
                    quiet = topic.startswith(RETRY_PREFIX) and exc.status == "NOT_FOUND"
                    log.log(
                        logging.DEBUG if quiet else logging.WARNING,
                        "client=%s topic=%s view failed: %s",
                        self.client_id,
                        topic,
                        exc,
                    )
            now = time.monotonic()
            if changed or now - last_rebalance >= REBALANCE_INTERVAL_S:
                self._rebalance()
                last_rebalance = now
            if now - last_persist >= OFFSET_PERSIST_INTERVAL_S:
                with self._lock:
                    pqs = list(self._queues.values())
                self._persist(pqs, sync=False)
                last_persist = now
            if self._uses_locks and now - last_lock >= LOCK_RENEW_INTERVAL_S:
                with self._lock:
                    held = [pq for pq in self._queues.values() if pq.locked_at is not None]
                self._lock_queues(held)
                last_lock = now
            self._stop.wait(HEARTBEAT_INTERVAL_S)

    def _refresh_view(self, topic: str) -> bool:
        """Heartbeat, then the topic's queues and the group's consumers; True when changed."""
        routes = self._routes
        route = routes.get_route(topic)
        queues = tuple(sorted(route.read_queues()))
        if self.message_model is MessageModel.BROADCASTING:
            clients: tuple[str, ...] = (self.client_id,)
        else:
            subscriptions = [
                pb.Subscription(topic=t, expression=e) for t, e in self._subscriptions.items()
            ]
            with self._lock:
                held = [pq.mq for pq in self._queues.values() if pq.lock_valid()]
            # Every node of every group, not only the leader: the broker keeps heartbeats (and
            # the queue locks they report) in the memory of the node that got them, so after a
            # failover the new leader already knows every consumer and lock.
            calls = []
            for g in route.groups:
                request = pb.HeartbeatRequest(
                    client_id=self.client_id,
                    consumer_group=self.group,
                    subscriptions=subscriptions,
                    locked_queues=[
                        pb.QueueRef(topic=mq.topic, queue_id=mq.queue_id)
                        for mq in held
                        if mq.broker_name == g.broker_name
                    ],
                    language=CLIENT_LANGUAGE,
                    client_version=CLIENT_VERSION,
                )
                calls += [
                    self._channels.broker(addr).Heartbeat.future(request, timeout=HEARTBEAT_RPC_S)
                    for addr in g.addrs
                ]
            for call in calls:
                try:
                    call.result()
                except grpc.RpcError as exc:
                    log.debug("heartbeat failed: %s", MQClientError.from_rpc(exc))

            def members(stub: bpb_grpc.BrokerStub, timeout_s: float) -> tuple[str, ...]:
                resp = stub.GetConsumerList(
                    pb.GetConsumerListRequest(consumer_group=self.group),
                    timeout=min(timeout_s, RPC_TIMEOUT_S),
                )
                return tuple(sorted(resp.client_ids))

            found: set[str] = set()
            for g in route.groups:
                try:
                    found.update(routes.call_leader(topic, g.broker_name, members, RPC_TIMEOUT_S))
                except MQClientError as exc:
                    log.warning("consumer list from %s failed: %s", g.broker_name, exc)
            found.add(self.client_id)
            clients = tuple(sorted(found))
        view = (queues, clients)
        changed = self._last_view.get(topic) != view
        self._last_view[topic] = view
        return changed

    def _rebalance(self) -> None:
        wanted: dict[MessageQueue, str] = {}
        for topic, expression in self._subscriptions.items():
            view = self._last_view.get(topic)
            if view is None:
                continue
            queues, clients = view
            if self.message_model is MessageModel.BROADCASTING:
                mine = list(queues)
            else:
                mine = self.allocate_strategy(self.group, self.client_id, queues, clients)
            for mq in mine:
                wanted[mq] = expression
        executor = self._executor
        if executor is None:
            return
        with self._lock:
            self._dropping = [pq for pq in self._dropping if pq.running()]
            for mq in [mq for mq in self._queues if mq not in wanted]:
                pq = self._queues.pop(mq)
                pq.stop.set()  # its thread commits the offset synchronously as it leaves
                self._dropping.append(pq)
                log.info("client=%s drops %s", self.client_id, mq.key())
            busy = {pq.mq for pq in self._dropping}
            for mq, expression in wanted.items():
                if mq in self._queues or mq in busy:
                    continue
                pq = _ProcessQueue(mq, expression)
                self._queues[mq] = pq
                pq.future = executor.submit(self._serve, pq)
                log.info("client=%s takes %s", self.client_id, mq.key())

    # -- queue locks ----------------------------------------------------------------------------

    @property
    def _uses_locks(self) -> bool:
        return self.message_model is MessageModel.CLUSTERING

    def _lock_queues(self, pqs: Sequence[_ProcessQueue]) -> None:
        """Lock (or renew) ``pqs`` on their groups' leaders; marks each held or not."""
        by_group: dict[tuple[str, str], list[_ProcessQueue]] = {}
        for pq in pqs:
            by_group.setdefault((pq.mq.topic, pq.mq.broker_name), []).append(pq)
        for (topic, broker_name), group_pqs in by_group.items():
            request = pb.LockBatchRequest(
                consumer_group=self.group,
                client_id=self.client_id,
                queues=[
                    pb.QueueRef(topic=pq.mq.topic, queue_id=pq.mq.queue_id) for pq in group_pqs
                ],
            )

            def call(
                stub: bpb_grpc.BrokerStub, timeout_s: float, request: pb.LockBatchRequest = request
            ) -> set[tuple[str, int]]:
                resp = stub.LockBatchMQ(request, timeout=min(timeout_s, RPC_TIMEOUT_S))
                return {(q.topic, q.queue_id) for q in resp.locked}

            asked_at = time.monotonic()
            try:
                locked = self._routes.call_leader(topic, broker_name, call, RPC_TIMEOUT_S * 2)
            except MQClientError as exc:
                log.warning("client=%s lock on %s failed: %s", self.client_id, broker_name, exc)
                continue  # kept until LOCK_LOCAL_LIVE_S runs out
            for pq in group_pqs:
                if (pq.mq.topic, pq.mq.queue_id) in locked:
                    pq.locked_at = asked_at
                else:
                    if pq.locked_at is not None:
                        log.warning("client=%s lost the lock of %s", self.client_id, pq.mq.key())
                    pq.locked_at = None

    def _unlock(self, pq: _ProcessQueue) -> None:
        """Release ``pq``'s lock on every node of its group (the next leader too)."""
        pq.locked_at = None
        request = pb.UnlockBatchRequest(
            consumer_group=self.group,
            client_id=self.client_id,
            queues=[pb.QueueRef(topic=pq.mq.topic, queue_id=pq.mq.queue_id)],
        )
        try:
            addrs = self._routes.any_addr(pq.mq.topic, pq.mq.broker_name)
        except MQClientError as exc:
            log.warning("unlock %s: no route: %s", pq.mq.key(), exc)
            return
        calls = [
            self._channels.broker(a).UnlockBatchMQ.future(request, timeout=HEARTBEAT_RPC_S)
            for a in addrs
        ]
        for c in calls:
            try:
                c.result()
            except grpc.RpcError as exc:
                log.debug("unlock %s failed: %s", pq.mq.key(), MQClientError.from_rpc(exc))

    # -- offsets --------------------------------------------------------------------------------

    def _initial_offset(self, mq: MessageQueue) -> int:
        if self.message_model is MessageModel.BROADCASTING:
            stored = self._local_offsets.get(mq.key(), -1)
        else:
            stored = self.fetch_offset(mq)
        if stored >= 0:
            return stored
        if self.consume_from_where is ConsumeFromWhere.CONSUME_FROM_LAST_OFFSET:
            return self.max_offset(mq)
        return 0

    def _persist(self, pqs: Sequence[_ProcessQueue], sync: bool) -> None:
        todo = []
        for pq in pqs:
            with pq.lock:
                if pq.consumed_offset >= 0 and pq.consumed_offset != pq.persisted_offset:
                    todo.append((pq, pq.consumed_offset))
        if not todo:
            return
        if self.message_model is MessageModel.BROADCASTING:
            with self._lock:
                for pq, offset in todo:
                    self._local_offsets[pq.mq.key()] = offset
                data = json.dumps(self._local_offsets, sort_keys=True)
            self._offset_file.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self._offset_file.parent, prefix=".offsets-")
            with os.fdopen(fd, "w") as f:
                f.write(data)
            os.replace(tmp, self._offset_file)
            for pq, offset in todo:
                pq.persisted_offset = offset
            return
        for pq, _ in todo:
            with pq.persist_lock:
                with pq.lock:
                    offset = pq.consumed_offset
                if offset == pq.persisted_offset:
                    continue
                try:
                    self.update_offset(pq.mq, offset, sync=sync)
                except MQClientError as exc:
                    log.warning("offset commit %s=%d failed: %s", pq.mq.key(), offset, exc)
                    continue
                with pq.lock:
                    pq.persisted_offset = offset

    # -- one queue ------------------------------------------------------------------------------

    def _serve(self, pq: _ProcessQueue) -> None:
        try:
            self._serve_loop(pq)
        except Exception:
            log.exception("client=%s queue %s failed", self.client_id, pq.mq.key())
        finally:
            if not self._stop.is_set():  # given up by a rebalance: hand over the offset now
                self._persist([pq], sync=True)
                if self._uses_locks and pq.locked_at is not None:
                    self._unlock(pq)  # only after the commit: the next owner starts there

    def _pull_once(self, pq: _ProcessQueue, offset: int, addr: str) -> PullResult | None:
        request = self._pull_request(
            pq.mq, offset, self.pull_batch_size, pq.expression, LONG_POLL_SUSPEND_MS
        )
        call = self._channels.broker(addr).PullMessage.future(
            request, timeout=LONG_POLL_SUSPEND_MS / 1000 + PULL_RPC_MARGIN_S
        )
        while True:
            try:
                resp = call.result(timeout=STOP_POLL_S)
                break
            except grpc.FutureTimeoutError:
                if pq.stop.is_set() or self._stop.is_set():
                    call.cancel()
                    return None
        return self._to_result(pq.mq, resp, pq.tags)

    def _serve_loop(self, pq: _ProcessQueue) -> None:
        offset = -1
        node = 0
        ahead_since: float | None = None  # since when this queue's offset is past every node's
        while not pq.stop.is_set():
            if self._uses_locks and not pq.lock_valid():
                offset = -1  # whoever held it may have committed since: read after locking
                self._lock_queues([pq])
                if not pq.lock_valid():
                    pq.stop.wait(LOCK_RETRY_S)
                    continue
            try:
                if offset < 0:
                    offset = self._initial_offset(pq.mq)
                    with pq.lock:
                        pq.consumed_offset = pq.persisted_offset = offset
                addrs = self._routes.any_addr(pq.mq.topic, pq.mq.broker_name)
                result = self._pull_once(pq, offset, addrs[node % len(addrs)])
            except (MQClientError, grpc.RpcError) as exc:
                err = MQClientError.from_rpc(exc) if isinstance(exc, grpc.RpcError) else exc
                log.warning("client=%s pull %s failed: %s", self.client_id, pq.mq.key(), err)
                node += 1
                self._routes.invalidate(pq.mq.topic)
                pq.stop.wait(PULL_ERROR_BACKOFF_S)
                continue
            if result is None:
                return
            if result.status == "OFFSET_ILLEGAL":
                if offset > result.next_begin_offset and ahead_since is None:
                    ahead_since = time.monotonic()
                if (
                    offset > result.next_begin_offset
                    and ahead_since is not None
                    and time.monotonic() - ahead_since < AHEAD_OF_BROKER_WAIT_S
                ):
                    # Ahead of this node: it has not applied as far as another node had (a
                    # follower or a new leader catching up). Moving back would redeliver what
                    # was consumed; wait for it instead, trying the next node.
                    log.info(
                        "%s offset %d ahead of node (max %d): waiting",
                        pq.mq.key(),
                        offset,
                        result.next_begin_offset,
                    )
                    node += 1
                    pq.stop.wait(PULL_ERROR_BACKOFF_S)
                    continue
                log.warning(
                    "%s offset %d illegal: now %d", pq.mq.key(), offset, result.next_begin_offset
                )
            ahead_since = None
            size = self.consume_batch_size
            lost_lock = False
            for i in range(0, len(result.messages), size):
                batch = result.messages[i : i + size]
                if self._uses_locks and not pq.lock_valid():
                    lost_lock = True  # another consumer may own the queue now
                    break
                if not self._consume(pq, batch):
                    return  # stopped before the batch was consumed: not committed
                with pq.lock:
                    pq.consumed_offset = batch[-1].queue_offset + 1
            if lost_lock:
                continue  # relock at the top, then start from the committed offset
            offset = result.next_begin_offset
            with pq.lock:  # filtered-out messages are consumed too
                pq.consumed_offset = max(pq.consumed_offset, offset)

    def _consume(self, pq: _ProcessQueue, batch: list[MessageExt]) -> bool:
        """Call the listener until the batch is consumed; False when stopped first."""
        listener = self._listener
        assert listener is not None
        send_back = self.message_model is MessageModel.CLUSTERING and not self.orderly
        attempt = 0
        while not pq.stop.is_set():
            try:
                status = listener(batch)
            except Exception:
                log.exception("listener failed on %s; reconsume later", pq.mq.key())
                status = ConsumeStatus.RECONSUME_LATER
            if status is ConsumeStatus.CONSUME_SUCCESS:
                return True
            if send_back and self._send_back(batch):
                return True  # every message is the retry topic's now
            attempt += 1
            log.info("%s: RECONSUME_LATER (attempt %d)", pq.mq.key(), attempt)
            pq.stop.wait(RECONSUME_DELAY_S)
        return False

    def _send_back(self, batch: list[MessageExt]) -> bool:
        """Hand a failed batch (one queue's) to the broker's retry machinery in one call;
        False when that failed (the batch is then retried in place)."""
        request = pb.ConsumerSendMsgBackRequest(
            consumer_group=self.group,
            messages=[
                pb.SendBackItem(
                    commitlog_position=m.commitlog_position, msg_id=m.store_msg_id or m.msg_id
                )
                for m in batch
            ],
            delay_level=0,
            max_reconsume_times=self.max_reconsume_times,
        )

        def call(stub: bpb_grpc.BrokerStub, timeout_s: float) -> pb.ConsumerSendMsgBackResponse:
            resp: pb.ConsumerSendMsgBackResponse = stub.ConsumerSendMsgBack(
                request, timeout=min(timeout_s, RPC_TIMEOUT_S)
            )
            return resp

        first = batch[0]
        topic = first.store_topic or first.topic
        try:
            resp = self._routes.call_leader(topic, first.broker_name, call, SEND_BACK_TIMEOUT_S)
        except MQClientError as exc:
            log.warning("send back of %d failed, retrying in place: %s", len(batch), exc)
            return False
        for m, r in zip(batch, resp.results, strict=False):
            log.info("sent back %s (attempt %d) to %s", m.msg_id, m.reconsume_times + 1, r.topic)
        return True
