"""The broker's in-memory tables of consumer state: queue locks and live consumers.

Queue locks (:class:`QueueLockTable`) are RocketMQ's RebalanceLockManager, in memory on every
node: an orderly consumer locks its queues on the group's leader before consuming them
(``LockBatchMQ``) and renews the locks every ``LOCK_RENEW_INTERVAL_S``; a lock not renewed for
``LOCK_MAX_LIVE_MS`` expires, so a consumer that vanished without unlocking frees its queues
after at most that long. Consumers also report the queues they hold in every heartbeat, which
goes to every node, so a node that becomes leader already knows who holds what and does not
hand a held queue to a second consumer.

Live consumers (:class:`ConsumerTable`) are the clients that sent a heartbeat recently; the
same table, built with the producers' limits, is the producer registry
(:mod:`broker.components.producers`). Each entry keeps what the client said of itself
(:class:`ClientInfo`: address, language, release, a consumer's subscriptions), bounded.

Both tables are keyed by what clients send, so both are bounded (in total and per client or
group: one client cannot fill a table and starve the others), and both keep their entries in
order of last renewal, so expired entries are found at the front: each operation first drops
the expired ones there, which costs amortized O(1) per entry ever added (never a scan of the
whole table). A full table refuses new entries with a :class:`ResourceExhaustedError`.

The tables are pure (the caller passes a monotonic time in ms), so the rules are unit-tested
without a clock.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass, field

from broker.state.errors import (
    ClientIdTakenError,
    ConfigError,
    QuotaExceededError,
    ResourceExhaustedError,
    TooManyConsumersError,
    TooManyLocksError,
)

# RocketMQ's rocketmq.broker.rebalance.lockMaxLiveTime: a lock not renewed for this long is free.
LOCK_MAX_LIVE_MS = 60_000
# Bound on the lock table: consumer groups x queues one node tracks (a lying client cannot grow
# it without limit; about 200 bytes per lock, so at most about 20 MB).
MAX_LOCKS = 100_000
# Locks one consumer client may hold in one group: an orderly consumer holds at most the queues
# it was allocated, a few hundred per broker group in practice (and one LockBatchMQ carries at
# most 4,096); this keeps one client from filling the table.
MAX_LOCKS_PER_CLIENT = 4096
# RocketMQ's channelExpiredTimeout: a consumer without a heartbeat for this long is dropped.
CONSUMER_EXPIRE_MS = 120_000
# Consumers one node tracks in total and per group (about 300 bytes each). RocketMQ sets no
# limit; a group with more consumers than queues leaves the extra ones idle, and the largest
# topics have a few thousand queues.
MAX_CONSUMERS = 10_000
MAX_CONSUMERS_PER_GROUP = 1024
# One user's share of each table (broker.conf consumersPerUser, queueLocksPerUser): a tenth,
# so that one user's made-up groups and client ids leave the rest to the others. Super users
# (and the anonymous user of a group without users, "") are bounded by the tables' sizes only.
DEFAULT_CONSUMERS_PER_USER = 1000
DEFAULT_LOCKS_PER_USER = 10_000

# (user name, whether it is a Super user): who makes a call, as the node's guard admitted it.
Owner = tuple[str, bool]
NOBODY: Owner = ("", False)

# (consumer group, topic, queue id)
LockKey = tuple[str, str, int]
# (consumer group, client id)
ClientKey = tuple[str, str]
# (consumer group, client id, user whose calls took the locks): one user's locks under a client
# id are never another user's, even under the same id (a caller cannot renew, count against or
# free another user's locks by naming its client id).
LockClientKey = tuple[str, str, str]


@dataclass(frozen=True, slots=True)
class ClientInfo:
    """What a client said of itself in its last heartbeat (shown by mqadmin's
    consumerConnection, consumerStatus and producerConnection): checked and bounded by the
    caller (broker.components.consumers.client_info)."""

    address: str = ""  # host:port the heartbeat came from
    language: str = ""  # "" when the client did not send it
    version: str = ""
    protocol: str = "v1"  # v1: raftmq's client; v2: a RocketMQ 5 client
    subscriptions: tuple[tuple[str, str], ...] = field(default=())  # (topic, expression)
    subscriptions_truncated: bool = False


@dataclass(frozen=True, slots=True)
class LiveClient:
    """One live entry of a :class:`ConsumerTable`."""

    group: str
    client_id: str
    last_heartbeat_ms: int
    info: ClientInfo


@dataclass(slots=True)
class _Holder:
    client_id: str
    renewed_ms: int
    owner: str = ""  # the user whose call took the lock ("" without users)


def _count(counts: dict[str, int], user: str, delta: int) -> None:
    """Add ``delta`` to ``user``'s count (none kept for "" or at 0)."""
    if not user:
        return
    left = counts.get(user, 0) + delta
    assert left >= 0, (user, left)
    if left:
        counts[user] = left
    else:
        counts.pop(user, None)


