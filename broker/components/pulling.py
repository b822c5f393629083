"""Pulls: one pull path (stored bytes, tag filter by hash) and the long-poll registry.

A pull reads this node's applied ConsumeQueue and answers with the matching messages exactly
as stored (each CRC checked), their queue offsets and positions; the consumer decodes them
and checks tags exactly (as RocketMQ's does). A pull that finds nothing new waits, up to its
suspend timeout, until apply dispatches a matching message to its queue.
"""

from __future__ import annotations

import asyncio
import enum
import os
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from broker.components.applied import MAX_ANSWER_BYTES, AppliedMessages
from broker.components.stats import BrokerStats
from broker.components.topics import Topics
from broker.state import derived
from broker.state.errors import InvalidRequestError, QuotaExceededError, TooManyLongPollsError
from broker.state.machine import QueueKey
from broker.state.message import tags_hash
from dledger.core import Role

# Long polling: RocketMQ's default hold (brokerSuspendMaxTimeMillis is 15 s on the client
# side); a request may ask for more, up to 60 s, so a hung consumer never pins a handler longer.
DEFAULT_SUSPEND_TIMEOUT_MS = 15_000
MAX_SUSPEND_TIMEOUT_MS = 60_000
# Pull sizes: RocketMQ's default pull batch is 32; 1024 bounds one response (and its memory).
DEFAULT_PULL_MAX_MSGS = 32
MAX_PULL_MSGS = 1024
# Per message beyond its stored bytes: its queue offset and position in the answer, packed
# varints of at most 10 bytes each.
PULL_PER_MESSAGE_BYTES = 20
# ConsumeQueue records one pull scans for tag matches (RocketMQ scans 16,000 bytes = 800).
PULL_MAX_SCAN_RECORDS = 800
# A subscription expression ("TagA || TagB || ..."): RocketMQ's are short tag lists.
MAX_SUBSCRIPTION_CHARS = 4096
# Long polls held at once by a node, and per connection (a front end's peer): a consumer
# holds at most one per queue it was allocated; each costs a handler and a future until it
# is answered.
MAX_LONG_POLLS = 10_000
MAX_LONG_POLLS_PER_PEER = 1024
# Of them, one user's at most: broker.conf longPollsPerUser (ServiceConfig.long_polls_per_user),
# a tenth by default, so that one user's pulls (from any number of connections) leave the rest.
DEFAULT_LONG_POLLS_PER_USER = 1000


class PullStatus(enum.Enum):
    FOUND = "FOUND"
    NO_NEW_MSG = "NO_NEW_MSG"
    NO_MATCHED_MSG = "NO_MATCHED_MSG"
    OFFSET_ILLEGAL = "OFFSET_ILLEGAL"


@dataclass(frozen=True, slots=True)
class PullQuery:
    """One pull: ``max_msgs`` and ``suspend_timeout_ms`` 0 for the defaults."""

    topic: str
    queue_id: int
    queue_offset: int
    max_msgs: int = 0
    subscription: str = ""
    suspend_timeout_ms: int = 0
    no_suspend: bool = False
    # The user pulling ("" without users), and whether it is a Super user: a held pull counts
    # against its longPollsPerUser, but a Super user's.
    owner: str = ""
    unbounded: bool = False


@dataclass(slots=True)
class PullResult:
    """A pull's answer: the messages back to back as stored, and per message its queue
    offset and commitlog position."""

    status: PullStatus
    next_begin_offset: int
    min_offset: int
    max_offset: int
    raw: bytes = b""
    queue_offsets: list[int] = field(default_factory=list)
    positions: list[int] = field(default_factory=list)
    suggest_pull_from_follower: bool = False


