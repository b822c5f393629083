"""Topic admin: look topics up for the other components, create, update and delete them.

Changes are proposed to the Raft log on the leader and answered once applied; lookups read
this node's applied topic table.

The table is shared by every user (:data:`broker.state.records.MAX_TOPICS`): a topic keeps the user
who created it (``CreateTopic``, or a send that auto-created it), and one user creates at most
``topicsPerUser`` (:attr:`ServiceConfig.topics_per_user`) that still exist, checked here on the
leader before the record is proposed, one creation at a time. A retry or dead-letter topic
(``%RETRY%g``, ``%DLQ%g``) that a ``ConsumerSendMsgBack`` creates is its caller's too. Super
users, the anonymous user of a group without users and the dead-letter topics the broker
creates itself (POP messages past their attempts, v2 ``ForwardMessageToDeadLetterQueue`` of a
received message) are bounded by the table's size only.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import replace

from broker.components.applied import NodeContext, require_leader
from broker.state.errors import (
    NoPermissionError,
    QueueIdOutOfRangeError,
    QuotaExceededError,
    ResourceExhaustedError,
    SystemTopicError,
    TopicNotFoundError,
)
from broker.state.message import validate_topic
from broker.state.names import is_system_topic, is_valid_topic_name
from broker.state.records import (
    DEFAULT_TOPIC_MESSAGE_TYPE,
    ENTRY_TOPIC,
    MAX_TOPICS,
    PERM_READ,
    PERM_RW,
    PERM_WRITE,
    TOPIC_CREATE_IF_ABSENT,
    TOPIC_DELETE,
    TOPIC_UPSERT,
    TopicConfig,
    encode_topic_record,
)
from mqerrors import codes as E

logger = logging.getLogger(__name__)

# (user name, whether it is a Super user): who makes a call, as the node's guard admitted it.
Owner = tuple[str, bool]
NOBODY: Owner = ("", False)


class TooManyTopicsError(ResourceExhaustedError):
    """The broker group holds :data:`MAX_TOPICS` topics."""

    code = E.TOO_MANY_TOPICS


class Topics:
    """The topic table of one node, read and changed."""

    def __init__(self, ctx: NodeContext) -> None:
        self.ctx = ctx
        # One creation at a time here, so that a quota is not passed by creations in flight.
        self._creating = asyncio.Lock()

    def get(self, name: str) -> TopicConfig:
        """The topic ``name``; ``TopicNotFoundError`` when it does not exist."""
        validate_topic(name)
        topic = self.ctx.sm.topics.get(name)
        if topic is None:
            raise TopicNotFoundError(f"topic {name!r} does not exist")
        return topic

    def listed(self) -> list[TopicConfig]:
        """Every topic, by name."""
        return [t for _, t in sorted(self.ctx.sm.topics.items())]

    def readable_queue(self, name: str, queue_id: int) -> TopicConfig:
        """The topic ``name`` when it is readable and has queue ``queue_id``."""
        topic = self.get(name)
        if not topic.perm & PERM_READ:
            raise NoPermissionError(f"topic {name!r} is not readable (perm={topic.perm})")
        if not 0 <= queue_id < topic.read_queue_nums:
            raise QueueIdOutOfRangeError(
                f"queue id {queue_id} is outside [0, {topic.read_queue_nums}) of {name!r}"
            )
        return topic

    def has_queue(self, name: str, queue_id: int) -> bool:
        """Whether queue ``queue_id`` of ``name`` exists (any name: never raises)."""
        t = self.ctx.sm.topics.get(name) if is_valid_topic_name(name) else None
        return t is not None and 0 <= queue_id < t.read_queue_nums

    async def writable(self, name: str, owner: Owner = NOBODY) -> TopicConfig:
        """The topic a client (user ``owner``) sends to: not a system topic, created when
        absent if ``autoCreateTopicEnable`` (for ``owner``), writable."""
        validate_topic(name)
        if is_system_topic(name):
            raise SystemTopicError(
                f"topic {name!r} is a system topic: only the broker writes it"
                " (failed messages go back with ConsumerSendMsgBack)"
            )
        topic = self.ctx.sm.topics.get(name)
        if topic is None:
            if not self.ctx.cfg.auto_create_topic:
                raise TopicNotFoundError(
                    f"topic {name!r} does not exist (autoCreateTopicEnable=false)"
                )
            n = self.ctx.cfg.default_topic_queue_nums
            topic = await self._create_if_absent(name, n, owner)
            logger.info("topic auto-created topic=%s queues=%d", name, n)
        if not topic.perm & PERM_WRITE:
            raise NoPermissionError(f"topic {topic.name!r} is not writable (perm={topic.perm})")
        return topic

    async def ensure_system(self, name: str, queues: int, owner: Owner = NOBODY) -> None:
        """Create the system topic ``name`` (a retry or dead-letter topic) unless it exists,
        for user ``owner`` (counted against its topicsPerUser; NOBODY: the broker's own)."""
        if name not in self.ctx.sm.topics:
            await self._create_if_absent(name, queues, owner)
            logger.info("system topic created topic=%s queues=%d", name, queues)

    async def _create_if_absent(self, name: str, queues: int, owner: Owner = NOBODY) -> TopicConfig:
        topic = TopicConfig(name, queues, queues, PERM_RW, owner=owner[0])
        topic.validate()
        async with self._creating:
            self._check_room(name, owner)
            record = encode_topic_record(TOPIC_CREATE_IF_ABSENT, topic)
            await self.ctx.node.propose([record], ENTRY_TOPIC)
        return self.ctx.sm.topics[name]

    def held_by(self, user: str) -> int:
        """Topics ``user`` created that still exist. A scan of the table (at most
        MAX_TOPICS, a few ms): it runs once per topic created, never on a send's path."""
        return sum(1 for t in self.ctx.sm.topics.values() if t.owner == user)

    def _check_room(self, name: str, owner: Owner) -> None:
        """Refuse creating ``name`` for ``owner`` when the table or the user's share is full
        (a change of an existing topic takes no room)."""
        topics = self.ctx.sm.topics
        if name in topics:
            return
        if len(topics) >= MAX_TOPICS:
            raise TooManyTopicsError(f"the broker holds {len(topics)} topics, the most it may")
        user, unbounded = owner
        if not user or unbounded:
            return
        held, quota = self.held_by(user), self.ctx.cfg.topics_per_user
        if held >= quota:
            raise QuotaExceededError(
                "topicsPerUser",
                f"user {user!r} created {held} topics here; delete some (mqadmin deleteTopic)",
            )

    async def upsert(
        self,
        name: str,
        read_queue_nums: int,
        write_queue_nums: int,
        perm: int,
        message_type: str = "",
        owner: Owner = NOBODY,
    ) -> TopicConfig:
        """Create or update a topic (zero queue counts and perm, empty message type: the
        defaults) for user ``owner`` (an update keeps the creator); the leader only, never a
        system topic. The topic as applied."""
        require_leader(self.ctx.node)
        n = self.ctx.cfg.default_topic_queue_nums
        topic = TopicConfig(
            name,
            read_queue_nums or n,
            write_queue_nums or n,
            perm or PERM_RW,
            message_type or DEFAULT_TOPIC_MESSAGE_TYPE,
        )
        topic.validate()
        _refuse_system_topic(topic.name, "created or updated")
        async with self._creating:
            self._check_room(topic.name, owner)
            existing = self.ctx.sm.topics.get(topic.name)
            topic = replace(topic, owner=existing.owner if existing else owner[0])
            topic.validate()
            record = encode_topic_record(TOPIC_UPSERT, topic)
            await self.ctx.node.propose([record], ENTRY_TOPIC)
        return self.ctx.sm.topics[topic.name]

    async def delete(self, name: str) -> None:
        """Delete a topic (the leader only, never a system topic)."""
        require_leader(self.ctx.node)
        validate_topic(name)
        _refuse_system_topic(name, "deleted")
        topic = self.get(name)
        await self.ctx.node.propose([encode_topic_record(TOPIC_DELETE, topic)], ENTRY_TOPIC)


def _refuse_system_topic(name: str, what: str) -> None:
    if is_system_topic(name):
        raise SystemTopicError(
            f"topic {name!r} is a system topic: the broker creates it, it cannot be {what}"
            " through the API"
        )
