"""Reads of applied messages, shared by every component that answers with stored messages.

A node serves only what it has applied (only committed entries ever are): every read checks
the position against the state machine's dispatch end first. Nothing here knows a protocol.
"""

from __future__ import annotations

import asyncio
import logging
import struct
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from typing import Any

from broker.components.raftnode import RaftNode
from broker.components.settings import ServiceConfig
from broker.state.errors import BrokerError, CorruptMessageError, MessageNotFoundError
from broker.state.machine import BrokerStateMachine, QueueKey
from broker.state.message import (
    MESSAGE_HEAD,
    Message,
    check_message,
    decode_message,
    encode_offset_msg_id,
)
from dledger.core import NotLeaderError, Role
from dledger.log import DLedgerError, IndexOutOfRangeError
from msgcodec import STORE_TIMESTAMP_AT
from prockit.fatal import supervise

# Bytes of messages in one answer (a pull, a key query) at most, though it always holds at
# least one: gRPC's default receive limit (4 MiB) less room for the answer's own fields, so a
# stock client with default channel options can read every answer. A single message bigger
# than this (maxMessageSize allows up to 64 MiB) is still answered alone: reading it needs a
# client whose receive limit is raised.
MAX_ANSWER_BYTES = (4 << 20) - 1024

logger = logging.getLogger(__name__)

_STORE_TS = struct.Struct(">q")
_STORE_TS_AT = STORE_TIMESTAMP_AT


def require_leader(node: RaftNode) -> None:
    """Raise ``NotLeaderError`` (naming the leader this node knows) unless it leads."""
    if node.role is not Role.LEADER:
        raise NotLeaderError("not the leader", leader_id=node.leader_id)


def start_leader_task(
    ctx: NodeContext,
    task: asyncio.Task[None] | None,
    make: Callable[[], Coroutine[Any, Any, None]],
    name: str,
) -> asyncio.Task[None] | None:
    """The body of a change listener whose loop runs while the node leads: the running task,
    or a new one from ``make`` when this node leads and none runs. Supervised: an unexpected
    exception ends the process (prockit.fatal), rather than leaving a leader whose loop is
    gone. Outside an event loop (state applied in tests) nothing starts."""
    if ctx.sm.role is not Role.LEADER or (task is not None and not task.done()):
        return task
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        return task
    return supervise(loop.create_task(make(), name=name), name)


class Wakeup:
    """Ends a leader-only job's long sleep early when new work for it was applied, so that a
    job with nothing to do sleeps long instead of polling (each wake-up of an idle leader's
    loop costs its event loop a turn, a timer and a pass). Sleeps of at most ``poll_s`` (a
    job with work pending, polling at its own pace) are never cut short: new work then waits
    for the next pass as before, rather than making a pass per applied entry. Used on the
    event loop only."""

    __slots__ = ("_future", "_woken", "poll_s")

    def __init__(self, poll_s: float) -> None:
        self.poll_s = poll_s
        self._woken = False
        self._future: asyncio.Future[None] | None = None

    def wake(self) -> None:
        self._woken = True
        if self._future is not None and not self._future.done():
            self._future.set_result(None)

    def wake_on_topic(self, topic: str) -> Callable[[Mapping[QueueKey, set[int]]], None]:
        """A dispatch listener (``BrokerStateMachine.add_listener``) that wakes this when an
        applied entry added messages to ``topic``."""

        def listener(touched: Mapping[QueueKey, set[int]]) -> None:
            if any(t == topic for t, _qid in touched):
                self.wake()

        return listener

    async def sleep(self, seconds: float) -> None:
        """Sleep ``seconds``; a sleep longer than ``poll_s`` ends when woken (at once, after
        yielding, if woken since the last sleep ended: during the pass)."""
        try:
            if seconds <= self.poll_s:
                await asyncio.sleep(seconds)
            elif self._woken:
                await asyncio.sleep(0)
            else:
                await self._sleep_until_woken(seconds)
        finally:
            self._woken = False  # the pass that follows sees what woke it

    async def _sleep_until_woken(self, seconds: float) -> None:
        loop = asyncio.get_running_loop()
        future = self._future = loop.create_future()
        timer = loop.call_later(seconds, _resolve, future)
        try:
            await future
        finally:
            timer.cancel()
            self._future = None


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


async def run_while_leading(
    ctx: NodeContext,
    name: str,
    one_pass: Callable[[], Awaitable[float]],
    failed_wait_s: float,
    wakeup: Wakeup | None = None,
) -> None:
    """The loop of a leader-only job (the loop ``start_leader_task`` starts): ``one_pass``
    again and again while this node leads in the term the loop started in, sleeping the
    seconds each pass returns (less when ``wakeup`` is woken: work applied since the pass
    began). A pass that loses leadership or quorum mid-proposal (NOT_LEADER,
    LEADERSHIP_LOST, NO_QUORUM, BACK_PRESSURE) is logged and followed by ``failed_wait_s``:
    each job writes whole records, so nothing is half done, and the next leader resumes from
    the log."""
    node = ctx.node
    term = node.term
    logger.info("%s started node=%s term=%d", name, node.self_id, term)
    while node.role is Role.LEADER and node.term == term:
        try:
            wait_s = await one_pass()
        except (DLedgerError, BrokerError, TimeoutError) as exc:
            logger.info("%s pass failed: %s", name, exc)
            wait_s = failed_wait_s
        if wakeup is None:
            await asyncio.sleep(wait_s)
        else:
            await wakeup.sleep(wait_s)
    logger.info("%s stopped node=%s term=%d", name, node.self_id, term)