class QueueLockTable:
    """``lock``/``unlock``/``claim`` over ``(group, topic, queue)``; ``now_ms`` is passed in and
    never goes backwards (a monotonic clock)."""

    def __init__(
        self,
        max_live_ms: int = LOCK_MAX_LIVE_MS,
        max_locks: int = MAX_LOCKS,
        max_locks_per_client: int = MAX_LOCKS_PER_CLIENT,
        max_locks_per_user: int = DEFAULT_LOCKS_PER_USER,
    ) -> None:
        limits = (max_live_ms, max_locks, max_locks_per_client, max_locks_per_user)
        if not all(limit > 0 for limit in limits):
            raise ConfigError("lock table limits must be > 0")
        self.max_live_ms = max_live_ms
        self.max_locks = max_locks
        self.max_locks_per_client = max_locks_per_client
        self.max_locks_per_user = max_locks_per_user
        self._by_user: dict[str, int] = {}  # locks by the user that took them
        # Oldest renewal first: expired locks are always at the front.
        self._locks: OrderedDict[LockKey, _Holder] = OrderedDict()
        self._by_client: dict[LockClientKey, set[LockKey]] = {}

    def __len__(self) -> int:
        return len(self._locks)

    def held_by(self, group: str, client_id: str, user: str = "") -> int:
        """How many locks ``client_id`` of ``group`` holds by calls of ``user`` (expired ones
        not yet dropped count)."""
        return len(self._by_client.get((group, client_id, user), ()))

    def held_by_user(self, user: str) -> int:
        """How many locks calls of ``user`` took (expired ones not yet dropped count)."""
        return self._by_user.get(user, 0)

    def holder(self, key: LockKey, now_ms: int) -> str | None:
        h = self._locks.get(key)
        if h is None or now_ms - h.renewed_ms >= self.max_live_ms:
            return None
        return h.client_id

    def expire(self, now_ms: int) -> int:
        """Drop the locks not renewed for ``max_live_ms``; how many. Amortized O(1)."""
        dropped = 0
        locks = self._locks
        while locks:
            key, h = next(iter(locks.items()))
            if now_ms - h.renewed_ms < self.max_live_ms:
                break
            del locks[key]
            self._forget(key, h)
            dropped += 1
        return dropped

    def _forget(self, key: LockKey, h: _Holder) -> None:
        _count(self._by_user, h.owner, -1)
        ck = (key[0], h.client_id, h.owner)
        mine = self._by_client.get(ck)
        if mine is not None:
            mine.discard(key)
            if not mine:
                del self._by_client[ck]

    def _room(
        self, group: str, client_id: str, keys: Iterable[LockKey], user: str
    ) -> tuple[int, int]:
        """(new locks ``keys`` would add, room left for ``client_id`` of ``user``: per client
        and in total)."""
        new = sum(1 for k in set(keys) if k not in self._locks)
        room = min(
            self.max_locks_per_client - self.held_by(group, client_id, user),
            self.max_locks - len(self._locks),
        )
        return new, room

    def _user_room(self, owner: Owner) -> int:
        """Locks ``owner``'s calls may still take (queueLocksPerUser; a Super user's and the
        anonymous user's: the table's room)."""
        user, unbounded = owner
        if not user or unbounded:
            return self.max_locks
        return self.max_locks_per_user - self.held_by_user(user)

    def _take(self, key: LockKey, client_id: str, now_ms: int, user: str = "") -> bool:
        """Lock or renew ``key`` for ``client_id`` (a call of ``user``) unless another live
        client holds it, or the same client id by another user's calls (the caller checked
        that there is room)."""
        h = self._locks.get(key)
        if h is not None:
            mine = h.client_id == client_id and h.owner == user
            if not mine and now_ms - h.renewed_ms < self.max_live_ms:
                return False
            if not mine:
                self._forget(key, h)
                h.owner = user
                _count(self._by_user, user, 1)
            h.client_id = client_id
            h.renewed_ms = now_ms
            self._locks.move_to_end(key)
        else:
            self._locks[key] = _Holder(client_id, now_ms, user)
            _count(self._by_user, user, 1)
        self._by_client.setdefault((key[0], client_id, user), set()).add(key)
        return True

    def lock(
        self,
        group: str,
        client_id: str,
        queues: Iterable[tuple[str, int]],
        now_ms: int,
        owner: Owner = NOBODY,
    ) -> list[tuple[str, int]]:
        """Locks (or renews) every queue not held by another live consumer; returns those now
        held by ``client_id`` (a call of ``owner``). Raises :class:`TooManyLocksError` (and
        changes nothing) when the new locks do not fit the client's share or the table, and
        :class:`QuotaExceededError` when they do not fit the user's (queueLocksPerUser)."""
        self.expire(now_ms)
        wanted = list(queues)
        keys = [(group, t, q) for t, q in wanted]
        new, room = self._room(group, client_id, keys, owner[0])
        if new > room:
            raise TooManyLocksError(
                f"{new} new locks do not fit: a client holds at most {self.max_locks_per_client}"
                f" locks per group and the node {self.max_locks}"
                f" (this client holds {self.held_by(group, client_id, owner[0])},"
                f" the node {len(self)})"
            )
        if new > self._user_room(owner):
            raise QuotaExceededError(
                "queueLocksPerUser",
                f"{new} new locks do not fit: user {owner[0]!r} holds"
                f" {self.held_by_user(owner[0])} of its {self.max_locks_per_user} on this node",
            )
        user = owner[0]
        taken = [self._take(k, client_id, now_ms, user) for k in keys]
        return [q for q, ok in zip(wanted, taken, strict=True) if ok]

    def claim(
        self,
        group: str,
        client_id: str,
        queues: Iterable[tuple[str, int]],
        now_ms: int,
        owner: Owner = NOBODY,
    ) -> int:
        """A heartbeat's report of held queues (a call of ``owner``): recorded unless another
        consumer holds one; queues beyond the client's share, the user's or the table are not
        recorded (a report is advice, the leader's ``lock`` decides). Returns how many were
        recorded."""
        self.expire(now_ms)
        recorded = 0
        for t, q in queues:
            key = (group, t, q)
            if key not in self._locks and (
                self._room(group, client_id, (), owner[0])[1] <= 0 or self._user_room(owner) <= 0
            ):
                continue
            recorded += self._take(key, client_id, now_ms, owner[0])
        return recorded

    def unlock(
        self, group: str, client_id: str, queues: Iterable[tuple[str, int]], user: str = ""
    ) -> list[tuple[str, int]]:
        """Releases the queues ``client_id`` holds by calls of ``user``; returns those it held
        (a lock another user's call took is left alone, answered as one not held)."""
        released = []
        for q in queues:
            key = (group, q[0], q[1])
            h = self._locks.get(key)
            if h is not None and h.client_id == client_id and h.owner == user:
                del self._locks[key]
                self._forget(key, h)
                released.append(q)
        return released

    def queues_of(
        self, group: str, client_id: str, user: str, now_ms: int
    ) -> list[tuple[str, int]]:
        """The queues ``client_id`` of ``group`` holds locked (live locks taken by calls of
        ``user``), sorted. O(its locks)."""
        keys = self._by_client.get((group, client_id, user), ())
        live = [k for k in keys if now_ms - self._locks[k].renewed_ms < self.max_live_ms]
        return sorted((t, q) for _, t, q in live)

    def release_client(self, group: str, client_id: str, user: str = "") -> int:
        """A consumer of ``user`` that unregistered or expired: every lock calls of ``user``
        took for it is free (another user's locks under the same client id are left alone).
        Returns how many. O(locks it held)."""
        keys = self._by_client.pop((group, client_id, user), set())
        for k in keys:
            _count(self._by_user, self._locks.pop(k).owner, -1)
        return len(keys)


