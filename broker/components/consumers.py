"""The consumer registry and queue locks of one node (memory only, as RocketMQ's).

Consumers announce themselves by heartbeat and are forgotten after CONSUMER_EXPIRE_MS of
silence (or when they unregister), which frees their queue locks. Only the leader grants
locks; every node records the locks a heartbeat reports, so a new leader honours them.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Sequence
from typing import NamedTuple, Protocol

from broker.components.applied import require_leader
from broker.components.locks import (
    NOBODY,
    ClientInfo,
    ConsumerTable,
    LiveClient,
    Owner,
    QueueLockTable,
)
from broker.components.pulling import parse_subscription
from broker.components.topics import Topics
from broker.state.errors import InvalidRequestError
from broker.state.machine import QueueKey
from broker.state.message import validate_topic
from broker.state.names import validate_group_name

# A client id (RocketMQ's "ip@instance[@unit]", well below this) is kept per consumer and lock.
MAX_CLIENT_ID_CHARS = 255
# Subscriptions in one heartbeat: one per topic the consumer reads (plus its retry topic);
# checked, not kept.
MAX_SUBSCRIPTIONS = 1024
# Queues in one lock or unlock request or one heartbeat's locked list (RocketMQ locks per
# broker group, at most a few hundred queues per consumer).
MAX_LOCK_BATCH = 4096
# A client's language and release as it reports them (RocketMQ's LanguageCode names and
# versions such as "V5_3_1" or "5.0.7" are far shorter): printable ASCII up to this length.
MAX_CLIENT_INFO_CHARS = 64
# A consumer's subscriptions kept for consumerStatus: up to this many characters of topics and
# expressions (a heartbeat may carry 1,024 subscriptions of up to 4 KB each; kept whole, 10,000
# consumers could hold gigabytes). 512 characters per consumer (what an operator reads in a
# listing: tens of topics with short expressions) is at most ~5 MB for a full table, and keeps
# a table's cost a few hundred bytes per consumer as it was before versions were kept (2 KB
# each measured 6.2 MB for 2,000 consumers); the rest is left out and marked truncated.
MAX_KEPT_SUBSCRIPTION_CHARS = 512
# Groups in one ListConsumerGroups answer: a dashboard's page, not an export (a cluster with
# more groups than this is listed by name order up to it, with `truncated` set).
MAX_LISTED_GROUPS = 10_000


class V2Clients(Protocol):
    """The RocketMQ 5 clients one v2 port knows (broker.frontends.v2.clients.ClientTable)."""

    def in_group(self, group: str) -> list[tuple[LiveClient, int]]:
        """The group's live clients, each with its last Settings' or Heartbeat's age in ms."""
        ...

    def group_counts(self) -> Counter[str]:
        """The live clients per group."""
        ...


class GroupListing(NamedTuple):
    """One consumer group as ``ListConsumerGroups`` shows it."""

    group: str
    topics: list[str]  # topics with a committed offset, sorted
    online_clients: int
    online_v2_clients: int = 0  # RocketMQ 5 consumers connected to this node


def validate_client_id(client_id: str) -> None:
    if not client_id:
        raise InvalidRequestError("client_id is empty")
    if len(client_id) > MAX_CLIENT_ID_CHARS:
        raise InvalidRequestError(
            f"client_id is {len(client_id)} characters, more than {MAX_CLIENT_ID_CHARS}"
        )


def check_client_text(name: str, value: str) -> None:
    """A client's self-description (language, release): printable ASCII, bounded."""
    if len(value) > MAX_CLIENT_INFO_CHARS:
        raise InvalidRequestError(
            f"{name} is {len(value)} characters, more than {MAX_CLIENT_INFO_CHARS}"
        )
    if not all(" " <= ch <= "~" for ch in value):
        raise InvalidRequestError(f"{name} is not printable ASCII")


