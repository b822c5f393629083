"""The NameServer's route table: who is registered, who leads each group, which groups serve
which topic. Pure: no I/O, and the clock is injected, so the unit tests drive expiry.

Every broker node registers itself (its cluster, group, node id, Raft role and term, client
address and whole topic table). A node is keyed by (cluster, group, node id); a registration
replaces the previous one of the same node. The leader of a group is the registered member with
role LEADER and the highest term (a killed leader's stale registration has a lower term than
its successor's). A group's topics are the leader's topic table, or, while there is no
leader, the table of the member with the highest term (then the latest heartbeat).
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from mqerrors import codes as E

logger = logging.getLogger(__name__)

# RocketMQ's NameServer default brokerChannelExpiredTime: 2 minutes of silence drops a node.
DEFAULT_BROKER_EXPIRED_TIME_MS = 120_000
# RocketMQ scans for silent brokers every 10 s.
DEFAULT_SCAN_INTERVAL_MS = 10_000
# Bounds memory against a misbehaving registrant: far more nodes than any real deployment.
MAX_NODES = 10_000
# A topic table bigger than this in one registration is refused (RocketMQ brokers with
# hundreds of thousands of topics exist but need a different design than one message).
MAX_TOPICS_PER_NODE = 100_000
# Topic entries over all registrations together: each costs about 250 bytes of memory at the
# longest name, so this caps the table near 250 MB whatever registrants send (10 groups of 3
# nodes at 30,000 topics each fit).
MAX_TOPIC_ENTRIES = 1_000_000
# Names: RocketMQ's topic rule (letters, digits, %, -, _, |) and length limit, also used for
# cluster, group and node names, which RocketMQ does not restrict but we do.
MAX_NAME_LEN = 127
_NAME_RE = re.compile(r"^[%|a-zA-Z0-9_-]+$")
# A client address is host:port; a host is at most a DNS name's 253 characters (an IPv6
# literal in brackets, with a zone, is shorter), of the characters hosts are written with.
MAX_HOST_LEN = 253
_HOST_RE = re.compile(r"^[A-Za-z0-9._%:\[\]-]+$")
# A heartbeat period above a day means the node never expects to be heard from (the broker's
# own registerBrokerPeriod is at most 10 minutes).
MAX_HEARTBEAT_PERIOD_MS = 24 * 3600 * 1000
# Characters of a refused value quoted in an error detail: enough to recognise it, never the
# input itself (details must stay far below gRPC's metadata limit).
ECHO_MAX_CHARS = 64
ROLE_LEADER = "LEADER"
ROLES = frozenset({"LEADER", "FOLLOWER", "CANDIDATE", "PRE_CANDIDATE"})
MAX_PERM = 7
MAX_QUEUE_NUMS = 1024
# A release string ("0.3.0.dev0"): a PEP 440 version is a few characters of these.
MAX_RELEASE_LEN = 32
_RELEASE_RE = re.compile(r"^[A-Za-z0-9.+_-]*$")
# Feature levels count releases that changed a group's formats (dledger.core.membership
# MAX_FEATURE_LEVEL bounds the same number in a CONFIG entry).
MAX_FEATURE_LEVEL = 1 << 16


class NameServerError(Exception):
    """An error with a stable, machine-readable code (the first word of a gRPC detail)."""

    code = E.NAMESERVER_ERROR


class InvalidRequestError(NameServerError):
    code = E.INVALID_REQUEST


class TopicNotExistError(NameServerError):
    code = E.TOPIC_NOT_EXIST


class TooManyBrokersError(NameServerError):
    code = E.TOO_MANY_BROKERS


class TooManyTopicsError(NameServerError):
    code = E.TOO_MANY_TOPICS


# RocketMQ 5's topic attribute message.type ("" = MIXED, as from a broker predating it).
MESSAGE_TYPES = frozenset({"", "MIXED", "NORMAL", "FIFO", "DELAY", "TRANSACTION"})


@dataclass(frozen=True, slots=True)
class TopicRoute:
    name: str
    read_queue_nums: int
    write_queue_nums: int
    perm: int
    message_type: str = ""


NodeKey = tuple[str, str, str]  # cluster, broker group name, node id


@dataclass(frozen=True, slots=True)
class Registration:
    cluster: str
    broker_name: str
    node_id: str
    role: str
    client_addr: str
    term: int
    topics: tuple[TopicRoute, ...]
    heartbeat_period_ms: int = 0
    rmq5_addr: str = ""  # the RocketMQ 5 port, "" when not served
    # Its release, the feature level it supports and its group's ("" / 0: a release before
    # feature levels).
    release: str = ""
    supported_feature_level: int = 0
    feature_level: int = 0
    # The RocketMQ remoting port 4.x clients are routed to (docs/REMOTING.md); "": not served.
    remoting_addr: str = ""

    @property
    def key(self) -> NodeKey:
        return (self.cluster, self.broker_name, self.node_id)


@dataclass(frozen=True, slots=True)
class Member:
    reg: Registration
    last_heartbeat_ms: int
    # reg.topics by name: a route lookup is one dict probe per group, not a scan of the table.
    topics_by_name: dict[str, TopicRoute]


@dataclass(frozen=True, slots=True)
class GroupRoute:
    cluster: str
    broker_name: str
    topic: TopicRoute
    leader: Registration | None
    followers: tuple[Registration, ...]


@dataclass(frozen=True, slots=True)
class GroupInfo:
    cluster: str
    broker_name: str
    leader_id: str
    members: tuple[tuple[Registration, int], ...]  # (registration, heartbeat age ms)


def show(value: str) -> str:
    """``value`` quoted for an error detail, cut to :data:`ECHO_MAX_CHARS` characters."""
    if len(value) <= ECHO_MAX_CHARS:
        return repr(value)
    return f"{value[:ECHO_MAX_CHARS]!r}... ({len(value)} chars)"


def check_name(what: str, value: str) -> None:
    """Raise :class:`InvalidRequestError` unless ``value`` is a valid name."""
    if not value or len(value) > MAX_NAME_LEN or not _NAME_RE.match(value):
        raise InvalidRequestError(
            f"{what} {show(value)} must be 1-{MAX_NAME_LEN} of letters, digits, %, -, _, |"
        )


def _check_addr(addr: str, what: str = "client_addr") -> None:
    host, sep, port = addr.rpartition(":")
    if (
        not sep
        or not host
        or len(host) > MAX_HOST_LEN
        or not _HOST_RE.match(host)
        or not (port.isascii() and port.isdigit() and len(port) <= 5)
        or not 1 <= int(port) <= 65535
    ):
        raise InvalidRequestError(
            f"{what} {show(addr)} is not host:port (host 1-{MAX_HOST_LEN} characters)"
        )


def validate(reg: Registration) -> dict[str, TopicRoute]:
    """Raise :class:`InvalidRequestError` naming the first bad field; return the topics by
    name (a topic listed twice is refused)."""
    check_name("cluster", reg.cluster)
    check_name("broker_name", reg.broker_name)
    check_name("node_id", reg.node_id)
    if reg.role not in ROLES:
        raise InvalidRequestError(f"role {show(reg.role)} is not one of {sorted(ROLES)}")
    _check_addr(reg.client_addr)
    if reg.rmq5_addr:
        _check_addr(reg.rmq5_addr, "rmq5_addr")
    if reg.remoting_addr:
        _check_addr(reg.remoting_addr, "remoting_addr")
    if reg.term < 0:
        raise InvalidRequestError(f"term {reg.term} must be >= 0")
    if len(reg.release) > MAX_RELEASE_LEN or not _RELEASE_RE.match(reg.release):
        raise InvalidRequestError(
            f"release {show(reg.release)} must be at most {MAX_RELEASE_LEN} of letters, digits "
            "and . + _ -"
        )
    if not (
        0 <= reg.supported_feature_level <= MAX_FEATURE_LEVEL
        and 0 <= reg.feature_level <= MAX_FEATURE_LEVEL
    ):
        raise InvalidRequestError(f"feature levels outside [0, {MAX_FEATURE_LEVEL}]")
    if not 0 <= reg.heartbeat_period_ms <= MAX_HEARTBEAT_PERIOD_MS:
        raise InvalidRequestError(
            f"heartbeat_period_ms {reg.heartbeat_period_ms} outside [0, {MAX_HEARTBEAT_PERIOD_MS}]"
        )
    if len(reg.topics) > MAX_TOPICS_PER_NODE:
        raise InvalidRequestError(f"{len(reg.topics)} topics exceed {MAX_TOPICS_PER_NODE}")
    by_name: dict[str, TopicRoute] = {}
    for t in reg.topics:
        check_name("topic", t.name)
        if not (
            0 <= t.read_queue_nums <= MAX_QUEUE_NUMS and 0 <= t.write_queue_nums <= MAX_QUEUE_NUMS
        ):
            raise InvalidRequestError(f"topic {t.name}: queue nums outside [0, {MAX_QUEUE_NUMS}]")
        if not 0 <= t.perm <= MAX_PERM:
            raise InvalidRequestError(f"topic {t.name}: perm {t.perm} outside [0, {MAX_PERM}]")
        if t.message_type not in MESSAGE_TYPES:
            raise InvalidRequestError(
                f"topic {t.name}: message type {show(t.message_type)} is not one of "
                f"{sorted(MESSAGE_TYPES)}"
            )
        if by_name.setdefault(t.name, t) is not t:
            raise InvalidRequestError(f"topic {t.name} is listed twice")
    return by_name


def _monotonic_ms() -> int:
    return int(time.monotonic() * 1000)


class RouteTable:
    """All registrations of one NameServer. Not thread-safe: one event loop owns it."""

    def __init__(
        self,
        broker_expired_time_ms: int = DEFAULT_BROKER_EXPIRED_TIME_MS,
        clock_ms: Callable[[], int] = _monotonic_ms,
        max_nodes: int = MAX_NODES,
        max_topic_entries: int = MAX_TOPIC_ENTRIES,
    ) -> None:
        self.broker_expired_time_ms = broker_expired_time_ms
        self._clock_ms = clock_ms
        self._max_nodes = max_nodes
        self._max_topic_entries = max_topic_entries
        self._members: dict[NodeKey, Member] = {}
        # Sum of len(reg.topics) over every member, kept up to date by every write.
        self._topic_entries = 0

    def __len__(self) -> int:
        return len(self._members)

    # ------------------------------------------------------------------ writes

    @property
    def topic_entries(self) -> int:
        """Topic entries held over every registration (bounded by ``max_topic_entries``)."""
        return self._topic_entries

    def register(self, reg: Registration) -> None:
        by_name = validate(reg)
        old = self._members.get(reg.key)
        if old is None and len(self._members) >= self._max_nodes:
            raise TooManyBrokersError(f"{self._max_nodes} nodes are registered already")
        entries = self._topic_entries + len(reg.topics) - (len(old.reg.topics) if old else 0)
        if entries > self._max_topic_entries and len(reg.topics) > (
            len(old.reg.topics) if old else 0
        ):
            raise TooManyTopicsError(
                f"{len(reg.topics)} topics would exceed the table's "
                f"{self._max_topic_entries} topic entries"
            )
        self._members[reg.key] = Member(reg, self._clock_ms(), by_name)
        self._topic_entries = entries
        if old is None or (old.reg.role, old.reg.term, old.reg.client_addr) != (
            reg.role,
            reg.term,
            reg.client_addr,
        ):
            logger.info(
                "register cluster=%s group=%s node=%s role=%s term=%d addr=%s topics=%d",
                reg.cluster,
                reg.broker_name,
                reg.node_id,
                reg.role,
                reg.term,
                reg.client_addr,
                len(reg.topics),
            )

    def unregister(self, cluster: str, broker_name: str, node_id: str) -> bool:
        check_name("cluster", cluster)
        check_name("broker_name", broker_name)
        check_name("node_id", node_id)
        old = self._members.pop((cluster, broker_name, node_id), None)
        removed = old is not None
        if old is not None:
            self._topic_entries -= len(old.reg.topics)
            logger.info("unregister cluster=%s group=%s node=%s", cluster, broker_name, node_id)
        return removed

    def scan_expired(self) -> list[NodeKey]:
        """Drop nodes silent for more than ``broker_expired_time_ms``; return their keys."""
        now = self._clock_ms()
        gone = [
            k
            for k, m in self._members.items()
            if now - m.last_heartbeat_ms > self.broker_expired_time_ms
        ]
        for key in gone:
            m = self._members.pop(key)
            self._topic_entries -= len(m.reg.topics)
            logger.warning(
                "expire cluster=%s group=%s node=%s addr=%s silent_ms=%d",
                *key,
                m.reg.client_addr,
                now - m.last_heartbeat_ms,
            )
        return gone

    # ------------------------------------------------------------------ reads

    def _groups(self) -> dict[tuple[str, str], list[Member]]:
        groups: dict[tuple[str, str], list[Member]] = {}
        for (cluster, name, _), m in sorted(self._members.items()):
            groups.setdefault((cluster, name), []).append(m)
        return groups

    @staticmethod
    def _leader(members: Iterable[Member]) -> Registration | None:
        leaders = [m.reg for m in members if m.reg.role == ROLE_LEADER]
        return max(leaders, key=lambda r: r.term) if leaders else None

    @staticmethod
    def _authority(members: list[Member]) -> Member:
        """Whose topic table speaks for the group: the leader (the one with the highest
        term), else the freshest member."""
        leaders = [m for m in members if m.reg.role == ROLE_LEADER]
        if leaders:
            return max(leaders, key=lambda m: m.reg.term)
        return max(members, key=lambda m: (m.reg.term, m.last_heartbeat_ms))

    def leader(self, cluster: str, broker_name: str) -> Registration | None:
        return self._leader(self._groups().get((cluster, broker_name), []))

    def route(self, topic: str) -> list[GroupRoute]:
        """The groups serving ``topic``, sorted by (cluster, group); raises TopicNotExistError."""
        check_name("topic", topic)
        out: list[GroupRoute] = []
        for (cluster, name), members in self._groups().items():
            config = self._authority(members).topics_by_name.get(topic)
            if config is None:
                continue
            leader = self._leader(members)
            followers = tuple(m.reg for m in members if leader is None or m.reg is not leader)
            out.append(GroupRoute(cluster, name, config, leader, followers))
        if not out:
            raise TopicNotExistError(f"no broker group serves topic {show(topic)}")
        return out

    def cluster_info(self) -> list[GroupInfo]:
        now = self._clock_ms()
        out = []
        for (cluster, name), members in self._groups().items():
            leader = self._leader(members)
            out.append(
                GroupInfo(
                    cluster,
                    name,
                    leader.node_id if leader else "",
                    tuple((m.reg, now - m.last_heartbeat_ms) for m in members),
                )
            )
        return out

    def all_topics(self) -> list[str]:
        topics: set[str] = set()
        for members in self._groups().values():
            topics.update(self._authority(members).topics_by_name)
        return sorted(topics)
