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
# Names: RocketMQ's topic rule (letters, digits, %, -, _, |) and length limit, also used for
# cluster, group and node names, which RocketMQ does not restrict but we do.
MAX_NAME_LEN = 127
_NAME_RE = re.compile(r"^[%|a-zA-Z0-9_-]+$")
ROLE_LEADER = "LEADER"
ROLES = frozenset({"LEADER", "FOLLOWER", "CANDIDATE", "PRE_CANDIDATE"})
MAX_PERM = 7
MAX_QUEUE_NUMS = 1024


class NameServerError(Exception):
    """An error with a stable, machine-readable code (the first word of a gRPC detail)."""

    code = "NAMESERVER_ERROR"


class InvalidRequestError(NameServerError):
    code = "INVALID_REQUEST"


class TopicNotExistError(NameServerError):
    code = "TOPIC_NOT_EXIST"


class TooManyBrokersError(NameServerError):
    code = "TOO_MANY_BROKERS"


@dataclass(frozen=True, slots=True)
class TopicRoute:
    name: str
    read_queue_nums: int
    write_queue_nums: int
    perm: int


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

    @property
    def key(self) -> NodeKey:
        return (self.cluster, self.broker_name, self.node_id)


@dataclass(frozen=True, slots=True)
class Member:
    reg: Registration
    last_heartbeat_ms: int


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


def _check_name(what: str, value: str) -> None:
    if not value or len(value) > MAX_NAME_LEN or not _NAME_RE.match(value):
        raise InvalidRequestError(
            f"{what} {value!r} must be 1-{MAX_NAME_LEN} of letters, digits, %, -, _, |"
        )


def validate(reg: Registration) -> None:
    """Raise :class:`InvalidRequestError` naming the first bad field."""
    _check_name("cluster", reg.cluster)
    _check_name("broker_name", reg.broker_name)
    _check_name("node_id", reg.node_id)
    if reg.role not in ROLES:
        raise InvalidRequestError(f"role {reg.role!r} is not one of {sorted(ROLES)}")
    host, sep, port = reg.client_addr.rpartition(":")
    if not sep or not host or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise InvalidRequestError(f"client_addr {reg.client_addr!r} is not host:port")
    if reg.term < 0 or reg.heartbeat_period_ms < 0:
        raise InvalidRequestError("term and heartbeat_period_ms must be >= 0")
    if len(reg.topics) > MAX_TOPICS_PER_NODE:
        raise InvalidRequestError(f"{len(reg.topics)} topics exceed {MAX_TOPICS_PER_NODE}")
    for t in reg.topics:
        _check_name("topic", t.name)
        if not (
            0 <= t.read_queue_nums <= MAX_QUEUE_NUMS and 0 <= t.write_queue_nums <= MAX_QUEUE_NUMS
        ):
            raise InvalidRequestError(f"topic {t.name}: queue nums outside [0, {MAX_QUEUE_NUMS}]")
        if not 0 <= t.perm <= MAX_PERM:
            raise InvalidRequestError(f"topic {t.name}: perm {t.perm} outside [0, {MAX_PERM}]")


def _monotonic_ms() -> int:
    return int(time.monotonic() * 1000)


class RouteTable:
    """All registrations of one NameServer. Not thread-safe: one event loop owns it."""

    def __init__(
        self,
        broker_expired_time_ms: int = DEFAULT_BROKER_EXPIRED_TIME_MS,
        clock_ms: Callable[[], int] = _monotonic_ms,
        max_nodes: int = MAX_NODES,
    ) -> None:
        self.broker_expired_time_ms = broker_expired_time_ms
        self._clock_ms = clock_ms
        self._max_nodes = max_nodes
        self._members: dict[NodeKey, Member] = {}

    def __len__(self) -> int:
        return len(self._members)

    # ------------------------------------------------------------------ writes

    def register(self, reg: Registration) -> None:
        validate(reg)
        old = self._members.get(reg.key)
        if old is None and len(self._members) >= self._max_nodes:
            raise TooManyBrokersError(f"{self._max_nodes} nodes are registered already")
        self._members[reg.key] = Member(reg, self._clock_ms())
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
        removed = self._members.pop((cluster, broker_name, node_id), None) is not None
        if removed:
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

    def _authority(self, members: list[Member]) -> Registration:
        """Whose topic table speaks for the group: the leader, else the freshest member."""
        leader = self._leader(members)
        if leader is not None:
            return leader
        return max(members, key=lambda m: (m.reg.term, m.last_heartbeat_ms)).reg

    def leader(self, cluster: str, broker_name: str) -> Registration | None:
        return self._leader(self._groups().get((cluster, broker_name), []))

    def route(self, topic: str) -> list[GroupRoute]:
        """The groups serving ``topic``, sorted by (cluster, group); raises TopicNotExistError."""
        out: list[GroupRoute] = []
        for (cluster, name), members in self._groups().items():
            authority = self._authority(members)
            config = next((t for t in authority.topics if t.name == topic), None)
            if config is None:
                continue
            leader = self._leader(members)
            followers = tuple(m.reg for m in members if leader is None or m.reg is not leader)
            out.append(GroupRoute(cluster, name, config, leader, followers))
        if not out:
            raise TopicNotExistError(f"no broker group serves topic {topic!r}")
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
            topics.update(t.name for t in self._authority(members).topics)
        return sorted(topics)
