"""A producer's heartbeats: how brokers learn who writes (mqadmin producerConnection, the
dashboard's Clients page; docs/BROKER.md, "Producer registry").

Every PRODUCER_HEARTBEAT_INTERVAL_S, and at once when the producer first sends to a topic, a
``ProducerHeartbeat`` goes to every node of every broker group routing a topic the producer sent
to, naming the topics of that group (the broker checks the caller's Pub right on them; a node
keeps heartbeats in its memory, so any node answers producerConnection); at shutdown an
``UnregisterProducer`` goes to the same nodes. Sends never wait for any of it: a heartbeat that
fails is logged at debug level and sent again at the next beat. An interval of 0 sends none (a
one-shot tool's producer: mqadmin's, the dashboard's test send).
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
# groups of the first ones (most topics share groups); bounds the route lookups per beat and
# the topics of one heartbeat (the broker's MAX_PRODUCER_TOPICS, the same number).
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
        assert interval_s >= 0, interval_s
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
        self._beaten: dict[str, tuple[str, ...]] = {}  # node -> its topics, at the last beat

    def start(self) -> None:
        if self._thread is None and self.interval_s > 0:
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
        self._each_node(
            {
                addr: pb.UnregisterProducerRequest(
                    client_id=self.client_id, producer_group=self.group, topics=topics
                )
                for addr, topics in self._beaten.items()
            },
            "UnregisterProducer",
        )

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.clear()
            self._beat()
            self._wake.wait(self.interval_s)

    def _beat(self) -> None:
        nodes = self._nodes()
        self._each_node(
            {
                addr: pb.ProducerHeartbeatRequest(
                    client_id=self.client_id,
                    producer_group=self.group,
                    language=CLIENT_LANGUAGE,
                    client_version=CLIENT_VERSION,
                    topics=topics,
                )
                for addr, topics in nodes.items()
            },
            "ProducerHeartbeat",
        )
        self._beaten = nodes

    def _nodes(self) -> dict[str, tuple[str, ...]]:
        """Every node of every group routing a topic sent to, with the topics its group
        routes (routes as cached)."""
        routes = self._routes()
        if routes is None:
            return {}
        with self._lock:
            topics = sorted(self._topics)
        out: dict[str, list[str]] = {}
        for topic in topics:
            try:
                route = routes.get_route(topic)
            except MQClientError as exc:
                log.debug("producer heartbeat: no route for topic=%s: %s", topic, exc)
                continue
            for g in route.groups:
                for addr in g.addrs:
                    out.setdefault(addr, []).append(topic)
        return {addr: tuple(names) for addr, names in out.items()}

    def _each_node(self, requests: dict[str, object], rpc: str) -> None:
        calls = []
        for addr, request in requests.items():
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
