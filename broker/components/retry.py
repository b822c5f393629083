"""Retries and dead letters: a consumer sends failed messages back.

Each failed message gets a copy for ``%RETRY%{group}``, delayed by its reconsume level (the
scheduler delivers it when due), or, past the group's max reconsume times (or with a negative
delay level), for ``%DLQ%{group}``. All copies of one request go in one log entry, with uniq
ids derived from (message, group, attempt), so a repeated request is a duplicate.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import NamedTuple

from broker.components.applied import AppliedMessages
from broker.components.sending import SendPath
from broker.components.topics import NOBODY, Owner, Topics
from broker.state.delayrules import (
    DEFAULT_MAX_RECONSUME_TIMES,
    DLQ_QUEUE_NUMS,
    PROPERTY_DELAY,
    RETRY_QUEUE_NUMS,
    dlq_topic,
    due_ms,
    retry_topic,
    send_back_copy,
)
from broker.state.errors import InvalidRequestError, MessageNotFoundError
from broker.state.machine import SendResult
from broker.state.message import Message, uniq_id_to_bytes, validate_topic
from broker.state.names import validate_group_name

logger = logging.getLogger(__name__)

# Messages sent back at once (a consumer sends back one failed batch at a time).
MAX_SEND_BACK_BATCH = 1024


class SendBackItem(NamedTuple):
    """A failed message as pulled: its position, and its msg_id (checked there; empty:
    not checked)."""

    position: int
    msg_id: str = ""


class SendBackResult(NamedTuple):
    """Where a failed message's copy went: ``deliver_at_ms`` is when a retry becomes
    consumable (0 for the dead-letter topic)."""

    topic: str
    dead_lettered: bool
    stored: SendResult
    deliver_at_ms: int


class Retries:
    """Stores the retry or dead-letter copies of failed messages."""

    def __init__(self, topics: Topics, applied: AppliedMessages, sender: SendPath) -> None:
        self.ctx = applied.ctx
        self.topics = topics
        self.applied = applied
        self.sender = sender

    async def send_back(
        self,
        group: str,
        items: Sequence[SendBackItem],
        delay_level: int = 0,
        max_reconsume_times: int | None = None,
        owner: Owner = NOBODY,
    ) -> list[SendBackResult]:
        """Store a copy of each failed message (one entry for all); one result per item.
        ``delay_level`` 0: by reconsume times; below 0: straight to the dead-letter topic. A
        retry or dead-letter topic created for it is user ``owner``'s (topicsPerUser; NOBODY:
        the broker's own, as POP's dead letters)."""
        self.sender.check_writable()
        validate_group_name(group)
        if not 1 <= len(items) <= MAX_SEND_BACK_BATCH:
            raise InvalidRequestError(f"send back 1 to {MAX_SEND_BACK_BATCH} messages")
        retry = retry_topic(group)
        validate_topic(retry)
        max_times = (
            DEFAULT_MAX_RECONSUME_TIMES if max_reconsume_times is None else max_reconsume_times
        )
        now_ms = int(time.time() * 1000)
        levels = self.ctx.cfg.delay_levels_ms
        copies = [
            send_back_copy(self._failed(item), group, delay_level, max_times, now_ms, len(levels))
            for item in items
        ]
        dlq = dlq_topic(group)
        if any(c.topic == dlq for c in copies):
            await self.topics.ensure_system(dlq, DLQ_QUEUE_NUMS, owner)
        if any(c.topic != dlq for c in copies):
            await self.topics.ensure_system(retry, RETRY_QUEUE_NUMS, owner)
        results = await self.sender.store(copies)  # one entry for the whole batch
        out = []
        for copy, result in zip(copies, results, strict=True):
            dead = copy.topic == dlq
            level = int(copy.properties.get(PROPERTY_DELAY, "0") or 0)
            deliver_at_ms = 0 if dead else due_ms(result.store_timestamp_ms, level, levels)
            out.append(SendBackResult(dlq if dead else retry, dead, result, deliver_at_ms))
        logger.debug(
            "send back group=%s messages=%d dead_lettered=%d",
            group,
            len(out),
            sum(r.dead_lettered for r in out),
        )
        return out

    def _failed(self, item: SendBackItem) -> Message:
        """The stored message ``item`` names (its msg_id checked when given)."""
        if item.msg_id:
            uniq_id_to_bytes(item.msg_id.upper())  # or INVALID_MESSAGE_ID, never echoed
        stored = self.applied.message(item.position)
        if item.msg_id and stored.uniq_id != item.msg_id.upper():
            raise MessageNotFoundError(
                f"the message at position {item.position} is {stored.uniq_id}, not {item.msg_id}"
            )
        return stored
