"""auto_renew for push consumers: the messages a push consumer received through this node stay
invisible to the rest of its group while the consumer is alive, renewed a slice at a time.

A push consumer's receive asks ``auto_renew`` and names no invisible time: the server gives
each message :attr:`RenewPolicy.slice_ms` and renews it (the same delivery: the receipt handle
stays valid, ``broker.state.popstate.OP_RENEW``) while the client that received it is alive (a
Settings or Heartbeat on this node within :data:`CLIENT_ALIVE_MS`), up to
:attr:`RenewPolicy.max_ms` after the receive. An ack, a nack or a dead-letter forward through this
node ends the renewal; one through another node ends it at the next renewal (the leader answers
the handle is no longer in flight). The table is this node's memory only: when the node stops,
its messages are visible again one slice later at most, as after a consumer crash.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass

from broker.frontends.v2.clients import ClientTable
from broker.state.errors import BrokerError
from dledger.log import DLedgerError
from mqerrors import codes as E

logger = logging.getLogger(__name__)

# Messages renewed by one node: one per in-flight message of the broker at most
# (broker.state.popstate.MAX_INFLIGHT_TOTAL); past it new ones are not renewed (they are redelivered
# after one slice, as the proxy does past its own limit).
MAX_RENEWALS = 200_000
# A client is alive while this node heard a Settings or Heartbeat from it this recently: the
# clients heartbeat every 10 s, so three may be missed.
CLIENT_ALIVE_MS = 30_000
# A renewal is due when less than this part of the slice is left (a third: two chances to
# renew before the message expires).
RENEW_AHEAD_PART = 3
# Handles renewed by one call (one record per queue on the leader): broker.state.popstate's
# MAX_RECORD_ITEMS. A push consumer caches up to ~1,000 messages: one pass renews them in a few
# records, not one proposal per message (which on a loaded leader took longer than the margin).
MAX_RENEW_BATCH = 1024
# Renewal calls in flight at once, so that a node with many consumers does not flood its leader.
MAX_CONCURRENT_RENEWALS = 8
# The renewal pass runs this often at most (and at least every slice / RENEW_AHEAD_PART / 2).
MAX_PASS_INTERVAL_MS = 1000

# The invisible time of an auto_renew receive and of each renewal: the proxy's 60 s.
DEFAULT_SLICE_MS = 60_000
# Renewed for at most this long after the receive: a listener stuck longer lets its messages go
# to another consumer (the proxy's bound is of the same order).
DEFAULT_MAX_MS = 3 * 3600 * 1000

# group, topic, handles, ms -> per handle "" (renewed) or the error's stable code
Renew = Callable[[str, str, list[str], int], Awaitable[list[str]]]


@dataclass(frozen=True, slots=True)
class RenewPolicy:
    """``slice_ms``: the invisible time of an auto_renew receive and of each renewal;
    ``max_ms``: how long after the receive a message is renewed at most."""

    slice_ms: int = DEFAULT_SLICE_MS
    max_ms: int = DEFAULT_MAX_MS


@dataclass(slots=True)
class _Tracked:
    client_id: str
    group: str
    topic: str
    received_ms: int
    deadline_ms: int


class Renewals:
    """This node's auto_renew table: receipt handle -> who holds it and until when."""

    def __init__(
        self,
        clients: ClientTable,
        renew: Renew,
        policy: RenewPolicy,
        clock_ms: Callable[[], int] | None = None,
    ) -> None:
        self.clients = clients
        self.renew = renew
        self.policy = policy
        self._clock_ms = clock_ms or (lambda: time.monotonic_ns() // 1_000_000)
        self.table: dict[str, _Tracked] = {}
        self.task: asyncio.Task[None] | None = None
        self.renewed = 0  # renewals answered OK (a counter for tests and logs)

    def track(self, client_id: str, group: str, topic: str, handles: Iterable[str]) -> None:
        now = self._clock_ms()
        for handle in handles:
            if len(self.table) >= MAX_RENEWALS:
                logger.warning("auto_renew table full (%d): not renewed", MAX_RENEWALS)
                return
            self.table[handle] = _Tracked(client_id, group, topic, now, now + self.policy.slice_ms)
        if self.task is None or self.task.done():
            self.task = asyncio.get_running_loop().create_task(self._loop(), name="rmq5-renew")

    def forget(self, handles: Iterable[str]) -> None:
        for handle in handles:
            self.table.pop(handle, None)

    async def close(self) -> None:
        if self.task is not None:
            self.task.cancel()
            await asyncio.gather(self.task, return_exceptions=True)
            self.task = None

    async def _loop(self) -> None:
        interval_s = min(MAX_PASS_INTERVAL_MS, self.policy.slice_ms // RENEW_AHEAD_PART // 2)
        while self.table:
            await self.pass_once()
            await asyncio.sleep(max(interval_s, 10) / 1000)

    async def pass_once(self) -> int:
        """Renew every due message of a live client; forget those of dead clients or past the
        bound. How many were renewed."""
        now = self._clock_ms()
        ahead = self.policy.slice_ms // RENEW_AHEAD_PART
        due: dict[tuple[str, str], list[str]] = {}
        for handle, t in list(self.table.items()):
            if t.deadline_ms - now > ahead:
                continue
            if not self._alive(t.client_id) or now - t.received_ms >= self.policy.max_ms:
                del self.table[handle]
                continue
            due.setdefault((t.group, t.topic), []).append(handle)
        batches = [
            (group, topic, handles[i : i + MAX_RENEW_BATCH])
            for (group, topic), handles in due.items()
            for i in range(0, len(handles), MAX_RENEW_BATCH)
        ]
        done = 0
        for start in range(0, len(batches), MAX_CONCURRENT_RENEWALS):
            chunk = batches[start : start + MAX_CONCURRENT_RENEWALS]
            done += sum(await asyncio.gather(*(self._renew_batch(*b) for b in chunk)))
        return done

    async def _renew_batch(self, group: str, topic: str, handles: list[str]) -> int:
        """Renew ``handles``; how many were renewed (the others are forgotten when the leader
        says they are no longer in flight, or kept for the next pass on a failure)."""
        try:
            codes = await self.renew(group, topic, handles, self.policy.slice_ms)
        except (BrokerError, DLedgerError) as exc:
            logger.info(
                "auto_renew of %d %s messages failed, next pass: %s", len(handles), group, exc
            )
            return 0
        deadline = self._clock_ms() + self.policy.slice_ms
        renewed = 0
        for handle, code in zip(handles, codes, strict=False):
            t = self.table.get(handle)
            if t is None:
                continue  # acked meanwhile
            if not code:
                t.deadline_ms = deadline
                renewed += 1
            elif code == E.INVALID_RECEIPT_HANDLE:
                del self.table[handle]  # acked, nacked or redelivered since
        self.renewed += renewed
        return renewed

    def _alive(self, client_id: str) -> bool:
        return self.clients.heard_within(client_id, CLIENT_ALIVE_MS)
