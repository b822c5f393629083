"""Topic admin: look topics up for the other components, create, update and delete them.

Changes are proposed to the Raft log on the leader and answered once applied; lookups read
this node's applied topic table.
"""

from __future__ import annotations

import logging

from broker.applied import NodeContext, require_leader
from broker.errors import (
    NoPermissionError,
    QueueIdOutOfRangeError,
    SystemTopicError,
    TopicNotFoundError,
)
from broker.message import validate_topic
from broker.names import is_system_topic, is_valid_topic_name
from broker.state import (
    DEFAULT_TOPIC_MESSAGE_TYPE,
    ENTRY_TOPIC,
    PERM_READ,
    PERM_RW,
    PERM_WRITE,
    TOPIC_CREATE_IF_ABSENT,
    TOPIC_DELETE,
    TOPIC_UPSERT,
    TopicConfig,
    encode_topic_record,
)

logger = logging.getLogger(__name__)


class Topics:
    """The topic table of one node, read and changed."""

    def __init__(self, ctx: NodeContext) -> None:
        self.ctx = ctx

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

    async def writable(self, name: str) -> TopicConfig:
        """The topic a client sends to: not a system topic, created when absent if
        ``autoCreateTopicEnable``, writable."""
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
            topic = await self._create_if_absent(name, n)
            logger.info("topic auto-created topic=%s queues=%d", name, n)
        if not topic.perm & PERM_WRITE:
            raise NoPermissionError(f"topic {topic.name!r} is not writable (perm={topic.perm})")
        return topic

    async def ensure_system(self, name: str, queues: int) -> None:
        """Create the system topic ``name`` (a retry or dead-letter topic) unless it exists."""
        if name not in self.ctx.sm.topics:
            await self._create_if_absent(name, queues)
            logger.info("system topic created topic=%s queues=%d", name, queues)

    async def _create_if_absent(self, name: str, queues: int) -> TopicConfig:
        topic = TopicConfig(name, queues, queues, PERM_RW)
        topic.validate()
        await self.ctx.node.propose(
            [encode_topic_record(TOPIC_CREATE_IF_ABSENT, topic)], ENTRY_TOPIC
        )
        return self.ctx.sm.topics[name]

    async def upsert(
        self,
        name: str,
        read_queue_nums: int,
        write_queue_nums: int,
        perm: int,
        message_type: str = "",
    ) -> TopicConfig:
        """Create or update a topic (zero queue counts and perm, empty message type: the
        defaults); the leader only, never a system topic. The topic as applied."""
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
        await self.ctx.node.propose([encode_topic_record(TOPIC_UPSERT, topic)], ENTRY_TOPIC)
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
