"""The RocketMQ 5 clients a node knows: who sent Settings, as what, and when it was last heard.

In memory on each node (a client opens a Telemetry stream to every node it talks to, and
repeats Settings there after a reconnect): nothing here is replicated. Bounded in count; an
entry not refreshed by a Settings or a Heartbeat for :data:`CLIENT_EXPIRY_MS` is dropped.
Protocol-neutral: client types and languages are the protocol's enum numbers, checked by the
adapter.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from broker.consumers import MAX_CLIENT_ID_CHARS
from broker.errors import InvalidRequestError, ResourceExhaustedError
from broker.names import MAX_GROUP_LENGTH

# RocketMQ's proxy forgets a client silent for 120 s (clients heartbeat every 10 s).
CLIENT_EXPIRY_MS = 120_000
# Clients one node keeps: far above a real deployment's (one per application process), small
# enough that a flood of made-up client ids costs a few MB at most.
MAX_CLIENTS = 10_000


class UnknownClientError(InvalidRequestError):
    """A Heartbeat or another call from a client id that never sent Settings here."""

    code = "UNRECOGNIZED_CLIENT"


class TooManyClientsError(ResourceExhaustedError):
    code = "TOO_MANY_CLIENTS"


@dataclass(slots=True)
class ClientRecord:
    client_id: str
    client_type: int
    language: int
    group: str
    last_seen_ms: int


class ClientTable:
    """Known clients by id, oldest-seen first; ``clock_ms`` is injectable for tests."""

    def __init__(
        self,
        max_clients: int = MAX_CLIENTS,
        expiry_ms: int = CLIENT_EXPIRY_MS,
        clock_ms: Callable[[], int] = lambda: time.monotonic_ns() // 1_000_000,
    ) -> None:
        self.max_clients = max_clients
        self.expiry_ms = expiry_ms
        self._clock = clock_ms
        self._clients: OrderedDict[str, ClientRecord] = OrderedDict()

    def __len__(self) -> int:
        return len(self._clients)

    def settings(self, client_id: str, client_type: int, language: int, group: str) -> None:
        """Record (or refresh) a client from its Settings."""
        check_client_id(client_id)
        if len(group) > MAX_GROUP_LENGTH:
            raise InvalidRequestError(f"group of {len(group)} characters (max {MAX_GROUP_LENGTH})")
        now = self._now()
        self._expire(now)
        if client_id not in self._clients and len(self._clients) >= self.max_clients:
            raise TooManyClientsError(f"{self.max_clients} clients known here; retry later")
        self._clients[client_id] = ClientRecord(client_id, client_type, language, group, now)
        self._clients.move_to_end(client_id)

    def seen(self, client_id: str) -> ClientRecord:
        """Refresh a known client; ``UnknownClientError`` if it sent no Settings here."""
        check_client_id(client_id)
        now = self._now()
        self._expire(now)
        record = self._clients.get(client_id)
        if record is None:
            raise UnknownClientError(f"client {client_id!r} sent no Settings to this node")
        record.last_seen_ms = now
        self._clients.move_to_end(client_id)
        return record

    def get(self, client_id: str) -> ClientRecord | None:
        return self._clients.get(client_id)

    def terminated(self, client_id: str) -> bool:
        """Forget a client that said goodbye; whether it was known."""
        return self._clients.pop(client_id, None) is not None

    def heard_within(self, client_id: str, within_ms: int) -> bool:
        """Whether the client sent a Settings or Heartbeat in the last ``within_ms``."""
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
            del clients[oldest.client_id]


def check_client_id(client_id: str) -> None:
    if not client_id:
        raise InvalidRequestError("no client id (the x-mq-client-id header)")
    if len(client_id) > MAX_CLIENT_ID_CHARS:
        raise InvalidRequestError(
            f"client id of {len(client_id)} characters (max {MAX_CLIENT_ID_CHARS})"
        )
