"""What the dashboard shows, read from a cluster through its NameServers: the NameServer's
cluster info and routes, each node's ``raftmq.dledger.v1.DLedgerClient/Metadata``, and the
broker's offsets, consumer lag, consumer lists and lookups (``raftmq.broker.v1.Broker``).

Every call has a deadline; a node that does not answer is shown with its error instead of
holding up the page. Nothing here writes to the cluster except the actions
(:meth:`GroupReader.resend_dlq`, :meth:`GroupReader.reset_offset`, the topic and subscription
group updates and deletes, :meth:`GroupReader.send_test`), which take the acting user's
security and which the web layer calls only after the user confirmed."""

from __future__ import annotations

import concurrent.futures
import dataclasses
import datetime as dt
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

import grpc
from raftmq.broker.v1 import broker_pb2 as pb
from raftmq.broker.v1 import broker_pb2_grpc as bpb_grpc
from raftmq.dledger.v1 import dledger_pb2 as dpb
from raftmq.dledger.v1 import dledger_pb2_grpc as dpb_grpc
from raftmq.nameserver.v1 import nameserver_pb2 as ns_pb
from raftmq.nameserver.v1 import nameserver_pb2_grpc as ns_grpc

from client.admin import MQAdmin, merged_consumers, merged_producers
from client.consumer import PullConsumer
from client.errors import MQClientError
from client.message import DLQ_PREFIX, Message, MessageExt, MessageQueue, SendResult
from client.producer import Producer
from client.route import (
    NAMESRV_RPC_TIMEOUT_S,
    ChannelPool,
    RouteClient,
    first_namesrv_answer,
    parse_namesrv_addr,
)
from mqerrors import codes as E
from mqsecurity.channels import PLAINTEXT, ClientSecurity

# One node's Metadata: a dead node must not hold a page up for long.
METADATA_TIMEOUT_S = 1.5
# One broker read (offsets, lag, lists), following the leader through an election.
READ_TIMEOUT_S = 4.0
# Topics whose offsets one page or sample reads (each costs one call per queue).
MAX_TOPICS = 200
# Messages one search or DLQ page shows.
MAX_MESSAGES = 200
# Messages a time-range search reads per queue before it stops (it says so).
MAX_SCAN_PER_QUEUE = 2_000
# Body bytes shown per message; the rest is cut (the page says how many bytes there are).
MAX_BODY_SHOWN_BYTES = 16 << 10
# The consumer group the dashboard's time-range reads pull as (pulls name a group; nothing
# is committed for it).
DASHBOARD_GROUP = "mqdashboard"
# How old a topic's route may be when a page or sample uses it: a topic extended to a group
# (mqcluster add-group, mqadmin updateTopic) shows that group's queues within this. Clients keep
# routes 30 s (pollNameServerInterval); the dashboard shows the cluster as it is. At the
# default sample interval (2 s) the sampler asks the NameServer for a route about every 5 s per
# topic (at most MAX_TOPICS).
ROUTE_MAX_AGE_S = 5.0
# How long a topic created or updated from a page may take to be routed by every group (the
# page waits for it; mqadmin's default is 15 s).
ACTION_TIMEOUT_S = 10.0
# The producer group of the dashboard's test sends (a producer group names the sender only).
SEND_GROUP = "mqdashboard-send"
# Keys and characters shown of one node's config (a node's answer is input too).
MAX_CONFIG_KEYS = 1_000
MAX_CONFIG_CHARS = 1_024
# Consumer groups whose client lists the clients page reads (one call per broker group each).
MAX_CLIENT_GROUPS = 50
# Calls in flight at once (Metadata of every node, offsets of every group).
MAX_PARALLEL_CALLS = 8
# A NameServer answer this recent (any read, the sampler's every interval) spares a page its
# check that the NameServer is reachable; older, the page asks once before reading.
NAMESRV_FRESH_S = 2.0
# The check's deadline per NameServer: a page with the NameServer down says so quickly.
NAMESRV_PROBE_TIMEOUT_S = 1.5

ROLE_NAMES = {v: k for k, v in ns_pb.BrokerRole.items()}
Call = Callable[[bpb_grpc.BrokerStub, float], object]
T = TypeVar("T")
# A member's view and, for a leader, each follower's lag in entries.
Sampled = tuple["NodeView", dict[str, int]]


