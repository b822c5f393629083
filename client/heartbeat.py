"""A producer's heartbeats: how brokers learn who writes (mqadmin producerConnection, the
dashboard's Clients page; docs/BROKER.md, "Producer registry").

Every PRODUCER_HEARTBEAT_INTERVAL_S, and at once when the producer first sends to a topic, a
``ProducerHeartbeat`` goes to every node of every broker group routing a topic the producer sent
to (a node keeps heartbeats in its memory, so any node answers producerConnection); at
shutdown an ``UnregisterProducer`` goes to the same nodes. Sends never wait for any of it: a
heartbeat that fails is logged at debug level and sent again at the next beat.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

import grpc
from raftmq.broker.v1 import broker_pb2 as pb

from client.errors import MQClientError
from client.route import ChannelPool, RouteClient
from mqrelease import RELEASE

log = logging.getLogger(__name__)

# RocketMQ 5 clients heartbeat every 10 s (RocketMQ 4's heartbeatBrokerInterval: 30 s); the
# broker forgets a producer after 120 s of silence, so eleven lost beats in a row.
PRODUCER_HEARTBEAT_INTERVAL_S = 10.0
# One heartbeat to one node: short, so an unreachable node does not delay the others.
HEARTBEAT_RPC_S = 1.0
# Topics whose routes the heartbeats follow: a producer writing to more still heartbeats the
# groups of the first ones (most topics share groups); bounds the route lookups per beat.
MAX_HEARTBEAT_TOPICS = 256
# What the client says of itself (RocketMQ's LanguageCode name; the release as the version).
CLIENT_LANGUAGE = "PYTHON"
CLIENT_VERSION = RELEASE


class ProducerHeartbeats:
    """The heartbeat thread of one producer; ``note(topic)`` on each new topic sent to."""

    def __init__(
        self,
        group: str,
        client_id: str,
        channels: ChannelPool,
        routes: Callable[[], RouteClient | None],
        interval_s: float = PRODUCER_HEARTBEAT_INTERVAL_S,
    ) -> None:
        assert interval_s > 0, interval_s
        self.group = group
        self.client_id = client_id
        self.interval_s = interval_s
        self._channels = channels
        self._routes = routes
        self._topics: set[str] = set()
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._addrs: tuple[str, ...] = ()  # the nodes of the last beat

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._run, name="producer-heartbeat", daemon=True
            )
            self._thread.start()

    def note(self, topic: str) -> None:
        """The producer sent to ``topic``: heartbeat its groups now if they are new."""
        if topic in self._topics:
            return
        with self._lock:
            if len(self._topics) >= MAX_HEARTBEAT_TOPICS or topic in self._topics:
                return
            self._topics.add(topic)
        self._wake.set()

    def stop(self) -> None:
        """Stop beating and unregister from the nodes of the last beat (bounded: one short
        RPC per node, in parallel)."""
        if self._thread is None:
            return
        self._stop.set()
        self._wake.set()
        self._thread.join(HEARTBEAT_RPC_S * 2 + self.interval_s)
        self._thread = None
        request = pb.UnregisterProducerRequest(client_id=self.client_id, producer_group=self.group)
        self._each_node(self._addrs, "UnregisterProducer", request)

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.clear()
            self._beat()
            self._wake.wait(self.interval_s)

    def _beat(self) -> None:
        addrs = self._nodes()
        request = pb.ProducerHeartbeatRequest(
            client_id=self.client_id,
            producer_group=self.group,
            language=CLIENT_LANGUAGE,
            client_version=CLIENT_VERSION,
        )
        self._each_node(addrs, "ProducerHeartbeat", request)
        self._addrs = addrs

    def _nodes(self) -> tuple[str, ...]:
        """Every node of every group routing a topic sent to (routes as cached)."""
        routes = self._routes()
        if routes is None:
            return ()
        with self._lock:
            topics = sorted(self._topics)
        addrs: dict[str, None] = {}
        for topic in topics:
            try:
                route = routes.get_route(topic)
            except MQClientError as exc:
                log.debug("producer heartbeat: no route for topic=%s: %s", topic, exc)
                continue
            for g in route.groups:
                addrs.update(dict.fromkeys(g.addrs))
        return tuple(addrs)

    def _each_node(self, addrs: tuple[str, ...], rpc: str, request: object) -> None:
        calls = []
        for addr in addrs:
            try:
                method = getattr(self._channels.broker(addr), rpc)
                calls.append(method.future(request, timeout=HEARTBEAT_RPC_S))
            except (ValueError, RuntimeError) as exc:  # the pool closed under us
                log.debug("%s to %s not sent: %s", rpc, addr, exc)
        for call in calls:
            try:
                call.result()
            except grpc.RpcError as exc:
                log.debug("%s failed: %s", rpc, MQClientError.from_rpc(exc))
