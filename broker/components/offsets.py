"""Consumer offsets: commits coalesced on the leader, queries, resets, searches and lag.

Asynchronous commits are buffered on the leader and proposed together, one entry for every
offset pending, at most ``offset_commit_interval_ms`` after the first; a synchronous commit
proposes at once. Reads see the leader's buffer first, then the applied offsets.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import NamedTuple

from broker.components.applied import AppliedMessages, require_leader
from broker.components.topics import Topics
from broker.state.errors import (
    BrokerError,
    InvalidRequestError,
    QuotaExceededError,
    ResourceExhaustedError,
    TooManyPendingOffsetsError,
)
from broker.state.message import validate_topic
from broker.state.names import validate_group_name
from broker.state.records import ENTRY_OFFSETS, MAX_OFFSET_GROUPS, OffsetKey, encode_offsets_record
from dledger.core import NotLeaderError
from dledger.log import DLedgerError
from mqerrors import codes as E
from prockit.fatal import supervise

logger = logging.getLogger(__name__)

# Consumer offsets the leader buffers between flushes (group x topic x queue): far above what
# consumers commit in one offsetCommitInterval; beyond it new keys are refused until the flush.
MAX_PENDING_OFFSETS = 100_000
# Of them, one user's at most: broker.conf pendingOffsetsPerUser
# (ServiceConfig.pending_offsets_per_user), so that one user's made-up groups leave the buffer
# to the others' commits. Super users: the buffer's size only.
# The groups with offsets are bounded in total (broker.state.records.MAX_OFFSET_GROUPS) and per user
# (broker.conf offsetGroupsPerUser, ServiceConfig.offset_groups_per_user): a commit that would
# give a new group offsets is counted here, on the leader, before it is buffered or proposed.

Owner = tuple[str, bool]  # (user name, whether it is a Super user)
NOBODY: Owner = ("", False)


class TooManyOffsetGroupsError(ResourceExhaustedError):
    """The broker group holds offsets of :data:`MAX_OFFSET_GROUPS` consumer groups."""

    code = E.TOO_MANY_OFFSET_GROUPS


class QueueLag(NamedTuple):
    """How far a consumer group is behind on one queue: ``committed`` is -1 when it has no
    offset there; ``lag`` counts the messages still in the queue at or after its offset."""

    queue_id: int
    min_offset: int
    max_offset: int
    committed: int
    lag: int


def offsets_record(
    pending: Mapping[OffsetKey, int], owners: Mapping[str, str] | None = None
) -> bytes | None:
    """The offsets record of ``pending``; an entry that cannot be encoded (the API checks
    every group and topic first, so none should be) is dropped with one log line rather than
    blocking every other group's offsets. None when nothing is left."""
    try:
        return encode_offsets_record(pending, owners)
    except BrokerError:
        pass
    good: dict[OffsetKey, int] = {}
    bad = 0
    for (group, topic, queue_id), offset in pending.items():
        try:
            validate_group_name(group)
            validate_topic(topic)
            encode_offsets_record({(group, topic, queue_id): offset}, owners)
        except BrokerError:
            bad += 1
            continue
        good[(group, topic, queue_id)] = offset
    logger.error("offset commit dropped %d offsets that cannot be encoded", bad)
    try:
        return encode_offsets_record(good, owners) if good else None
    except BrokerError as exc:  # e.g. more queues of one group and topic than a record holds
        logger.error("offset commit dropped %d offsets: %s", len(good), exc)
        return None