@dataclass(frozen=True, slots=True)
class NodeView:
    """One member: as the NameServer registered it and as its own Metadata says."""

    node_id: str
    client_addr: str
    registered_role: str
    heartbeat_age_ms: int
    role: str = "UNREACHABLE"
    term: int = 0
    leader_id: str = ""
    commit_index: int = 0
    applied_index: int = 0
    last_index: int = 0
    lag: int | None = None  # entries behind the leader's last index (leader's view)
    disk_total_bytes: int = 0
    disk_free_bytes: int = 0
    # Replica health (docs/CLUSTER.md "Replica status"): the repair state and the damage
    # counters since the member's process started.
    repairing: bool = False
    promised_index: int = 0
    corruption_found: int = 0  # damaged entries found in its log, every finder
    chain_mismatches: int = 0  # in replication plus the leader's periodic chain check
    committed_repairs: int = 0
    derived_mismatches: int = 0  # the broker's derived-state records found wrong
    error: str = ""

    @property
    def corruption_counters(self) -> list[tuple[str, int]]:
        """The non-zero damage counters, named as the page shows them."""
        named = [
            ("damage found", self.corruption_found),
            ("chain mismatches", self.chain_mismatches),
            ("committed repairs", self.committed_repairs),
            ("derived mismatches", self.derived_mismatches),
        ]
        return [(name, n) for name, n in named if n]

    @property
    def disk_used_percent(self) -> float | None:
        if self.disk_total_bytes <= 0:
            return None
        return 100.0 * (self.disk_total_bytes - self.disk_free_bytes) / self.disk_total_bytes


@dataclass(frozen=True, slots=True)
class GroupView:
    cluster: str
    name: str
    leader_id: str  # as the NameServer has it registered
    nodes: list[NodeView]

    @property
    def term(self) -> int:
        return max((n.term for n in self.nodes), default=0)


@dataclass(frozen=True, slots=True)
class QueueRow:
    broker_name: str
    queue_id: int
    min_offset: int
    max_offset: int


@dataclass(frozen=True, slots=True)
class TopicView:
    name: str
    queues: list[QueueRow] = field(default_factory=list)
    error: str = ""

    @property
    def system(self) -> bool:
        return self.name.startswith(("%", "SCHEDULE_TOPIC", "RMQ_SYS_"))

    @property
    def messages(self) -> int:
        """Messages ever written (the sum of the queues' max offsets)."""
        return sum(q.max_offset for q in self.queues)

    @property
    def groups(self) -> list[tuple[str, int]]:
        """(broker group, its queues of the topic), in the route's order: how the topic is
        spread over the cluster's groups."""
        counts: dict[str, int] = {}
        for q in self.queues:
            counts[q.broker_name] = counts.get(q.broker_name, 0) + 1
        return list(counts.items())


@dataclass(frozen=True, slots=True)
class ConsumerGroupView:
    name: str
    topics: list[str]
    online_clients: int


@dataclass(slots=True)
class _GroupTally:
    """One consumer group as the nodes' ListConsumerGroups answers describe it."""

    topics: set[str] = field(default_factory=set)
    v1: dict[str, int] = field(default_factory=dict)  # broker group: its nodes' largest count
    v2_by_node: list[int] = field(default_factory=list)  # each answering node's, when online
    online_on: set[str] = field(default_factory=set)  # broker groups with a client online

    def add(self, broker_name: str, g: pb.ConsumerGroupInfo) -> None:
        self.topics.update(g.topics)
        if g.online_clients:
            self.v1[broker_name] = max(self.v1.get(broker_name, 0), g.online_clients)
        if g.online_v2_clients:
            self.v2_by_node.append(g.online_v2_clients)
        if g.online_clients or g.online_v2_clients:
            self.online_on.add(broker_name)

    def estimate(self) -> int:
        """Exact unless :meth:`ambiguous`: raftmq's clients are on every node of a broker
        group (its largest count), a RocketMQ 5 client on the node it is connected to."""
        return sum(self.v1.values()) + sum(self.v2_by_node)

    def ambiguous(self) -> bool:
        """Whether one client may be counted twice: by two broker groups (raftmq's heartbeat
        each serving their topics), or by two nodes (a RocketMQ 5 client connected to both)."""
        return len(self.online_on) > 1 or len(self.v2_by_node) > 1


@dataclass(frozen=True, slots=True)
class LagRow:
    topic: str
    broker_name: str
    queue_id: int
    min_offset: int
    max_offset: int
    committed_offset: int  # -1: none
    lag: int

    @property
    def consumed(self) -> int:
        """Messages of the queue the group is past (its committed offset, or the queue's
        start when it has none)."""
        return self.committed_offset if self.committed_offset >= 0 else self.min_offset