def total_memory_bytes() -> int:
    """This machine's RAM (8 GiB when it cannot be read)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return 8 << 30


def parse_subscription(expression: str) -> frozenset[str] | None:
    """``"*"`` or empty: every message (None); ``"TagA || TagB"``: those tags."""
    if len(expression) > MAX_SUBSCRIPTION_CHARS:
        raise InvalidRequestError(
            f"subscription is {len(expression)} characters, more than {MAX_SUBSCRIPTION_CHARS}"
        )
    text = expression.strip()
    if not text or text == "*":
        return None
    tags = frozenset(t.strip() for t in text.split("||") if t.strip())
    if not tags:
        raise InvalidRequestError("the subscription names no tag")
    return tags


@dataclass(slots=True, eq=False)  # compared and hashed by identity: a key of its queue's dict
class _Waiter:
    hashes: frozenset[int] | None
    future: asyncio.Future[None]
    peer: str
    owner: str = ""


class LongPolls:
    """The pulls waiting for messages, per queue, bounded per node, per peer and per user."""

    def __init__(
        self,
        max_per_user: int = DEFAULT_LONG_POLLS_PER_USER,
        on_waiting: Callable[[bool], None] | None = None,
    ) -> None:
        """``on_waiting``: called with True when the first poll is held, False when the last
        one leaves (the Raft member then asks its leader for commits without delay)."""
        assert max_per_user > 0
        self.max_per_user = max_per_user
        self._on_waiting = on_waiting
        self._waiters: dict[QueueKey, dict[_Waiter, None]] = {}
        self._by_peer: dict[str, int] = {}
        self._by_user: dict[str, int] = {}  # held pulls by user (not "": no users)
        self.held = 0

    def __len__(self) -> int:
        return self.held

    def held_by(self, peer: str) -> int:
        return self._by_peer.get(peer, 0)

    def held_by_user(self, user: str) -> int:
        return self._by_user.get(user, 0)

    def wake(self, touched: Mapping[QueueKey, set[int]]) -> None:
        """A dispatch listener: wake the polls of the queues that just got messages with a
        tag hash they wait for."""
        for key, hashes in touched.items():
            waiters = self._waiters.get(key)
            if not waiters:
                continue
            # Woken waiters leave the dict themselves (wait's finally), so a waiter whose
            # pull timed out never lingers here.
            for w in waiters:
                if not w.future.done() and (w.hashes is None or not w.hashes.isdisjoint(hashes)):
                    w.future.set_result(None)

    async def wait(
        self,
        key: QueueKey,
        hashes: frozenset[int] | None,
        peer: str,
        timeout_s: float,
        owner: tuple[str, bool] = ("", False),
    ) -> bool:
        """Wait until ``key`` gets a matching message (True) or ``timeout_s`` passes;
        ``owner``: the user pulling, and whether it is a Super user (no quota)."""
        self._check_user(*owner)
        waiter = self._add(key, hashes, peer)
        waiter.owner = owner[0]
        if waiter.owner:
            self._by_user[waiter.owner] = self._by_user.get(waiter.owner, 0) + 1
        try:
            await asyncio.wait_for(waiter.future, timeout_s)
            return True
        except TimeoutError:
            return False
        finally:
            self._remove(key, waiter)

    def _check_user(self, user: str, unbounded: bool) -> None:
        held = self._by_user.get(user, 0)
        if user and not unbounded and held >= self.max_per_user:
            raise QuotaExceededError(
                "longPollsPerUser",
                f"user {user!r} has {held} pulls held on this node; pull again later",
            )

    def _add(self, key: QueueKey, hashes: frozenset[int] | None, peer: str) -> _Waiter:
        held = self._by_peer.get(peer, 0)
        if held >= MAX_LONG_POLLS_PER_PEER:
            raise TooManyLongPollsError(
                f"this connection holds {held} long polls, the most it may"
                f" ({MAX_LONG_POLLS_PER_PEER}); pull again later"
            )
        if self.held >= MAX_LONG_POLLS:
            raise TooManyLongPollsError(
                f"the node holds {self.held} long polls, the most it may"
                f" ({MAX_LONG_POLLS}); pull again later"
            )
        waiter = _Waiter(hashes, asyncio.get_running_loop().create_future(), peer)
        self._waiters.setdefault(key, {})[waiter] = None
        self.held += 1
        if self.held == 1 and self._on_waiting is not None:
            self._on_waiting(True)
        self._by_peer[peer] = held + 1
        return waiter

    def _remove(self, key: QueueKey, waiter: _Waiter) -> None:
        if not waiter.future.done():
            waiter.future.cancel()
        waiters = self._waiters.get(key)
        if waiters is None or waiters.pop(waiter, False) is False:
            return
        if not waiters:
            del self._waiters[key]
        self.held -= 1
        assert self.held >= 0, self.held
        if self.held == 0 and self._on_waiting is not None:
            self._on_waiting(False)
        left = self._by_peer[waiter.peer] - 1
        if left:
            self._by_peer[waiter.peer] = left
        else:
            del self._by_peer[waiter.peer]
        if waiter.owner:
            mine = self._by_user[waiter.owner] - 1
            if mine:
                self._by_user[waiter.owner] = mine
            else:
                del self._by_user[waiter.owner]

    def queues(self) -> int:
        """Queues with a waiting poll."""
        return len(self._waiters)


class PullPath:
    """Answers pulls from this node's applied state, holding them while nothing is new."""

    def __init__(
        self,
        topics: Topics,
        applied: AppliedMessages,
        memory_bytes: int | None = None,
        stats: BrokerStats | None = None,
    ) -> None:
        """``stats`` is counted into when the process serves metrics (None: nothing is)."""
        self.ctx = applied.ctx
        self.topics = topics
        self.applied = applied
        # A follower's held polls wait for its applies: while any is held, its Raft member
        # asks the leader for each commit without the notice linger (docs/RAFT.md section 4),
        # so a poll is answered about as soon after the send's ack as on the leader.
        self.polls = LongPolls(self.ctx.cfg.long_polls_per_user, self._readers_waiting)
        total = total_memory_bytes() if memory_bytes is None else memory_bytes
        self._memory_limit_bytes = total * self.ctx.cfg.memory_ratio_percent // 100
        self.ctx.sm.add_listener(self.polls.wake)
        self.stats = stats

    def _readers_waiting(self, waiting: bool) -> None:
        self.ctx.node.set_readers_waiting(waiting)

    async def pull(self, query: PullQuery, peer: str) -> PullResult:
        """Answer ``query`` (from the connection ``peer``): at once when there is something
        or ``no_suspend``, else once a matching message arrives or the timeout passes."""
        stats = self.stats
        if stats is None:
            return (await self._pull(query, peer))[0]
        started = time.perf_counter()
        result, held_s = await self._pull(query, peer)
        stats.pull_s.observe(time.perf_counter() - started - held_s)
        if result.queue_offsets:
            stats.pulled.add(query.topic, len(result.queue_offsets), len(result.raw))
        return result

    async def _pull(self, query: PullQuery, peer: str) -> tuple[PullResult, float]:
        """The answer, and the seconds it was held as a long poll."""
        self.topics.readable_queue(query.topic, query.queue_id)
        if query.max_msgs < 0 or query.suspend_timeout_ms < 0:
            raise InvalidRequestError("max_msgs and suspend_timeout_ms must not be negative")
        tags = parse_subscription(query.subscription)
        hashes = None if tags is None else frozenset(tags_hash(t) for t in tags)
        timeout_ms = min(
            query.suspend_timeout_ms or DEFAULT_SUSPEND_TIMEOUT_MS, MAX_SUSPEND_TIMEOUT_MS
        )
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_ms / 1000
        key = (query.topic, query.queue_id)
        held_s = 0.0
        while True:
            result = self.pull_once(query, hashes)
            if result.status is not PullStatus.NO_NEW_MSG or query.no_suspend:
                return result, held_s
            remaining = deadline - loop.time()
            if remaining <= 0:
                return result, held_s
            held_from = loop.time()
            owner = (query.owner, query.unbounded)
            woken = await self.polls.wait(key, hashes, peer, remaining, owner)
            held_s += loop.time() - held_from
            if not woken:
                return self.pull_once(query, hashes), held_s

    def pull_once(self, query: PullQuery, hashes: frozenset[int] | None) -> PullResult:
        """What the queue holds for ``query`` now (the tag filter by hash only). A record
        that does not match the commitlog is rebuilt from it and the pull answered
        (broker.state.derived): derived state never makes a pull answer DATA_LOSS."""
        return derived.read_repaired(
            self.ctx.sm,
            query.topic,
            query.queue_id,
            max(query.max_msgs or DEFAULT_PULL_MAX_MSGS, PULL_MAX_SCAN_RECORDS),
            lambda: self._pull_once(query, hashes),
        )

    def _pull_once(self, query: PullQuery, hashes: frozenset[int] | None) -> PullResult:
        cq = self.ctx.sm.cqs.find(query.topic, query.queue_id)
        low, high = (0, 0) if cq is None else (cq.min_offset, cq.max_offset)
        offset = query.queue_offset
        if offset < low or offset > high:
            status = PullStatus.OFFSET_ILLEGAL
            return PullResult(status, low if offset < low else high, low, high)
        if offset == high or cq is None:
            return PullResult(PullStatus.NO_NEW_MSG, offset, low, high)
        max_msgs = min(query.max_msgs or DEFAULT_PULL_MAX_MSGS, MAX_PULL_MSGS)
        scan = max(max_msgs, PULL_MAX_SCAN_RECORDS) if hashes is not None else max_msgs
        picked = _pick(cq.read(offset, scan), offset, hashes, max_msgs)
        result = PullResult(PullStatus.NO_MATCHED_MSG, picked.next_offset, low, high)
        if picked.offsets:
            result.status = PullStatus.FOUND
            result.raw = self._read_checked(query, picked)
            result.queue_offsets = picked.offsets
            result.positions = picked.positions
            result.suggest_pull_from_follower = self.suggest_follower(picked.positions[-1])
        return result

    def _read_checked(self, query: PullQuery, picked: _Picked) -> bytes:
        """The picked messages back to back, each checked against the commitlog and its
        record. Messages side by side in the commitlog (a batch's, as a producer sends them)
        are read as one run with one read and checked in place; a run that fails a check (or
        cannot be read as one) is read again message by message, which finds the bad one and
        answers for it as a read of one message does (:func:`derived.checked_raw`)."""
        sm, applied = self.ctx.sm, self.applied
        matcher = derived.RowMatcher(query.topic, query.queue_id)
        positions, sizes, tags = picked.positions, picked.sizes, picked.tags
        parts: list[bytes] = []
        lo, count = 0, len(positions)
        while lo < count:
            first = positions[lo]
            end, hi = first + sizes[lo], lo + 1
            while hi < count and positions[hi] == end:
                end += sizes[hi]
                hi += 1
            run = applied.read_run(first, end - first)
            if run is not None and matcher.run_matches(run, sizes, tags, lo, hi):
                parts.append(run)
            else:
                for k in range(lo, hi):
                    row = (positions[k], sizes[k], tags[k])
                    offset = picked.offsets[k]
                    parts.append(derived.checked_raw(sm, applied.raw, matcher, offset, row))
            lo = hi
        return b"".join(parts)

    def suggest_follower(self, position: int) -> bool:
        """Whether a reader of ``position`` should go to a follower: the leader is far
        behind in page cache and ``slaveReadEnable`` is on."""
        if not self.ctx.cfg.slave_read_enable or self.ctx.node.role is not Role.LEADER:
            return False
        behind = self.ctx.node.store.write_position - position
        return behind > self._memory_limit_bytes