# Lays a group's live broker.conf overrides (key -> value) over the node's service settings
# (broker.liveconfig.service_overlay).
Overlay = Callable[[ServiceConfig, Mapping[str, str]], ServiceConfig]


class NodeContext:
    """What every component of a node's broker reads: the Raft node (proposals, role,
    store), the state machine it applies to, and the service settings (``cfg``): the node's
    broker.conf with the group's live overrides laid over it by ``overlay`` (None: the
    broker.conf values alone), rebuilt when the state machine's override table changed."""

    __slots__ = ("_cfg", "_overlay", "_seen", "base_cfg", "node", "sm")

    def __init__(
        self,
        node: RaftNode,
        sm: BrokerStateMachine,
        cfg: ServiceConfig,
        overlay: Overlay | None = None,
    ) -> None:
        self.node, self.sm, self._overlay = node, sm, overlay
        self.base_cfg: ServiceConfig = cfg
        self._cfg: ServiceConfig = cfg
        self._seen: Mapping[str, str] | None = None

    @property
    def cfg(self) -> ServiceConfig:
        """The settings as they are now: one identity check per read, a rebuild per change."""
        if self._overlay is not None:
            overrides = self.sm.config_overrides
            if overrides is not self._seen:
                self._cfg = self._overlay(self.base_cfg, overrides) if overrides else self.base_cfg
                self._seen = overrides
        return self._cfg

    @cfg.setter
    def cfg(self, cfg: ServiceConfig) -> None:
        self.base_cfg = self._cfg = cfg
        self._seen = None


class AppliedMessages:
    """The applied messages of one node's store, by commitlog position."""

    def __init__(self, ctx: NodeContext) -> None:
        self.ctx = ctx
        # offsetMsgId = this prefix (store IPv4 and port) + the position as 16 hex characters.
        self.offset_msg_id_prefix = self.offset_msg_id(0)[:16]

    def offset_msg_id(self, position: int) -> str:
        return encode_offset_msg_id(self.ctx.cfg.store_host, self.ctx.cfg.store_port, position)

    def read(self, position: int, size: int | None = None) -> bytes:
        """The bytes of the applied message at ``position`` (``size`` bytes, read from its
        head when not given), unchecked: the one place that reads stored messages."""
        if not 0 <= position < self.ctx.sm.dispatch_end:
            raise MessageNotFoundError(f"no applied message at position {position}")
        store = self.ctx.node.store
        try:
            if size is None:
                size = MESSAGE_HEAD.unpack(store.read_at(position, MESSAGE_HEAD.size))[0]
            return store.read_at(position, size)
        except IndexOutOfRangeError as exc:
            raise MessageNotFoundError(f"no message at position {position}: {exc}") from None

    def read_run(self, position: int, size: int) -> bytes | None:
        """The ``size`` bytes from ``position`` on, applied messages back to back, in one
        read and unchecked; None when they cannot be read as one (they reach past what is
        applied, or past the end of the log file holding the first): the caller then reads
        the messages one by one, as :meth:`read` does."""
        if position < 0 or size <= 0 or position + size > self.ctx.sm.dispatch_end:
            return None
        try:
            return self.ctx.node.store.read_at(position, size)
        except IndexOutOfRangeError:
            return None

    def size_at(self, position: int) -> int:
        """The stored size of the applied message at ``position``, from its head."""
        return int(MESSAGE_HEAD.unpack(self.read(position, MESSAGE_HEAD.size))[0])

    def message(self, position: int, size: int | None = None) -> Message:
        """The applied message at ``position``, decoded with its CRC checked."""
        try:
            return decode_message(self.read(position, size))
        except CorruptMessageError:
            self.ctx.node.suspect_damage(position)  # the log entry holding it is checked
            raise

    def raw(self, position: int, size: int) -> bytes:
        """The applied message at ``position`` as stored, its head and CRC checked."""
        raw = self.read(position, size)
        try:
            check_message(raw, position)
        except CorruptMessageError:
            self.ctx.node.suspect_damage(position)
            raise
        return raw

    def queue_offset(self, topic: str, queue_id: int, position: int) -> int:
        """The queue offset of the message at ``position`` (-1 when its queue no longer has
        it, e.g. its topic was deleted and created again)."""
        cq = self.ctx.sm.cqs.find(topic, queue_id)
        offset = None if cq is None else cq.offset_of(position)
        return -1 if offset is None else offset

    def search_offset(self, topic: str, queue_id: int, timestamp_ms: int) -> int:
        """The first queue offset whose message was stored at or after ``timestamp_ms`` (the
        queue's max offset when none was)."""
        cq = self.ctx.sm.cqs.find(topic, queue_id)
        if cq is None:
            return 0
        low, high = cq.min_offset, cq.max_offset
        store = self.ctx.node.store
        while low < high:
            mid = (low + high) // 2
            position = cq.get(mid)[0]
            ts = _STORE_TS.unpack(store.read_at(position + _STORE_TS_AT, 8))[0]
            if ts < timestamp_ms:
                low = mid + 1
            else:
                high = mid
        return low