@dataclass(frozen=True, slots=True)
class ShownMessage:
    """A message as a page shows it: the body as text (cut to MAX_BODY_SHOWN_BYTES)."""

    topic: str
    msg_id: str
    offset_msg_id: str
    broker_name: str
    queue_id: int
    queue_offset: int
    tags: str
    keys: tuple[str, ...]
    properties: list[tuple[str, str]]
    body: str
    body_bytes: int
    body_cut: bool
    store_time: str
    born_time: str
    reconsume_times: int
    store_topic: str

    @classmethod
    def of(cls, m: MessageExt) -> ShownMessage:
        return cls(
            topic=m.topic,
            msg_id=m.msg_id,
            offset_msg_id=m.offset_msg_id,
            broker_name=m.broker_name,
            queue_id=m.queue_id,
            queue_offset=m.queue_offset,
            tags=m.tags,
            keys=m.keys,
            properties=sorted(m.properties.items()),
            body=m.body[:MAX_BODY_SHOWN_BYTES].decode("utf-8", errors="replace"),
            body_bytes=len(m.body),
            body_cut=len(m.body) > MAX_BODY_SHOWN_BYTES,
            store_time=format_ms(m.store_timestamp_ms),
            born_time=format_ms(m.born_timestamp_ms),
            reconsume_times=m.reconsume_times,
            store_topic=m.store_topic or m.topic,
        )


def format_ms(ms: int) -> str:
    """A timestamp in ms as UTC text, millisecond precision ("-" for 0)."""
    if ms <= 0:
        return "-"
    stamp = dt.datetime.fromtimestamp(ms / 1000, tz=dt.UTC)
    return stamp.strftime("%Y-%m-%d %H:%M:%S.") + f"{ms % 1000:03d} UTC"


def error_text(exc: BaseException) -> str:
    """One line for a page: the stable code and the server's message."""
    if isinstance(exc, MQClientError):
        return f"{exc.code} ({exc.status}): {exc.message}"
    if isinstance(exc, grpc.RpcError):
        return error_text(MQClientError.from_rpc(exc))
    return f"{type(exc).__name__}: {exc}"