@dataclass(slots=True)
class _Picked:
    """The records a pull answers with (queue offsets, commitlog positions, sizes, tags),
    and the queue offset its next pull starts from."""

    offsets: list[int]
    positions: list[int]
    sizes: list[int]
    tags: list[int]
    next_offset: int


def _pick(
    records: Iterable[tuple[int, int, int]],
    offset: int,
    hashes: frozenset[int] | None,
    max_msgs: int,
) -> _Picked:
    """Of ``records`` (from queue offset ``offset`` on), those matching ``hashes`` (None:
    all), at most ``max_msgs`` and as many as fit in one answer (always one). Reads nothing:
    the sizes are the records'."""
    picked = _Picked([], [], [], [], offset)
    offsets, positions, sizes, tags = picked.offsets, picked.positions, picked.sizes, picked.tags
    budget = MAX_ANSWER_BYTES
    for i, (position, size, tag_hash) in enumerate(records, offset):
        if hashes is not None and tag_hash not in hashes:
            picked.next_offset = i + 1
            continue
        cost = size + PULL_PER_MESSAGE_BYTES
        if offsets and cost > budget:
            break  # would not fit: the next pull starts with it
        picked.next_offset = i + 1
        offsets.append(i)
        positions.append(position)
        sizes.append(size)
        tags.append(tag_hash)
        budget -= cost
        if len(offsets) >= max_msgs:
            break
    return picked