@dataclass(frozen=True, slots=True)
class TableKind:
    """What a :class:`ConsumerTable` holds, for its refusals: the clients' name, the quota key
    that shares it out, and the error of a full table."""

    clients: str = "consumers"
    quota_key: str = "consumersPerUser"
    full_error: type[ResourceExhaustedError] = TooManyConsumersError
    group_limit_key: str = "maxConsumersPerGroup"
    table_limit_key: str = "maxConsumers"


CONSUMERS = TableKind()


class ConsumerTable:
    """Clients that sent a heartbeat within ``expire_ms``, per group (consumers, or producers
    with ``kind``); ``now_ms`` is passed in and never goes backwards (a monotonic clock)."""

    def __init__(
        self,
        expire_ms: int = CONSUMER_EXPIRE_MS,
        max_consumers: int = MAX_CONSUMERS,
        max_per_group: int = MAX_CONSUMERS_PER_GROUP,
        max_per_user: int = DEFAULT_CONSUMERS_PER_USER,
        kind: TableKind = CONSUMERS,
    ) -> None:
        if not (expire_ms > 0 and max_consumers > 0 and max_per_group > 0 and max_per_user > 0):
            raise ConfigError(f"{kind.clients} table limits must be > 0")
        self.kind = kind
        self.expire_ms = expire_ms
        self.max_consumers = max_consumers
        self.max_per_group = max_per_group
        self.max_per_user = max_per_user
        self._info: dict[ClientKey, ClientInfo] = {}
        # The user whose heartbeat registered each consumer (none kept for ""), and counts.
        self._owner: dict[ClientKey, str] = {}
        self._by_user: dict[str, int] = {}
        # Last heartbeat (ms) per consumer, oldest first: expired ones are at the front.
        self._seen: OrderedDict[ClientKey, int] = OrderedDict()
        self._groups: dict[str, set[str]] = {}

    def __len__(self) -> int:
        return len(self._seen)

    def expire(self, now_ms: int) -> list[LockClientKey]:
        """Drop the consumers silent for ``expire_ms``; returns them (group, client id, the
        user whose heartbeats registered it). Amortized O(1)."""
        gone: list[LockClientKey] = []
        seen = self._seen
        while seen:
            key, last_ms = next(iter(seen.items()))
            if now_ms - last_ms < self.expire_ms:
                break
            del seen[key]
            gone.append((*key, self._owner.get(key, "")))
            self._drop_from_group(key)
        return gone

    def held_by_user(self, user: str) -> int:
        """Consumers registered by calls of ``user`` (call :meth:`expire` first)."""
        return self._by_user.get(user, 0)

    def _drop_from_group(self, key: ClientKey) -> None:
        _count(self._by_user, self._owner.pop(key, ""), -1)
        self._info.pop(key, None)
        members = self._groups.get(key[0])
        if members is not None:
            members.discard(key[1])
            if not members:
                del self._groups[key[0]]

    def heartbeat(
        self,
        group: str,
        client_id: str,
        now_ms: int,
        owner: Owner = NOBODY,
        info: ClientInfo | None = None,
    ) -> None:
        """Record a heartbeat of a call of ``owner`` (call :meth:`expire` first), and what the
        client said of itself (``info``: kept until the next heartbeat; None keeps the last).
        Raises the kind's full error (:class:`TooManyConsumersError`) for a new client that does
        not fit the group or the table, :class:`QuotaExceededError` for one that does not fit
        the user's share (consumersPerUser), :class:`ClientIdTakenError` (nothing refreshed) for
        a live client another user's heartbeats registered, Super users' too."""
        key = (group, client_id)
        if key in self._seen and self._owner.get(key, "") != owner[0]:
            raise ClientIdTakenError(
                f"{self.kind.clients[:-1]} {client_id!r} of group {group!r} is registered by"
                " another user"
            )
        if key not in self._seen:
            self._admit(group, owner)
            self._add(key, owner[0])
        self._seen[key] = now_ms
        self._seen.move_to_end(key)
        if info is not None:
            self._info[key] = info

    def _admit(self, group: str, owner: Owner) -> None:
        """Refuse a new client of ``group`` that does not fit (see :meth:`heartbeat`)."""
        kind = self.kind
        members = self._groups.get(group)
        if members is not None and len(members) >= self.max_per_group:
            raise kind.full_error(
                f"the group has {len(members)} live {kind.clients}, the most one node tracks"
                f" ({kind.group_limit_key}={self.max_per_group})"
            )
        if len(self._seen) >= self.max_consumers:
            raise kind.full_error(
                f"the node tracks {len(self._seen)} live {kind.clients}, the most it may"
                f" ({kind.table_limit_key}={self.max_consumers})"
            )
        user, unbounded = owner
        if user and not unbounded and self.held_by_user(user) >= self.max_per_user:
            raise QuotaExceededError(
                kind.quota_key,
                f"user {user!r} has {self.max_per_user} live {kind.clients} on this node",
            )

    def _add(self, key: ClientKey, user: str) -> None:
        group, client_id = key
        self._groups.setdefault(group, set()).add(client_id)
        if user:
            self._owner[key] = user
            _count(self._by_user, user, 1)

    def remove(self, group: str, client_id: str, user: str = "") -> bool:
        """Forget a consumer that a call of ``user`` registered (it unregistered); whether it
        was known (another user's consumer is left alone, answered as unknown)."""
        key = (group, client_id)
        if key not in self._seen or self._owner.get(key, "") != user:
            return False
        del self._seen[key]
        self._drop_from_group((group, client_id))
        return True

    def owner(self, group: str, client_id: str) -> str:
        """The user whose heartbeats registered the client ("" without users)."""
        return self._owner.get((group, client_id), "")

    def groups(self) -> set[str]:
        """The groups with a live consumer (call :meth:`expire` first)."""
        return set(self._groups)

    def clients(self, group: str) -> list[str]:
        """The group's live consumers, sorted (call :meth:`expire` first)."""
        return sorted(self._groups.get(group, ()))

    def live(self, group: str) -> list[LiveClient]:
        """The group's live clients with what they said of themselves, by client id (call
        :meth:`expire` first)."""
        return [self._live((group, c)) for c in self.clients(group)]

    def _live(self, key: ClientKey) -> LiveClient:
        return LiveClient(key[0], key[1], self._seen[key], self._info.get(key, ClientInfo()))

    def every(self, limit: int) -> tuple[list[LiveClient], bool]:
        """Every live client by group then client id, at most ``limit``; and whether more exist
        (call :meth:`expire` first). O(limit + groups log groups)."""
        out: list[LiveClient] = []
        for group in sorted(self._groups):
            for client_id in sorted(self._groups[group]):
                if len(out) >= limit:
                    return out, True
                out.append(self._live((group, client_id)))
        return out, False