class GroupReader:
    """Reads a cluster through ``namesrv_addr`` with ``security`` (the dashboard's own
    credentials: any user allowed to read). Thread-safe; :meth:`close` when done."""

    def __init__(self, namesrv_addr: str, security: ClientSecurity = PLAINTEXT) -> None:
        self.namesrv_addr = namesrv_addr
        self.security = security
        self.admin = MQAdmin(namesrv_addr, security)
        self.channels = ChannelPool(security)
        self.routes = RouteClient(namesrv_addr, self.channels, ROUTE_MAX_AGE_S)
        self._namesrvs = parse_namesrv_addr(namesrv_addr)
        self._namesrv_ok_at = float("-inf")  # monotonic time of the last NameServer answer
        self._pool = concurrent.futures.ThreadPoolExecutor(
            MAX_PARALLEL_CALLS, thread_name_prefix="mqdashboard-read"
        )

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        self.channels.close()

    # -- the NameServer --------------------------------------------------------------------

    def _namesrv(self, call: Callable[[ns_grpc.NameServerStub], object]) -> object:
        """``call`` on the first NameServer that answers, over the reader's own channels (the
        sampler asks every interval: no new TLS session each time)."""
        answer = first_namesrv_answer(self.channels, self._namesrvs, call)
        self._namesrv_ok_at = time.monotonic()
        return answer

    def namesrv_problem(self) -> str:
        """ "" when a NameServer answers (or answered within NAMESRV_FRESH_S); else what each
        NameServer's connection said, for the page's one banner. Any answer, even an error
        answer, shows the NameServer is reachable: the page's own reads report the rest."""
        if time.monotonic() - self._namesrv_ok_at < NAMESRV_FRESH_S:
            return ""
        failures = []
        for addr in self._namesrvs:
            try:
                ns_grpc.NameServerStub(self.channels.get(addr)).GetClusterInfo(
                    ns_pb.GetClusterInfoRequest(), timeout=NAMESRV_PROBE_TIMEOUT_S
                )
            except grpc.RpcError as exc:
                err = MQClientError.from_rpc(exc)
                if err.status not in ("UNAVAILABLE", "DEADLINE_EXCEEDED"):
                    break  # it answered (a refusal): reachable
                failures.append(f"{addr}: {error_text(err)}")
                continue
            break
        else:
            return "; ".join(failures)
        self._namesrv_ok_at = time.monotonic()
        return ""

    def cluster_info(self) -> ns_pb.GetClusterInfoResponse:
        resp = self._namesrv(
            lambda stub: stub.GetClusterInfo(
                ns_pb.GetClusterInfoRequest(), timeout=NAMESRV_RPC_TIMEOUT_S
            )
        )
        assert isinstance(resp, ns_pb.GetClusterInfoResponse)
        return resp

    # -- clusters, groups and nodes -------------------------------------------------------

    def clusters(self) -> list[GroupView]:
        """Every broker group the NameServer knows, each member as its Metadata says."""
        info = self.cluster_info()
        groups = [(c.name, g) for c in info.clusters for g in c.groups]
        futures = [[self._pool.submit(self._metadata, m) for m in g.members] for _, g in groups]
        views = []
        for (cluster, g), node_futures in zip(groups, futures, strict=True):
            nodes = _with_lag([f.result() for f in node_futures])
            views.append(GroupView(cluster, g.broker_name, g.leader_id, nodes))
        return views

    def _metadata(self, m: ns_pb.MemberInfo) -> Sampled:
        base = NodeView(
            m.node_id, m.client_addr, ROLE_NAMES.get(m.role, "?"), m.last_heartbeat_age_ms
        )
        try:
            md = dpb_grpc.DLedgerClientStub(self.channels.get(m.client_addr)).Metadata(
                dpb.MetadataRequest(), timeout=METADATA_TIMEOUT_S
            )
        except grpc.RpcError as exc:
            return dataclasses.replace(base, error=error_text(exc)), {}
        view = dataclasses.replace(
            base,
            role=md.role,
            term=md.term,
            leader_id=md.leader_id,
            commit_index=md.commit_index,
            applied_index=md.applied_index,
            last_index=md.last_index,
            disk_total_bytes=md.disk_total_bytes,
            disk_free_bytes=md.disk_free_bytes,
            repairing=md.repairing,
            promised_index=md.promised_index,
            corruption_found=sum(md.corruption_found.values()),
            chain_mismatches=md.chain_mismatches + md.chain_check_mismatches,
            committed_repairs=md.committed_repairs,
            derived_mismatches=sum(md.derived_mismatches.values()),
        )
        lags = {p.id: max(md.last_index - p.match_index, 0) for p in md.peers}
        return view, lags if md.role == "LEADER" else {}

    # -- topics -----------------------------------------------------------------------------

    def topic_names(self) -> list[str]:
        resp = self._namesrv(
            lambda stub: stub.GetAllTopicList(
                ns_pb.GetAllTopicListRequest(), timeout=NAMESRV_RPC_TIMEOUT_S
            )
        )
        assert isinstance(resp, ns_pb.GetAllTopicListResponse)
        return list(resp.topics)

    def topics(self, names: list[str] | None = None) -> list[TopicView]:
        """Each topic's queues and offsets (the first MAX_TOPICS names: ordinary topics
        before system ones)."""
        names = self.topic_names() if names is None else names
        ordered = sorted(names, key=lambda n: (TopicView(n).system, n))[:MAX_TOPICS]
        return list(self._pool.map(self.topic, ordered))

    def topic(self, name: str) -> TopicView:
        try:
            route = self.routes.get_route(name)
            rows: list[QueueRow] = []
            for g in route.groups:
                rows += self.routes.call_leader(
                    name,
                    g.broker_name,
                    _offsets_call(name, g.broker_name, g.read_queue_nums),
                    READ_TIMEOUT_S,
                )
            return TopicView(name, rows)
        except (MQClientError, grpc.RpcError) as exc:
            return TopicView(name, [], error_text(exc))

    # -- consumer groups --------------------------------------------------------------------

    def _leaders(self) -> dict[str, list[str]]:
        """Each broker group's member addresses, the registered leader first."""
        out: dict[str, list[str]] = {}
        for c in self.cluster_info().clusters:
            for g in c.groups:
                members = sorted(g.members, key=lambda m: m.node_id != g.leader_id)
                out[g.broker_name] = [m.client_addr for m in members]
        return out

    def _first_answer(self, addrs: list[str], call: Call) -> object:
        last: BaseException | None = None
        for addr in addrs:
            try:
                return call(self.channels.broker(addr), READ_TIMEOUT_S)
            except grpc.RpcError as exc:
                last = exc
        raise (
            MQClientError.from_rpc(last)
            if isinstance(last, grpc.RpcError)
            else MQClientError.local(E.NO_BROKER, "no broker group is registered")
        )

    def consumer_groups(self, exact_clients: bool = True) -> list[ConsumerGroupView]:
        """Every consumer group some node knows (offsets or live consumers).

        Every node of each broker group is asked (broker groups in parallel): a RocketMQ 5
        consumer is known only to the node it is connected to, often a follower, so a group
        whose only clients are such consumers is listed by that node alone. A raftmq client
        heartbeats every node of each broker group serving its topics, so each counts it:
        with ``exact_clients``, a group online on more than one broker group, or with
        RocketMQ 5 clients on more than one node, has its distinct clients read (GetConsumerList
        on every node of those broker groups); otherwise, and without ``exact_clients`` (the
        sampler, which shows no count, reads no lists), its count is each broker group's
        largest raftmq count plus every node's RocketMQ 5 count."""
        members = sorted(self._leaders().items())
        answers = list(self._pool.map(lambda g: self._groups_listed(*g), members))
        merged: dict[str, _GroupTally] = {}
        for (broker_name, _), per_node in zip(members, answers, strict=True):
            for answer in per_node:
                for g in answer.groups:
                    merged.setdefault(g.consumer_group, _GroupTally()).add(broker_name, g)
        views = []
        for name, tally in sorted(merged.items()):
            count = tally.estimate()
            if exact_clients and tally.ambiguous():
                serving = {b: addrs for b, addrs in members if b in tally.online_on}
                clients = self._connections_of(name, serving)
                count = len({(c.protocol, c.client_id) for _, c in clients})
            shown = sorted(t for t in tally.topics if not t.startswith("%"))
            views.append(ConsumerGroupView(name, shown, count))
        return views

    def _groups_listed(self, name: str, addrs: list[str]) -> list[pb.ListConsumerGroupsResponse]:
        """Every answering node's consumer groups of one broker group (none answering: its
        error)."""
        req = pb.ListConsumerGroupsRequest()

        def call(stub: bpb_grpc.BrokerStub, t: float) -> pb.ListConsumerGroupsResponse:
            resp: pb.ListConsumerGroupsResponse = stub.ListConsumerGroups(req, timeout=t)
            return resp

        return self._every_answer(name, addrs, call)

    def consumer_lag(self, group: str, topics: list[str]) -> list[LagRow]:
        """Per queue of each topic: the group's committed offset and lag."""
        rows: list[LagRow] = []
        for topic in topics[:MAX_TOPICS]:
            route = self.routes.get_route(topic)
            req = pb.GetConsumerLagRequest(consumer_group=group, topic=topic)

            def call(
                stub: bpb_grpc.BrokerStub, t: float, req: pb.GetConsumerLagRequest = req
            ) -> pb.GetConsumerLagResponse:
                resp: pb.GetConsumerLagResponse = stub.GetConsumerLag(req, timeout=t)
                return resp

            for g in route.groups:
                resp = self.routes.call_leader(topic, g.broker_name, call, READ_TIMEOUT_S)
                rows += [
                    LagRow(
                        topic,
                        g.broker_name,
                        q.queue_id,
                        q.min_offset,
                        q.max_offset,
                        q.committed_offset,
                        q.lag,
                    )
                    for q in resp.queues
                ]
        return rows

    def consumer_clients(self, group: str) -> list[tuple[str, str]]:
        """(broker group, client id) of every live consumer of ``group``: raftmq's and the
        RocketMQ 5 clients."""
        return [(name, c.client_id) for name, c in self._connections_of(group, self._leaders())]

    def _connections_of(
        self, group: str, members: dict[str, list[str]]
    ) -> list[tuple[str, ClientView]]:
        """(broker group, client) of the live consumers of ``group`` the nodes of each of
        ``members``' broker groups know, merged (every node is asked: a RocketMQ 5 consumer
        talks to one node only; each client once as heard last, raftmq's then RocketMQ 5's)."""
        req = pb.GetConsumerListRequest(consumer_group=group, with_connections=True)

        def call(stub: bpb_grpc.BrokerStub, t: float) -> pb.GetConsumerListResponse:
            resp: pb.GetConsumerListResponse = stub.GetConsumerList(req, timeout=t)
            return resp

        out: list[tuple[str, ClientView]] = []
        for name, addrs in sorted(members.items()):
            answers = self._every_answer(name, addrs, call)
            out += [(name, ClientView.of(group, c)) for c in merged_consumers(answers)]
        return out

    def _every_answer(
        self, name: str, addrs: list[str], call: Callable[[bpb_grpc.BrokerStub, float], T]
    ) -> list[T]:
        """``call``'s answers of every node of one broker group that answered (none
        answering: the last error)."""
        answers: list[T] = []
        error: MQClientError | None = None
        for addr in addrs:
            try:
                answers.append(call(self.channels.broker(addr), READ_TIMEOUT_S))
            except grpc.RpcError as exc:
                error = MQClientError.from_rpc(exc)
        if not answers and error is not None:
            raise MQClientError(error.code, error.status, f"{name}: {error.message}")
        return answers

    def producers(self) -> tuple[list[tuple[str, ClientView]], bool]:
        """(broker group, producer) of every live producer the nodes of each broker group know
        (every node: a RocketMQ 5 client heartbeats only the nodes it is connected to; at most
        1,000 per node), in parallel; and whether a node left some out."""
        groups = sorted(self._leaders().items())
        answers = list(self._pool.map(lambda g: self._producers_of(*g), groups))
        out = [
            (name, ClientView.of(p.producer_group, p.connection))
            for (name, _), per_node in zip(groups, answers, strict=True)
            for p in merged_producers(per_node)
        ]
        return out, any(a.truncated for per_node in answers for a in per_node)

    def _producers_of(self, name: str, addrs: list[str]) -> list[pb.GetProducerConnectionsResponse]:
        """Every answering node's producers of one broker group (none answering: its error)."""
        req = pb.GetProducerConnectionsRequest()

        def call(stub: bpb_grpc.BrokerStub, t: float) -> pb.GetProducerConnectionsResponse:
            resp: pb.GetProducerConnectionsResponse = stub.GetProducerConnections(req, timeout=t)
            return resp

        return self._every_answer(name, addrs, call)

    def dead_letters(self, group: str) -> list[ShownMessage]:
        """The first MAX_MESSAGES messages of ``%DLQ%{group}`` (none when it does not exist)."""
        if DLQ_PREFIX + group not in self.topic_names():
            return []
        return [ShownMessage.of(m) for m in self.admin.dlq_messages(group, MAX_MESSAGES)]

    # -- messages ---------------------------------------------------------------------------

    def by_key(self, topic: str, key: str) -> list[ShownMessage]:
        return [ShownMessage.of(m) for m in self.admin.query_msg_by_key(topic, key, 32)]

    def by_id(self, topic: str, msg_id: str) -> list[ShownMessage]:
        return [ShownMessage.of(self.admin.query_msg_by_id(topic, msg_id))]

    def by_time(self, topic: str, begin_ms: int, end_ms: int) -> tuple[list[ShownMessage], bool]:
        """Messages of ``topic`` stored in [begin_ms, end_ms), oldest first per queue, at most
        MAX_MESSAGES; and whether the search stopped at a limit before the end."""
        found: list[MessageExt] = []
        cut = False
        with PullConsumer(DASHBOARD_GROUP, self.namesrv_addr, self.security) as consumer:
            for mq in consumer.fetch_queues(topic):
                start = self._search(mq, begin_ms)
                stop = self._search(mq, end_ms)
                got, more = _pull_range(consumer, mq, start, stop, MAX_MESSAGES - len(found))
                found += [m for m in got if begin_ms <= m.store_timestamp_ms < end_ms]
                cut = cut or more
                if len(found) >= MAX_MESSAGES:
                    cut = True
                    break
        found.sort(key=lambda m: m.store_timestamp_ms)
        return [ShownMessage.of(m) for m in found[:MAX_MESSAGES]], cut

    def _search(self, mq: MessageQueue, timestamp_ms: int) -> int:
        resp = self.routes.call_leader(
            mq.topic,
            mq.broker_name,
            lambda stub, t: stub.SearchOffset(
                pb.SearchOffsetRequest(
                    topic=mq.topic, queue_id=mq.queue_id, timestamp_ms=timestamp_ms
                ),
                timeout=t,
            ),
            READ_TIMEOUT_S,
        )
        return int(resp.queue_offset)

    # -- resend and reset ---------------------------------------------------------------------

    def resend_dlq(self, group: str, msg_id: str, security: ClientSecurity) -> list[str]:
        """Send dead letters of ``group`` (one, or all when ``msg_id`` is empty) back to their
        topics as ``security``; the new messages' ids."""
        admin = MQAdmin(self.namesrv_addr, security)
        return [r.msg_id for _, r in admin.resend_dlq(group, msg_id, "mqdashboard-dlq")]

    def reset_offset(
        self, group: str, topic: str, timestamp_ms: int, security: ClientSecurity
    ) -> list[tuple[str, int, int]]:
        """Move ``group``'s offsets of ``topic`` to the first message stored at or after
        ``timestamp_ms``, as ``security``; (broker group, queue, offset) set."""
        admin = MQAdmin(self.namesrv_addr, security)
        done = admin.reset_offset_by_time(group, topic, timestamp_ms)
        return [(r.broker_name, r.queue_id, r.offset) for r in done]

    # -- logins -----------------------------------------------------------------------------

    def check_user(self, security: ClientSecurity) -> list[str]:
        """Authenticate ``security``'s user with every broker group (each keeps its own users):
        one signed ``GetBrokerConfig`` read (``Cluster Get``) on a member of each.
        ``UNAUTHENTICATED`` (an unknown AccessKey, a wrong SecretKey, a disabled user) is
        raised naming the group; an answer or ``PERMISSION_DENIED`` (a user that may not read
        the cluster: authenticated all the same) passes. The broker groups checked."""
        leaders = self._leaders()
        if not leaders:
            raise MQClientError.local(E.NO_BROKER, "no broker group is registered")
        channels = ChannelPool(security)
        try:
            for name, addrs in sorted(leaders.items()):
                self._authenticate(channels, name, addrs)
        finally:
            channels.close()
        return sorted(leaders)

    @staticmethod
    def _authenticate(channels: ChannelPool, broker_name: str, addrs: list[str]) -> None:
        last: MQClientError | None = None
        for addr in addrs:  # the registered leader first; a dead member passes to the next
            try:
                channels.broker(addr).GetBrokerConfig(
                    pb.GetBrokerConfigRequest(), timeout=METADATA_TIMEOUT_S
                )
                return
            except grpc.RpcError as exc:
                err = MQClientError.from_rpc(exc)
                if err.status == "PERMISSION_DENIED":
                    return  # authorization comes after authentication: the user is known
                if err.status == "UNAUTHENTICATED":
                    raise MQClientError(
                        err.code, err.status, f"{broker_name}: {err.message}"
                    ) from exc
                last = err
        if last is None:
            raise MQClientError.local(E.NO_BROKER, f"{broker_name}: no member is registered")
        raise MQClientError(last.code, last.status, f"{broker_name}: {last.message}")

    # -- broker configs and clients ---------------------------------------------------------

    def broker_configs(self) -> list[NodeConfig]:
        """Every registered node's broker.conf as it runs (``GetBrokerConfig``: credentials
        only as "(set)"), in parallel; a node that does not answer has its error."""
        members = [
            (g.broker_name, m)
            for c in self.cluster_info().clusters
            for g in c.groups
            for m in sorted(g.members, key=lambda m: m.node_id)
        ]
        return list(self._pool.map(lambda bm: self._config_of(*bm), members))

    def _config_of(self, broker_name: str, m: ns_pb.MemberInfo) -> NodeConfig:
        try:
            resp = self.channels.broker(m.client_addr).GetBrokerConfig(
                pb.GetBrokerConfigRequest(), timeout=READ_TIMEOUT_S
            )
        except grpc.RpcError as exc:
            return NodeConfig(broker_name, m.node_id, m.client_addr, {}, error_text(exc))
        items = sorted(resp.config.items())[:MAX_CONFIG_KEYS]
        config = {k[:MAX_CONFIG_CHARS]: v[:MAX_CONFIG_CHARS] for k, v in items}
        return NodeConfig(broker_name, m.node_id, m.client_addr, config)

    def clients(self) -> list[tuple[str, ClientView]]:
        """(broker group, consumer) of every live consumer, for the first MAX_CLIENT_GROUPS
        consumer groups with one online."""
        members = self._leaders()
        online = self._online_groups(members)
        out: list[tuple[str, ClientView]] = []
        for group in online[:MAX_CLIENT_GROUPS]:
            out += self._connections_of(group, members)
        return out

    def _online_groups(self, members: dict[str, list[str]]) -> list[str]:
        """The consumer groups with a live consumer on some node of ``members``, by name:
        every node is asked, as a RocketMQ 5 consumer is known to the nodes it is connected
        to only."""
        req = pb.ListConsumerGroupsRequest()

        def call(stub: bpb_grpc.BrokerStub, t: float) -> pb.ListConsumerGroupsResponse:
            resp: pb.ListConsumerGroupsResponse = stub.ListConsumerGroups(req, timeout=t)
            return resp

        online: set[str] = set()
        for name, addrs in sorted(members.items()):
            for answer in self._every_answer(name, addrs, call):
                online.update(
                    g.consumer_group
                    for g in answer.groups
                    if g.online_clients or g.online_v2_clients
                )
        return sorted(online)

    # -- the operations (topics, subscription groups, a test send), confirmed likewise -------

    def broker_names(self) -> list[str]:
        """Every broker group the NameServer knows, for the forms' "on one group" choice."""
        return sorted(self._leaders())

    def _leader_addr(self, broker_name: str) -> str:
        """The registered leader's address of ``broker_name`` (its first member without
        one: the admin call follows NOT_LEADER to the leader)."""
        addrs = self._leaders().get(broker_name)
        if not addrs:
            raise MQClientError.local(E.NO_BROKER, f"no broker group {broker_name} is registered")
        return addrs[0]

    def update_topic(
        self, spec: TopicSpec, broker_name: str, security: ClientSecurity
    ) -> list[str]:
        """Create or update ``spec.topic`` on every broker group (or only ``broker_name``) as
        ``security``; the broker groups that route it."""
        return MQAdmin(self.namesrv_addr, security).create_topic(
            spec.topic,
            spec.queues,
            perm=spec.perm,
            message_type=spec.message_type,
            broker_names=(broker_name,) if broker_name else (),
            timeout_s=ACTION_TIMEOUT_S,
        )

    def delete_topic(self, topic: str, broker_name: str, security: ClientSecurity) -> list[str]:
        """Delete ``topic`` from every broker group serving it (or only ``broker_name``) as
        ``security``; the broker groups it was deleted from."""
        only = (broker_name,) if broker_name else ()
        return MQAdmin(self.namesrv_addr, security).delete_topic(topic, only)

    def update_group(
        self, config: pb.SubscriptionGroup, broker_name: str, security: ClientSecurity
    ) -> list[tuple[str, pb.SubscriptionGroup]]:
        """Create or replace a subscription group's config on every broker group (or only
        ``broker_name``) as ``security``; (broker group, config as applied)."""
        addr = self._leader_addr(broker_name) if broker_name else ""
        done = MQAdmin(self.namesrv_addr, security).update_sub_group(config, broker_addr=addr)
        return [(broker_name or name, c) for name, c in sorted(done.items())]

    def delete_group(self, group: str, broker_name: str, security: ClientSecurity) -> list[str]:
        """Drop a subscription group's config from every broker group (or only
        ``broker_name``) as ``security``; the broker groups it was deleted from."""
        addr = self._leader_addr(broker_name) if broker_name else ""
        done = MQAdmin(self.namesrv_addr, security).delete_sub_group(group, broker_addr=addr)
        return [broker_name] if broker_name else sorted(done)

    def send_test(self, msg: Message, security: ClientSecurity) -> SendResult:
        """Send ``msg`` once as ``security`` (producer group SEND_GROUP); the broker's answer."""
        # One-shot: no heartbeats (the Clients page lists applications' producers).
        with Producer(
            SEND_GROUP, self.namesrv_addr, security=security, heartbeat_interval_s=0
        ) as producer:
            return producer.send(msg)


