"""NameServer access and broker-group routing.

A NameServer is picked at random from ``namesrv_addr`` (``a:9876;b:9876``) and kept until a
call to it fails; then the others are tried in random order. Topic routes are cached and
refreshed when older than ``poll_name_server_interval_s`` (RocketMQ's
``pollNameServerInterval``, 30 s) and at once after an error.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

import grpc
from raftmq.broker.v1 import broker_pb2_grpc as bpb_grpc
from raftmq.nameserver.v1 import nameserver_pb2 as ns_pb
from raftmq.nameserver.v1 import nameserver_pb2_grpc as ns_grpc

from client.errors import MQClientError
from client.message import MessageQueue
from mqcli.addrs import namesrv_addrs
from mqerrors import codes as E
from mqsecurity.channels import PLAINTEXT, ClientSecurity, open_channel

log = logging.getLogger(__name__)

# RocketMQ's pollNameServerInterval: how old a cached route may get.
POLL_NAME_SERVER_INTERVAL_S = 30.0
# One NameServer call; a dead NameServer must not stall a client for long.
NAMESRV_RPC_TIMEOUT_S = 3.0
# Between attempts on a group with no known or reachable leader (an election is running).
NO_LEADER_BACKOFF_S = 0.1
# At most this many NOT_LEADER hops before a route refresh (a group has at most 7 nodes).
MAX_REDIRECTS = 8
# RocketMQ PermName bits.
PERM_READ = 4
PERM_WRITE = 2

T = TypeVar("T")
# gRPC's default reconnect backoff grows 1 s, 1.6 s, 2.56 s, ... to 120 s: a channel to a node
# that was down stays unusable for seconds after the node is back, and when that node is the
# new leader every send waits for it (measured: failovers of 2.5 s instead of 0.9 s). Broker
# nodes are few and on a LAN: retry connecting quickly.
CHANNEL_OPTIONS = (
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
)


def retry_wait_s(err: MQClientError, floor_s: float = NO_LEADER_BACKOFF_S) -> float:
    """How long to wait before retrying after ``err``: the server's hint, at least ``floor_s``
    (no hint: an election or a dead node, which :data:`NO_LEADER_BACKOFF_S` covers)."""
    return max(err.retry_after_ms / 1000, floor_s)


def parse_namesrv_addr(namesrv_addr: str) -> list[str]:
    """``host[:port];...`` -> ``host:port`` entries; a NameServer written without a port is at
    RocketMQ's 9876 (mqcli.addrs). An empty list or a bad entry: INVALID_NAMESRV_ADDR."""
    try:
        return namesrv_addrs(namesrv_addr)
    except ValueError as exc:
        raise MQClientError.local(E.INVALID_NAMESRV_ADDR, str(exc)) from None


def first_namesrv_answer(
    channels: ChannelPool, namesrvs: list[str], call: Callable[[ns_grpc.NameServerStub], T]
) -> T:
    """``call`` on each NameServer of ``namesrvs`` (:func:`parse_namesrv_addr`: never empty)
    in order until one answers: one that is down or slow (``UNAVAILABLE``,
    ``DEADLINE_EXCEEDED``) passes the call on, any other error answer is raised at once. The
    admin tool's and the dashboard's NameServer reads; :class:`RouteClient` keeps a sticky
    NameServer for its lookups instead."""
    last: MQClientError | None = None
    for addr in namesrvs:
        try:
            return call(ns_grpc.NameServerStub(channels.get(addr)))
        except grpc.RpcError as exc:
            last = MQClientError.from_rpc(exc)
            if last.status not in ("UNAVAILABLE", "DEADLINE_EXCEEDED"):
                raise last from exc
    assert last is not None
    raise last


@dataclass(frozen=True, slots=True)
class BrokerGroupRoute:
    """One broker group serving a topic: its queues and where to send."""

    broker_name: str
    read_queue_nums: int
    write_queue_nums: int
    perm: int
    leader_addr: str  # "" while the group has no registered leader
    follower_addrs: tuple[str, ...]

    @property
    def addrs(self) -> tuple[str, ...]:
        return ((self.leader_addr,) if self.leader_addr else ()) + self.follower_addrs


