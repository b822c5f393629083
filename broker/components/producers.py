"""The producer registry of one node (memory only, as RocketMQ's ProducerManager).

Producers make themselves known so that an operator can see who writes (mqadmin
producerConnection, the dashboard's Clients page): raftmq's client by a ``ProducerHeartbeat``
every PRODUCER_HEARTBEAT_INTERVAL_S (client/producer.py) to every node of the broker groups it
sends to; a RocketMQ 5 client by its Telemetry ``Settings`` and ``Heartbeat`` calls (the v2
port registers it once per topic it publishes to, the topic standing for the group, as
RocketMQ's proxy does). A producer silent for PRODUCER_EXPIRE_MS is forgotten; one that shuts
down unregisters at once. Nothing here is needed to send: a full table or a used-up quota
refuses the heartbeat, never a message.

The table is the consumers' (:class:`broker.components.locks.ConsumerTable`) with the
producers' limits: bounded in total, per group and per user (``producersPerUser``), expired
entries dropped in amortized O(1).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from broker.components.consumers import client_info, monotonic_ms, validate_client_id
from broker.components.locks import NOBODY, ConsumerTable, LiveClient, Owner, TableKind
from broker.state.errors import InvalidRequestError, ResourceExhaustedError
from broker.state.message import validate_topic
from broker.state.names import validate_group_name
from mqerrors import codes as E

# RocketMQ's channelExpiredTimeout (120 s) for producers too; clients heartbeat every 10 s
# (raftmq's and RocketMQ 5's), so a producer survives eleven lost heartbeats.
PRODUCER_EXPIRE_MS = 120_000
# Producers one node tracks, in total and per group (about 300 bytes each, so at most about
# 3 MB): far above a real deployment's (one per application process).
MAX_PRODUCERS = 10_000
MAX_PRODUCERS_PER_GROUP = 1024
# One user's share (broker.conf producersPerUser): a tenth, as for consumers, so that one
# user's made-up client ids leave the rest to the others.
DEFAULT_PRODUCERS_PER_USER = 1000
# Topics one heartbeat names (checked for the caller's Pub right, not kept): a producer
# writing to more names the first ones (raftmq's client follows at most as many).
MAX_PRODUCER_TOPICS = 256
# Connections in one GetProducerConnections answer: a page of an operator's view, well under
# gRPC's 4 MB message (about 300 bytes each).
MAX_LISTED_PRODUCERS = 1000


def check_producer_topics(topics: Sequence[str]) -> None:
    """A v1 producer heartbeat's topics: 1 to MAX_PRODUCER_TOPICS valid names (the rights are
    checked on them; they are not kept)."""
    if not 0 < len(topics) <= MAX_PRODUCER_TOPICS:
        raise InvalidRequestError(
            f"a producer heartbeat names 1 to {MAX_PRODUCER_TOPICS} topics, not {len(topics)}"
        )
    for topic in topics:
        validate_topic(topic)


def peer_address(peer: str) -> str:
    """gRPC's peer ("ipv4:10.0.0.1:5000", "ipv6:[::1]:5000") as host:port; another form
    (a Unix socket) as gRPC gives it."""
    for prefix in ("ipv4:", "ipv6:"):
        if peer.startswith(prefix):
            return peer[len(prefix) :]
    return peer


class TooManyProducersError(ResourceExhaustedError):
    """The node tracks as many producers (per group or in total) as it may."""

    code = E.TOO_MANY_CLIENTS


PRODUCERS = TableKind(
    clients="producers",
    quota_key="producersPerUser",
    full_error=TooManyProducersError,
    group_limit_key="maxProducersPerGroup",
    table_limit_key="maxProducers",
)


class ProducerRegistry:
    """Which producers of each group are alive, with their address, language and release."""

    def __init__(self, max_per_user: int = DEFAULT_PRODUCERS_PER_USER) -> None:
        self.table = ConsumerTable(
            PRODUCER_EXPIRE_MS, MAX_PRODUCERS, MAX_PRODUCERS_PER_GROUP, max_per_user, PRODUCERS
        )
        self.clock_ms = monotonic_ms
        # client id -> the groups a v2 client registered under (its publishing topics), so its
        # Heartbeat (which names no topic) refreshes them all. Bounded by the table.
        self._v2_groups: dict[str, set[str]] = {}

    def heartbeat(
        self,
        group: str,
        client_id: str,
        described: tuple[str, str, str],
        owner: Owner = NOBODY,
        protocol: str = "v1",
    ) -> None:
        """``client_id`` of ``group`` is alive; ``described``: the address it called from, its
        language and release (checked: INVALID_REQUEST). A new producer that does not fit:
        TOO_MANY_CLIENTS, or RESOURCE_EXHAUSTED ``quota producersPerUser``."""
        validate_group_name(group)
        validate_client_id(client_id)
        info = client_info(*described, protocol=protocol)
        now_ms = self.clock_ms()
        self._expire(now_ms)
        self.table.heartbeat(group, client_id, now_ms, owner, info)

    def v2_settings(
        self,
        client_id: str,
        topics: Iterable[str],
        described: tuple[str, str, str],
        owner: Owner = NOBODY,
    ) -> None:
        """A RocketMQ 5 producer's Settings: registered under each topic it publishes to (the
        topics are checked by the caller, at most as many as Settings carries); a topic its
        earlier Settings named and this one does not is dropped."""
        topics = list(topics)
        for gone in sorted(self._v2_groups.get(client_id, set()) - set(topics)):
            if self.table.remove(gone, client_id, owner[0]):
                self._forget_v2(gone, client_id)
        for topic in topics:
            self.heartbeat(topic, client_id, described, owner, protocol="v2")
            self._v2_groups.setdefault(client_id, set()).add(topic)

    def v2_heartbeat(self, client_id: str, owner: Owner = NOBODY) -> None:
        """A RocketMQ 5 producer's Heartbeat: every group its Settings registered is alive
        (entries already forgotten stay so until the next Settings)."""
        now_ms = self.clock_ms()
        self._expire(now_ms)
        for group in sorted(self._v2_groups.get(client_id, ())):
            if self.table.owner(group, client_id) == owner[0]:
                self.table.heartbeat(group, client_id, now_ms, owner)

    def unregister(self, group: str, client_id: str, owner: Owner = NOBODY) -> bool:
        """Forget a producer of ``owner`` that shuts down (another user's is left alone,
        answered as unknown); whether it was known."""
        validate_group_name(group)
        validate_client_id(client_id)
        removed = self.table.remove(group, client_id, owner[0])
        if removed:
            self._forget_v2(group, client_id)
        return removed

    def v2_terminated(self, client_id: str, owner: Owner = NOBODY) -> None:
        """A RocketMQ 5 client's NotifyClientTermination: its producer entries go."""
        for group in sorted(self._v2_groups.get(client_id, ())):
            if self.table.remove(group, client_id, owner[0]):
                self._forget_v2(group, client_id)

    def connections(
        self, group: str = "", limit: int = MAX_LISTED_PRODUCERS
    ) -> tuple[list[tuple[LiveClient, int]], bool]:
        """The live producers of ``group`` (every group when empty), each with its heartbeat's
        age in ms, by group then client id; at most ``limit``, and whether more exist."""
        if group:
            validate_group_name(group)
        now_ms = self.clock_ms()
        self._expire(now_ms)
        if group:
            live = self.table.live(group)
            listed, more = live[:limit], len(live) > limit
        else:
            listed, more = self.table.every(limit)
        return [(c, now_ms - c.last_heartbeat_ms) for c in listed], more

    def __len__(self) -> int:
        return len(self.table)

    def live_count(self) -> int:
        """Producers heard from within the expiry, the silent ones dropped first."""
        self._expire(self.clock_ms())
        return len(self.table)

    def _expire(self, now_ms: int) -> None:
        for group, client_id, _ in self.table.expire(now_ms):
            self._forget_v2(group, client_id)

    def _forget_v2(self, group: str, client_id: str) -> None:
        groups = self._v2_groups.get(client_id)
        if groups is not None:
            groups.discard(group)
            if not groups:
                del self._v2_groups[client_id]