@dataclass(frozen=True, slots=True)
class ClientView:
    """A live producer or consumer as the clients page shows it ("" where the client did not
    say: a client before 0.3.0 sends no language or version)."""

    group: str
    client_id: str
    address: str = ""
    language: str = ""
    version: str = ""
    protocol: str = ""
    heartbeat_age_ms: int = 0

    @classmethod
    def of(cls, group: str, c: pb.ClientConnection) -> ClientView:
        return cls(
            group,
            c.client_id,
            c.address,
            c.language,
            c.version,
            c.protocol,
            c.last_heartbeat_age_ms,
        )


@dataclass(frozen=True, slots=True)
class NodeConfig:
    """One node's broker.conf as ``GetBrokerConfig`` answered it."""

    broker_name: str
    node_id: str
    client_addr: str
    config: dict[str, str]
    error: str = ""


@dataclass(frozen=True, slots=True)
class TopicSpec:
    """A topic as the create/update form gives it (bounded by the web layer)."""

    topic: str
    queues: int
    perm: int
    message_type: str


def _with_lag(sampled: list[Sampled]) -> list[NodeView]:
    """Each node's lag as the leader that answered sees it (its own: 0); None without one."""
    leader = next(((n, lags) for n, lags in sampled if n.role == "LEADER"), None)
    out = []
    for n, _ in sampled:
        lag: int | None = None
        if leader is not None:
            lag = 0 if n is leader[0] else leader[1].get(n.node_id)
        out.append(dataclasses.replace(n, lag=lag))
    return out