@dataclass(frozen=True, slots=True)
class TopicRoute:
    topic: str
    groups: tuple[BrokerGroupRoute, ...]
    # Computed once per route (a producer picks a queue per send).
    _write: tuple[MessageQueue, ...] = field(init=False, repr=False, compare=False)
    _read: tuple[MessageQueue, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        write = tuple(
            MessageQueue(self.topic, g.broker_name, q)
            for g in self.groups
            if g.perm & PERM_WRITE
            for q in range(g.write_queue_nums)
        )
        read = tuple(
            MessageQueue(self.topic, g.broker_name, q)
            for g in self.groups
            if g.perm & PERM_READ
            for q in range(g.read_queue_nums)
        )
        object.__setattr__(self, "_write", write)
        object.__setattr__(self, "_read", read)

    def write_queues(self) -> list[MessageQueue]:
        return list(self._write)

    def write_queue_tuple(self) -> tuple[MessageQueue, ...]:
        """The writable queues without a copy (the producer's hot path)."""
        return self._write

    def read_queues(self) -> list[MessageQueue]:
        return list(self._read)

    def group(self, broker_name: str) -> BrokerGroupRoute | None:
        return next((g for g in self.groups if g.broker_name == broker_name), None)


class ChannelPool:
    """One gRPC channel per address, shared by every stub of a client. Every channel is
    opened as ``security`` says (TLS, a signature on every call, or plaintext by default):
    NameServers and broker nodes alike."""

    def __init__(self, security: ClientSecurity = PLAINTEXT) -> None:
        self.security = security
        self._lock = threading.Lock()
        self._channels: dict[str, grpc.Channel] = {}
        self._stubs: dict[str, bpb_grpc.BrokerStub] = {}  # made once per address

    def get(self, addr: str) -> grpc.Channel:
        with self._lock:
            ch = self._channels.get(addr)
            if ch is None:
                ch = open_channel(addr, self.security, CHANNEL_OPTIONS)
                self._channels[addr] = ch
            return ch

    def broker(self, addr: str) -> bpb_grpc.BrokerStub:
        stub = self._stubs.get(addr)
        if stub is None:
            stub = self._stubs[addr] = bpb_grpc.BrokerStub(self.get(addr))
        return stub

    def close(self) -> None:
        with self._lock:
            channels, self._channels = list(self._channels.values()), {}
            self._stubs = {}
        for ch in channels:
            ch.close()


class RouteClient:
    """Topic routes from the NameServers, cached, plus leader-following broker calls."""

    def __init__(
        self,
        namesrv_addr: str,
        channels: ChannelPool,
        poll_interval_s: float = POLL_NAME_SERVER_INTERVAL_S,
    ) -> None:
        self._namesrvs = parse_namesrv_addr(namesrv_addr)
        self._current = random.choice(self._namesrvs)
        self._channels = channels
        self._poll_interval_s = poll_interval_s
        self._lock = threading.Lock()
        self._routes: dict[str, tuple[float, TopicRoute]] = {}
        # Leaders learnt from NOT_LEADER redirects, fresher than the NameServer's view.
        self._leaders: dict[str, str] = {}

    def _query(self, topic: str) -> TopicRoute:
        others = [a for a in self._namesrvs if a != self._current]
        order = [self._current, *random.sample(others, len(others))]
        last: MQClientError | None = None
        for addr in order:
            try:
                resp = ns_grpc.NameServerStub(self._channels.get(addr)).GetRouteInfoByTopic(
                    ns_pb.GetRouteInfoByTopicRequest(topic=topic), timeout=NAMESRV_RPC_TIMEOUT_S
                )
            except grpc.RpcError as exc:
                err = MQClientError.from_rpc(exc)
                if err.status == "NOT_FOUND":
                    # Another NameServer may not have heard of the topic yet either; one
                    # answer that it does not exist is an answer, not a failure.
                    self._current = addr
                    raise err from exc
                log.warning("namesrv=%s failed: %s; trying another", addr, err)
                last = err
                continue
            self._current = addr
            return TopicRoute(
                topic,
                tuple(
                    BrokerGroupRoute(
                        g.broker_name,
                        g.read_queue_nums,
                        g.write_queue_nums,
                        g.perm,
                        g.leader_addr,
                        tuple(f.addr for f in g.followers),
                    )
                    for g in resp.groups
                ),
            )
        assert last is not None
        raise last

    def get_route(self, topic: str, force: bool = False) -> TopicRoute:
        now = time.monotonic()
        with self._lock:
            cached = self._routes.get(topic)
        if cached is not None and not force and now - cached[0] < self._poll_interval_s:
            return cached[1]
        route = self._query(topic)
        with self._lock:
            self._routes[topic] = (now, route)
            for g in route.groups:
                if g.leader_addr:
                    self._leaders[g.broker_name] = g.leader_addr
        return route

    def invalidate(self, topic: str) -> None:
        with self._lock:
            self._routes.pop(topic, None)

    def _candidates(self, topic: str, broker_name: str, refresh: bool) -> list[str]:
        try:
            route = self.get_route(topic, force=refresh)
        except MQClientError as exc:
            log.warning("route refresh for topic=%s failed: %s", topic, exc)
            with self._lock:
                cached = self._routes.get(topic)
            if cached is None:
                raise
            route = cached[1]
        group = route.group(broker_name)
        if group is None:
            raise MQClientError.local(E.NO_ROUTE, f"{broker_name} no longer serves {topic}")
        with self._lock:
            known = self._leaders.get(broker_name, "")
        first = [known] if known else []
        return first + [a for a in group.addrs if a not in first]

    def known_leader(self, broker_name: str) -> str:
        """The address of ``broker_name``'s leader as last learnt (a route, a redirect or an
        answer), or "" when none is known. Never blocks."""
        with self._lock:
            return self._leaders.get(broker_name, "")

    def learn_from_error(self, broker_name: str, err: MQClientError, addr: str) -> None:
        """After a call to ``addr`` failed with ``err``: follow a NOT_LEADER redirect's leader,
        or forget ``addr`` as the leader when the error says leadership may have moved (the
        next call looks for one). A leader that answered about itself (a full disk, back
        pressure) stays the known leader."""
        with self._lock:
            if err.code == E.NOT_LEADER and err.leader_addr:
                self._leaders[broker_name] = err.leader_addr
            elif err.leader_moved and self._leaders.get(broker_name) == addr:
                del self._leaders[broker_name]

    def call_leader(
        self,
        topic: str,
        broker_name: str,
        call: Callable[[bpb_grpc.BrokerStub, float], T],
        timeout_s: float,
    ) -> T:
        """``call(stub, rpc_timeout_s)`` on the group's leader: follows ``NOT_LEADER`` redirects
        (the error's ``leader_addr``), and while no leader is known or reachable tries the
        group's other nodes until ``timeout_s`` passes, waiting what the error's retry hint
        asks (at least :data:`NO_LEADER_BACKOFF_S`). A leader that refuses for a reason of
        its own (back pressure, a full table) is asked again after its hint, never replaced by
        another node. Errors that are not retryable, and a group refusing writes (a full disk),
        are raised at once; at ``timeout_s`` the last answer is raised as it came."""
        deadline = time.monotonic() + timeout_s
        candidates = self._candidates(topic, broker_name, refresh=False)
        addr = candidates[0] if candidates else ""
        hops = 0
        unknown = False  # an attempt may have been carried out: every later error says so
        while True:
            remaining = deadline - time.monotonic()
            if not addr:
                if remaining <= 0:
                    raise MQClientError(
                        E.NO_LEADER,
                        "UNAVAILABLE",
                        f"{broker_name}: no leader",
                        retryable=True,
                        outcome_unknown=unknown,
                    )
                time.sleep(min(NO_LEADER_BACKOFF_S, remaining))
                candidates = self._candidates(topic, broker_name, refresh=True)
                addr = candidates[0] if candidates else ""
                continue
            try:
                result = call(self._channels.broker(addr), max(remaining, 0.05))
            except grpc.RpcError as exc:
                err = MQClientError.from_rpc(exc).marked_unknown(unknown)
                unknown = err.outcome_unknown
                stop = not err.retryable or err.group_refuses_writes
                if stop or time.monotonic() >= deadline:
                    raise err from exc
                if err.code == E.NOT_LEADER and err.leader_addr and hops < MAX_REDIRECTS:
                    hops += 1
                    addr = err.leader_addr
                    continue
                if not err.leader_moved:
                    # Still the leader (back pressure, a full table): the same node again after
                    # its hint, or its answer now when the hint outlasts the timeout.
                    wait_s = retry_wait_s(err)
                    if wait_s >= deadline - time.monotonic():
                        raise err from exc
                    time.sleep(wait_s)
                    continue
                # No leader known (an election), the node is down or cut off: forget the
                # leader, back off a little and try the next node.
                hops = 0
                with self._lock:
                    if self._leaders.get(broker_name) == addr:
                        del self._leaders[broker_name]
                candidates = self._candidates(topic, broker_name, refresh=True)
                rest = [a for a in candidates if a != addr] or candidates
                time.sleep(min(retry_wait_s(err), max(deadline - time.monotonic(), 0)))
                addr = random.choice(rest) if rest else ""
                continue
            with self._lock:
                self._leaders[broker_name] = addr
            return result

    def any_addr(self, topic: str, broker_name: str) -> list[str]:
        """Every node of the group, the known leader first (for reads any node can serve)."""
        return self._candidates(topic, broker_name, refresh=False)
