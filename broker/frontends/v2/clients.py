"""The RocketMQ 5 clients a node knows: who sent Settings, as what, and when it was last heard.

In memory on each node (a client opens a Telemetry stream to every node it talks to, and
repeats Settings there after a reconnect): nothing here is replicated. Bounded in count; an
entry not refreshed by a Settings or a Heartbeat for :data:`CLIENT_EXPIRY_MS` is dropped.
Protocol-neutral: client types and languages are the protocol's enum numbers, checked by the
adapter.

Each record belongs to the user whose Settings made it (``owner``; "" on an unguarded port): a
Heartbeat, a termination or a Settings of another user finds nothing to act on, as for an id
never seen (docs/SECURITY.md, "RocketMQ 5 clients"). One user holds at most
``max_per_user`` records (``grpcClientsPerUser``), so that the rest of the table is left for
everyone else; Super users and the anonymous user of an unguarded port are bounded by the
table's global limit only.
"""

from __future__ import annotations

import time
from collections import Counter, OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from broker.components.consumers import MAX_CLIENT_ID_CHARS
from broker.components.locks import ClientInfo, LiveClient
from broker.state import errors
from broker.state.errors import InvalidRequestError, ResourceExhaustedError
from broker.state.names import MAX_GROUP_LENGTH
from mqerrors import codes as E

# RocketMQ's proxy forgets a client silent for 120 s (clients heartbeat every 10 s).
CLIENT_EXPIRY_MS = 120_000
# Clients one node keeps: far above a real deployment's (one per application process), small
# enough that a flood of made-up client ids costs a few MB at most.
MAX_CLIENTS = 10_000
# Records one user may hold (broker.conf grpcClientsPerUser): a tenth of the table, far above
# one application's processes, so that one user's made-up client ids leave 90 % for the others.
DEFAULT_MAX_CLIENTS_PER_USER = 1_000


# The description of a client whose Settings said nothing of it.
V2_INFO = ClientInfo(protocol="v2")


class UnknownClientError(InvalidRequestError):
    """A Heartbeat or another call from a client id that never sent Settings here."""

    code = E.UNRECOGNIZED_CLIENT


class TooManyClientsError(ResourceExhaustedError):
    code = E.TOO_MANY_CLIENTS


class ClientQuotaError(ResourceExhaustedError):
    """One user holds ``grpcClientsPerUser`` client records on this node."""

    code = E.RESOURCE_EXHAUSTED


class ClientIdTakenError(errors.ClientIdTakenError):
    """A Settings naming a client id another user's Settings registered (live): refused as the
    v1 port refuses such a heartbeat (PERMISSION_DENIED; v2 ``FORBIDDEN``)."""


@dataclass(slots=True)
class ClientRecord:
    client_id: str
    client_type: int
    language: int
    group: str
    last_seen_ms: int
    owner: str = ""
    # What its Settings said of it (address, language, release, subscriptions), for the
    # connection listings (mqadmin consumerConnection, the dashboard); bounded by the caller.
    info: ClientInfo = V2_INFO