def client_info(
    address: str,
    language: str,
    version: str,
    subscriptions: Sequence[tuple[str, str]] = (),
    protocol: str = "v1",
) -> ClientInfo:
    """What a heartbeat says of its client, checked (language and version: INVALID_REQUEST
    when not short printable ASCII), with at most MAX_KEPT_SUBSCRIPTION_CHARS of its
    subscriptions kept."""
    check_client_text("language", language)
    check_client_text("client_version", version)
    kept: list[tuple[str, str]] = []
    chars = 0
    for topic, expression in subscriptions:
        chars += len(topic) + len(expression)
        if chars > MAX_KEPT_SUBSCRIPTION_CHARS:
            break
        kept.append((topic, expression))
    truncated = len(kept) < len(subscriptions)
    return ClientInfo(
        address[:MAX_CLIENT_ID_CHARS], language, version, protocol, tuple(kept), truncated
    )


def monotonic_ms() -> int:
    return int(time.monotonic() * 1000)


class ConsumerGroups:
    """Which consumers of each group are alive, and which queues they hold locked."""

    def __init__(self, topics: Topics) -> None:
        self.ctx = topics.ctx
        self.topics = topics
        cfg = self.ctx.cfg
        self.consumers = ConsumerTable(max_per_user=cfg.consumers_per_user)
        self.locks = QueueLockTable(max_locks_per_user=cfg.queue_locks_per_user)
        self.clock_ms = monotonic_ms
        # The v2 ports' client tables (a TLS port and its plaintext twin: one each), asked
        # for the connection listings only: a RocketMQ 5 consumer receives by pop, it never
        # takes part in the v1 rebalancing that clients() answers.
        self.v2_sources: list[V2Clients] = []

    def heartbeat(
        self,
        group: str,
        client_id: str,
        subscriptions: Sequence[tuple[str, str]],
        locked: Sequence[QueueKey],
        owner: tuple[str, bool] = ("", False),
        described: tuple[str, str, str] = ("", "", ""),
    ) -> None:
        """``client_id`` of ``group`` is alive, subscribed to (topic, expression) pairs
        (checked; the first MAX_KEPT_SUBSCRIPTION_CHARS kept), holding ``locked``; ``owner``:
        the calling user and whether it is a Super user (consumersPerUser, queueLocksPerUser);
        ``described``: the address it called from, its language and release."""
        _check_client(group, client_id)
        if len(subscriptions) > MAX_SUBSCRIPTIONS:
            raise InvalidRequestError(
                f"{len(subscriptions)} subscriptions in a heartbeat, more than {MAX_SUBSCRIPTIONS}"
            )
        for topic, expression in subscriptions:
            validate_topic(topic)
            parse_subscription(expression)
        if len(locked) > MAX_LOCK_BATCH:
            raise InvalidRequestError(f"more than {MAX_LOCK_BATCH} locked queues in a heartbeat")
        info = client_info(*described, subscriptions)
        now_ms = self.clock_ms()
        self.expire(now_ms)
        self.consumers.heartbeat(group, client_id, now_ms, owner, info)
        held = [q for q in locked if self.topics.has_queue(*q)]
        self.locks.claim(group, client_id, held, now_ms, owner)

    def expire(self, now_ms: int) -> None:
        """Drop consumers silent for CONSUMER_EXPIRE_MS and free their locks (amortized O(1))."""
        for group, client_id, user in self.consumers.expire(now_ms):
            self.locks.release_client(group, client_id, user)

    def live_count(self) -> int:
        """Consumers heard from within the expiry, the silent ones dropped first (locks freed)."""
        self.expire(self.clock_ms())
        return len(self.consumers)

    def unregister(self, group: str, client_id: str, owner: Owner = NOBODY) -> bool:
        """Forget a consumer that shuts down and free its locks, for a call of ``owner``:
        only what calls of the same user registered and took (another user's consumer is left
        alone, answered as one never seen); whether it was known."""
        _check_client(group, client_id)
        removed = self.consumers.remove(group, client_id, owner[0])
        self.locks.release_client(group, client_id, owner[0])
        return removed

    def clients(self, group: str) -> list[str]:
        """The live consumers of ``group``, sorted."""
        validate_group_name(group)
        self.expire(self.clock_ms())
        return self.consumers.clients(group)

    def connections(self, group: str) -> list[tuple[LiveClient, int, list[QueueKey]]]:
        """The live consumers of ``group``: each with its heartbeat's age in ms and the queues
        it holds locked, by client id."""
        validate_group_name(group)
        now_ms = self.clock_ms()
        self.expire(now_ms)
        out = []
        for c in self.consumers.live(group):
            user = self.consumers.owner(group, c.client_id)
            held = self.locks.queues_of(group, c.client_id, user, now_ms)
            out.append((c, now_ms - c.last_heartbeat_ms, held))
        return out

    def v2_connections(self, group: str) -> list[tuple[LiveClient, int]]:
        """The live RocketMQ 5 consumers of ``group`` on this node's v2 ports, each with the
        age of its last Settings or Heartbeat in ms, by client id (a client id on two ports:
        as heard last)."""
        validate_group_name(group)
        best: dict[str, tuple[LiveClient, int]] = {}
        for source in self.v2_sources:
            for client, age_ms in source.in_group(group):
                seen = best.get(client.client_id)
                if seen is None or age_ms < seen[1]:
                    best[client.client_id] = (client, age_ms)
        return [best[c] for c in sorted(best)]

    def listed(self, limit: int = MAX_LISTED_GROUPS) -> tuple[list[GroupListing], bool]:
        """Every group with a committed offset (replicated state) or a live consumer on this
        node (raftmq's or a RocketMQ 5 one), by name, at most ``limit``; and whether more
        exist."""
        self.expire(self.clock_ms())
        topics: dict[str, set[str]] = {}
        for group, topic, _ in self.ctx.sm.offsets:
            topics.setdefault(group, set()).add(topic)
        v2: Counter[str] = Counter()
        for source in self.v2_sources:
            v2.update(source.group_counts())
        names = sorted(topics.keys() | self.consumers.groups() | v2.keys())
        out = [
            GroupListing(g, sorted(topics.get(g, ())), len(self.consumers.clients(g)), v2[g])
            for g in names[:limit]
        ]
        return out, len(names) > limit

    def lock(
        self,
        group: str,
        client_id: str,
        queues: Sequence[QueueKey],
        owner: tuple[str, bool] = ("", False),
    ) -> list[QueueKey]:
        """Lock (or renew) ``queues`` for ``client_id`` (of user ``owner``: name, Super user);
        the subset it now holds. Only the leader grants locks, so two consumers never each get
        one from another node."""
        require_leader(self.ctx.node)
        _check_lock_request(group, client_id, queues)
        now_ms = self.clock_ms()
        self.expire(now_ms)
        existing = [q for q in queues if self.topics.has_queue(*q)]
        return self.locks.lock(group, client_id, existing, now_ms, owner)

    def unlock(
        self,
        group: str,
        client_id: str,
        queues: Sequence[QueueKey],
        owner: Owner = NOBODY,
    ) -> list[QueueKey]:
        """Release ``queues`` (any node: a release must reach the next leader too); those
        that were held by ``client_id`` through calls of ``owner``'s user (another user's
        locks are left alone, answered as not held)."""
        _check_lock_request(group, client_id, queues)
        return self.locks.unlock(group, client_id, queues, owner[0])


def _check_client(group: str, client_id: str) -> None:
    validate_group_name(group)
    validate_client_id(client_id)


def _check_lock_request(group: str, client_id: str, queues: Sequence[QueueKey]) -> None:
    _check_client(group, client_id)
    if len(queues) > MAX_LOCK_BATCH:
        raise InvalidRequestError(f"more than {MAX_LOCK_BATCH} queues in one lock request")
    for topic, _ in queues:
        validate_topic(topic)