def _offsets_call(
    topic: str, broker_name: str, queues: int
) -> Callable[[bpb_grpc.BrokerStub, float], list[QueueRow]]:
    def call(stub: bpb_grpc.BrokerStub, t: float) -> list[QueueRow]:
        rows = []
        for q in range(queues):
            r = stub.GetQueueOffsets(pb.GetQueueOffsetsRequest(topic=topic, queue_id=q), timeout=t)
            rows.append(QueueRow(broker_name, q, r.min_offset, r.max_offset))
        return rows

    return call


def _pull_range(
    consumer: PullConsumer, mq: MessageQueue, start: int, stop: int, room: int
) -> tuple[list[MessageExt], bool]:
    """Messages of ``mq`` from offset ``start`` up to ``stop``, at most ``room`` and at most
    MAX_SCAN_PER_QUEUE read; and whether a limit stopped it first."""
    out: list[MessageExt] = []
    offset, read = start, 0
    deadline = time.monotonic() + READ_TIMEOUT_S
    while offset < stop and len(out) < room:
        if read >= MAX_SCAN_PER_QUEUE or time.monotonic() > deadline:
            return out, True
        res = consumer.pull(mq, offset, min(32, stop - offset))
        if res.status != "FOUND" or res.next_begin_offset <= offset:
            break
        read += res.next_begin_offset - offset
        out += [m for m in res.messages if m.queue_offset < stop]
        offset = res.next_begin_offset
    return out[:room], len(out) > room


__all__ = [
    "ConsumerGroupView",
    "GroupReader",
    "GroupView",
    "LagRow",
    "NodeConfig",
    "NodeView",
    "QueueRow",
    "ShownMessage",
    "TopicSpec",
    "TopicView",
    "error_text",
    "format_ms",
]