class ClientTable:
    """Known clients by id, oldest-seen first; ``clock_ms`` is injectable for tests."""

    def __init__(
        self,
        max_clients: int = MAX_CLIENTS,
        expiry_ms: int = CLIENT_EXPIRY_MS,
        clock_ms: Callable[[], int] = lambda: time.monotonic_ns() // 1_000_000,
        max_per_user: int = DEFAULT_MAX_CLIENTS_PER_USER,
    ) -> None:
        assert max_per_user > 0 and max_clients > 0
        self.max_clients = max_clients
        self.max_per_user = max_per_user
        self.expiry_ms = expiry_ms
        self._clock = clock_ms
        self._clients: OrderedDict[str, ClientRecord] = OrderedDict()
        self._per_owner: Counter[str] = Counter()

    def __len__(self) -> int:
        return len(self._clients)

    def settings(
        self,
        client_id: str,
        client_type: int,
        language: int,
        group: str,
        owner: str = "",
        unbounded: bool = False,
        info: ClientInfo = V2_INFO,
    ) -> None:
        """Record (or refresh) a client from its Settings, for user ``owner``; ``unbounded``
        (a Super user): no per-user quota; ``info``: what the Settings said of the client."""
        check_client_id(client_id)
        if len(group) > MAX_GROUP_LENGTH:
            raise InvalidRequestError(f"group of {len(group)} characters (max {MAX_GROUP_LENGTH})")
        now = self._now()
        self._expire(now)
        known = self._clients.get(client_id)
        if known is not None and known.owner != owner:
            raise ClientIdTakenError(f"client id {client_id!r} is registered by another user")
        if known is None:
            self._check_room(owner, unbounded)
            self._per_owner[owner] += 1
        record = ClientRecord(client_id, client_type, language, group, now, owner, info)
        self._clients[client_id] = record
        self._clients.move_to_end(client_id)

    def _check_room(self, owner: str, unbounded: bool) -> None:
        if len(self._clients) >= self.max_clients:
            raise TooManyClientsError(f"{self.max_clients} clients known here; retry later")
        if owner and not unbounded and self._per_owner[owner] >= self.max_per_user:
            raise ClientQuotaError(
                f"quota grpcClientsPerUser: user {owner!r} has {self.max_per_user} clients "
                "on this node; end some (NotifyClientTermination) or wait for them to expire"
            )

    def seen(self, client_id: str, owner: str = "") -> ClientRecord:
        """Refresh a known client of ``owner``; ``UnknownClientError`` if it sent no Settings
        here (or another user's did: the same answer)."""
        check_client_id(client_id)
        now = self._now()
        self._expire(now)
        record = self._clients.get(client_id)
        if record is None or record.owner != owner:
            raise UnknownClientError(f"client {client_id!r} sent no Settings to this node")
        record.last_seen_ms = now
        self._clients.move_to_end(client_id)
        return record

    def get(self, client_id: str, owner: str = "") -> ClientRecord | None:
        record = self._clients.get(client_id)
        return record if record is not None and record.owner == owner else None

    def terminated(self, client_id: str, owner: str = "") -> bool:
        """Forget a client of ``owner`` that said goodbye; whether it was known (another
        user's record is left alone, answered as unknown)."""
        record = self._clients.get(client_id)
        if record is None or record.owner != owner:
            return False
        self._drop(record)
        return True

    def in_group(self, group: str) -> list[tuple[LiveClient, int]]:
        """The live clients whose Settings named ``group`` (consumers: a producer's names
        none), each with the age of its last Settings or Heartbeat in ms, by client id. A scan
        of the table (at most ``max_clients``): asked by the connection listings only, never
        on a message's path."""
        if not group:
            return []
        now = self._now()
        self._expire(now)
        out = [
            (LiveClient(r.group, r.client_id, r.last_seen_ms, r.info), now - r.last_seen_ms)
            for r in self._clients.values()
            if r.group == group
        ]
        out.sort(key=lambda pair: pair[0].client_id)
        return out

    def group_counts(self) -> Counter[str]:
        """The live clients per group their Settings named (consumers only: a producer's
        names none)."""
        self._expire(self._now())
        return Counter(r.group for r in self._clients.values() if r.group)

    def held_by(self, owner: str) -> int:
        """Records ``owner`` holds here."""
        return self._per_owner[owner]

    def _drop(self, record: ClientRecord) -> None:
        del self._clients[record.client_id]
        self._per_owner[record.owner] -= 1
        if self._per_owner[record.owner] <= 0:
            del self._per_owner[record.owner]

    def heard_within(self, client_id: str, within_ms: int) -> bool:
        """Whether the client sent a Settings or Heartbeat in the last ``within_ms`` (a
        server-side question: the renewals of the client's own receives)."""
        record = self._clients.get(client_id)
        return record is not None and self._now() - record.last_seen_ms <= within_ms

    def _now(self) -> int:
        return self._clock()

    def _expire(self, now: int) -> None:
        clients = self._clients
        while clients:
            oldest = next(iter(clients.values()))
            if now - oldest.last_seen_ms < self.expiry_ms:
                return
            self._drop(oldest)


def check_client_id(client_id: str) -> None:
    if not client_id:
        raise InvalidRequestError("no client id (the x-mq-client-id header)")
    if len(client_id) > MAX_CLIENT_ID_CHARS:
        raise InvalidRequestError(
            f"client id of {len(client_id)} characters (max {MAX_CLIENT_ID_CHARS})"
        )