class ConsumerOffsets:
    """The consumer offsets of one node: the leader's buffer and the applied table."""

    def __init__(self, topics: Topics, applied: AppliedMessages) -> None:
        self.ctx = applied.ctx
        self.topics = topics
        self.applied = applied
        self.pending: dict[OffsetKey, int] = {}
        # The user whose commit buffered each pending key (none kept for ""), and counts.
        self._pending_owner: dict[OffsetKey, str] = {}
        self._pending_by: dict[str, int] = {}
        # Groups given offsets by a commit buffered or proposed and not applied yet -> the user
        # whose commit it was (counted with the applied groups; pruned after each proposal).
        self._new_groups: dict[str, str] = {}
        self.flush_task: asyncio.Task[None] | None = None

    async def commit(
        self,
        group: str,
        topic: str,
        queue_id: int,
        queue_offset: int,
        *,
        sync: bool,
        owner: tuple[str, bool] = ("", False),
    ) -> None:
        """Commit ``group``'s offset of a queue for user ``owner`` (name, Super user):
        buffered, or with ``sync`` proposed now (with everything else pending) and returned
        once applied."""
        require_leader(self.ctx.node)
        validate_group_name(group)
        self.topics.readable_queue(topic, queue_id)
        if queue_offset < 0:
            raise InvalidRequestError(f"offset {queue_offset} is negative")
        key = (group, topic, queue_id)
        pending = self.pending
        if len(pending) >= MAX_PENDING_OFFSETS and key not in pending:
            self.schedule_flush()
            raise TooManyPendingOffsetsError(
                f"{len(pending)} consumer offsets wait for the next flush, the most the leader"
                f" buffers ({MAX_PENDING_OFFSETS}); commit again after it"
            )
        new_group = self._check_group_room(group, owner)
        if key not in pending:
            self._hold(key, owner)
        if new_group:
            self._new_groups[group] = owner[0]
        pending[key] = queue_offset
        if sync:
            await self.flush()
        else:
            self.schedule_flush()

    def pending_by_user(self, user: str) -> int:
        """Offsets buffered for commits of ``user``."""
        return self._pending_by.get(user, 0)

    def _hold(self, key: OffsetKey, owner: tuple[str, bool]) -> None:
        """Count the new pending ``key`` against its user (pendingOffsetsPerUser)."""
        user, unbounded = owner
        if not user:
            return
        held = self._pending_by.get(user, 0)
        if not unbounded and held >= self.ctx.cfg.pending_offsets_per_user:
            self.schedule_flush()
            raise QuotaExceededError(
                "pendingOffsetsPerUser",
                f"user {user!r} has {held} consumer offsets waiting for the next flush;"
                " commit again after it",
            )
        self._pending_owner[key] = user
        self._pending_by[user] = held + 1

    def _check_group_room(self, group: str, owner: Owner) -> bool:
        """Whether ``group`` is new (no offsets applied or on their way); raises when a new one
        does not fit the broker group's table or ``owner``'s offsetGroupsPerUser (a Super
        user's: the table only)."""
        applied = self.ctx.sm.offset_groups
        if group in applied or group in self._new_groups:
            return False
        coming = [o for g, o in self._new_groups.items() if g not in applied]
        if len(applied) + len(coming) >= MAX_OFFSET_GROUPS:
            raise TooManyOffsetGroupsError(
                f"the broker holds offsets of {len(applied) + len(coming)} consumer groups,"
                f" the most it may ({MAX_OFFSET_GROUPS})"
            )
        user, unbounded = owner
        if user and not unbounded:
            held = self.ctx.sm.offset_groups_of(user) + coming.count(user)
            if held >= self.ctx.cfg.offset_groups_per_user:
                raise QuotaExceededError(
                    "offsetGroupsPerUser",
                    f"user {user!r} created offsets of {held} consumer groups; a deleted topic"
                    " frees its groups' offsets (mqadmin deleteTopic)",
                )
        return True

    def groups_created_by(self, user: str) -> int:
        """Consumer groups with offsets (applied or on their way) that ``user`` created."""
        applied = self.ctx.sm.offset_groups
        coming = sum(1 for g, o in self._new_groups.items() if o == user and g not in applied)
        return self.ctx.sm.offset_groups_of(user) + coming

    def _prune_new_groups(self) -> None:
        """Forget the new groups that were applied, or whose offsets are no longer buffered."""
        applied = self.ctx.sm.offset_groups
        buffered = {g for g, _, _ in self.pending}
        self._new_groups = {
            g: o for g, o in self._new_groups.items() if g not in applied and g in buffered
        }

    def _owners_of(self, offsets: Mapping[OffsetKey, int]) -> dict[str, str]:
        """The owners of the new groups among ``offsets`` (for the record)."""
        return {g: o for g, _, _ in offsets if (o := self._new_groups.get(g, ""))}

    def committed(self, group: str, topic: str, queue_id: int) -> int:
        """``group``'s offset of a queue, -1 when it has none."""
        key = (group, topic, queue_id)
        return self.pending.get(key, self.ctx.sm.offsets.get(key, -1))

    def schedule_flush(self) -> None:
        if self.flush_task is None or self.flush_task.done():
            # Supervised: an unexpected exception ends the process (prockit.fatal).
            self.flush_task = supervise(
                asyncio.get_running_loop().create_task(self._delayed_flush(), name="offset-flush"),
                "offset-flush",
            )

    async def _delayed_flush(self) -> None:
        await asyncio.sleep(self.ctx.cfg.offset_commit_interval_ms / 1000)
        try:
            await self.flush()
        except (DLedgerError, BrokerError, TimeoutError) as exc:
            # Not the leader, no quorum, back pressure, refused: committed by the next flush or
            # lost with leadership (consumers commit again).
            logger.warning("offset commit failed pending=%d: %s", len(self.pending), exc)

    async def flush(self) -> None:
        """Propose every pending offset in one entry and wait until it is applied."""
        if not self.pending:
            return
        pending, self.pending = self.pending, {}
        # What is proposed holds no more buffer room; a failed flush re-buffers it unowned
        # (at most MAX_PENDING_OFFSETS in all, below).
        self._pending_owner, self._pending_by = {}, {}
        record = offsets_record(pending, self._owners_of(pending))
        try:
            if record is not None:
                await self.ctx.node.propose([record], ENTRY_OFFSETS)
        except NotLeaderError:
            raise  # a follower's buffer is meaningless: drop it
        except Exception:
            # Keep them for the next flush unless superseded (and while there is room).
            buffer = self.pending
            for k, v in pending.items():
                if len(buffer) >= MAX_PENDING_OFFSETS:
                    break
                buffer.setdefault(k, v)
            raise
        finally:
            self._prune_new_groups()

    async def reset(
        self,
        group: str,
        topic: str,
        queue_id: int,
        *,
        queue_offset: int | None = None,
        timestamp_ms: int | None = None,
        owner: Owner = NOBODY,
    ) -> dict[int, int]:
        """Set ``group``'s offsets of a queue (``queue_id`` -1: every readable queue) to
        ``queue_offset`` (clamped to the queue) or to the first message stored at or after
        ``timestamp_ms``, for user ``owner`` (a new group counts against its
        offsetGroupsPerUser); the offsets set, by queue id, once applied."""
        require_leader(self.ctx.node)
        validate_group_name(group)
        config = self.topics.get(topic)
        if queue_id == -1:
            queue_ids = list(range(config.read_queue_nums))
        else:
            self.topics.readable_queue(topic, queue_id)
            queue_ids = [queue_id]
        if (queue_offset is None) == (timestamp_ms is None):
            raise InvalidRequestError("give queue_offset or timestamp_ms")
        offsets: dict[OffsetKey, int] = {}
        for q in queue_ids:
            if queue_offset is not None:
                low, high = self.ctx.sm.queue_offsets(topic, q)
                value = min(max(queue_offset, low), high)
            else:
                value = self.applied.search_offset(topic, q, timestamp_ms or 0)
            offsets[(group, topic, q)] = value
        if self._check_group_room(group, owner):
            self._new_groups[group] = owner[0]
        for k in offsets:
            self.pending.pop(k, None)
            self._release(k)
        record = encode_offsets_record(offsets, self._owners_of(offsets))
        try:
            await self.ctx.node.propose([record], ENTRY_OFFSETS)
        finally:
            self._prune_new_groups()
        return {k[2]: v for k, v in offsets.items()}

    def _release(self, key: OffsetKey) -> None:
        user = self._pending_owner.pop(key, "")
        if user:
            left = self._pending_by[user] - 1
            if left:
                self._pending_by[user] = left
            else:
                del self._pending_by[user]

    def search(self, topic: str, queue_id: int, timestamp_ms: int) -> int:
        """The first queue offset stored at or after ``timestamp_ms`` (max offset if none)."""
        self.topics.readable_queue(topic, queue_id)
        return self.applied.search_offset(topic, queue_id, timestamp_ms)

    def queue_range(self, topic: str, queue_id: int) -> tuple[int, int]:
        """The min and max offsets of a readable queue."""
        self.topics.readable_queue(topic, queue_id)
        return self.ctx.sm.queue_offsets(topic, queue_id)

    def lag(self, group: str, topic: str) -> list[QueueLag]:
        """``group``'s progress on every readable queue of ``topic``, by queue id."""
        validate_group_name(group)
        config = self.topics.get(topic)
        out = []
        for q in range(config.read_queue_nums):
            low, high = self.ctx.sm.queue_offsets(topic, q)
            committed = self.committed(group, topic, q)
            start = low if committed < 0 else min(max(committed, low), high)
            out.append(QueueLag(q, low, high, committed, high - start))
        return out
