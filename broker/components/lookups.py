"""Message lookups: by key (the index file) and by id (offsetMsgId or uniq id).

Answers are decoded messages with their positions and queue offsets, bounded in size like
a pull's, from this node's applied state.
"""

from __future__ import annotations

from typing import NamedTuple

from broker.components.applied import MAX_ANSWER_BYTES, AppliedMessages
from broker.state import derived
from broker.state.errors import (
    BrokerError,
    CorruptMessageError,
    InvalidRequestError,
    MessageNotFoundError,
)
from broker.state.indexfile import build_key, key_hash
from broker.state.message import Message, decode_offset_msg_id, uniq_id_to_bytes, validate_topic

# QueryMessageByKey results (RocketMQ's defaultQueryMaxNum is 32).
DEFAULT_QUERY_MAX_NUM = 32
MAX_QUERY_MAX_NUM = 1024
# A key asked for: a stored message's keys take at most the properties budget (32,767
# bytes), so no longer key can match.
MAX_QUERY_KEY_CHARS = 32_767
# Upper bound of the serialized size of a message in an answer beyond its stored size (which
# already holds every byte of its topic, tags, keys, group, host, properties and body): the two
# ids (34 bytes each), the other scalar fields (at most 11 bytes each with their tags), a tag
# and length prefix for each string field and for the message itself in the answer.
MESSAGE_OVERHEAD_BYTES = 384
# ... plus per key (tag and length prefix) and per property (a map entry: three tags and three
# length prefixes), on top of the separators the stored form has.
KEY_OVERHEAD_BYTES = 4
PROPERTY_OVERHEAD_BYTES = 16
# Candidates read from the index for a uniq id outside the dedup window.
UNIQ_ID_CANDIDATES = 16
_I64_MAX = (1 << 63) - 1


class Found(NamedTuple):
    """A message found, where it is stored and its queue offset (-1: its queue is gone)."""

    message: Message
    position: int
    queue_offset: int


def answer_bytes(stored_size: int, msg: Message) -> int:
    """An upper bound of the bytes ``msg`` (stored in ``stored_size`` bytes) adds to an
    answer, in O(1): no serialization, no copy of the body."""
    return (
        stored_size
        + MESSAGE_OVERHEAD_BYTES
        + KEY_OVERHEAD_BYTES * len(msg.keys)
        + PROPERTY_OVERHEAD_BYTES * len(msg.properties)
    )


class Lookups:
    """Finds applied messages by key or id."""

    def __init__(self, applied: AppliedMessages) -> None:
        self.sm = applied.ctx.sm
        self.applied = applied

    def _found(self, position: int, size: int | None = None) -> Found:
        msg = self.applied.message(position, size)
        return Found(msg, position, self.applied.queue_offset(msg.topic, msg.queue_id, position))

    def _wrong_index_record(self, position: int, hash_value: int, exc: BrokerError) -> None:
        """A key index candidate that could not be read: when the record is wrong (no message
        with a key of its hash there) it is derived damage, not the answer's (docs/BROKER.md,
        "Derived state"): skipped, counted, and the index rebuilt at the next start. When the
        record is right, the commitlog's message is damaged: its error is raised."""
        why = derived.index_problem(self.sm, hash_value, position)
        if not why:
            raise exc
        self.sm.derived.wrong(derived.STORE_INDEX, "read")
        self.sm.request_rebuild(f"key index record at position {position}: {why}")

    def by_key(
        self, topic: str, key: str, max_num: int = 0, begin_ms: int = 0, end_ms: int = 0
    ) -> list[Found]:
        """Messages of ``topic`` with ``key`` stored in [begin_ms, end_ms] (0: no bound),
        newest first, at most ``max_num`` (0: the default)."""
        validate_topic(topic)
        if not key:
            raise InvalidRequestError("key is empty")
        if len(key) > MAX_QUERY_KEY_CHARS:
            raise InvalidRequestError(
                f"key is {len(key)} characters, more than {MAX_QUERY_KEY_CHARS}"
            )
        max_num = min(max_num or DEFAULT_QUERY_MAX_NUM, MAX_QUERY_MAX_NUM)
        # Candidates: different keys may share a hash; check the messages' keys.
        positions = self.sm.index.query_key(topic, key, max_num * 2, begin_ms, end_ms or _I64_MAX)
        out: list[Found] = []
        budget = MAX_ANSWER_BYTES
        for position in positions:
            if position >= self.sm.dispatch_end:
                continue
            try:
                size = self.applied.size_at(position)
                if out and size + MESSAGE_OVERHEAD_BYTES > budget:
                    break
                found = self._found(position, size)
            except (CorruptMessageError, MessageNotFoundError) as exc:
                self._wrong_index_record(position, key_hash(build_key(topic, key)), exc)
                continue
            if found.message.topic != topic or key not in found.message.keys:
                continue
            cost = answer_bytes(size, found.message)
            if out and cost > budget:
                break
            out.append(found)
            budget -= cost
            if len(out) >= max_num:
                break
        return out

    def by_offset_msg_id(self, offset_msg_id: str) -> Found:
        """The message an offsetMsgId names."""
        position = decode_offset_msg_id(offset_msg_id).position
        try:
            return self._found(position)
        except CorruptMessageError:
            raise MessageNotFoundError(f"no message starts at position {position}") from None

    def by_uniq_id(self, msg_id: str, topic: str = "") -> Found:
        """The message with uniq id ``msg_id``: from the dedup window, else (``topic``
        needed) from the key index."""
        uniq = msg_id.upper()
        uniq_id_to_bytes(uniq)  # 32 hex characters, or INVALID_MESSAGE_ID (never echoed)
        recent = self.sm.find_uniq(uniq)
        if recent is not None and (not topic or recent.topic == topic):
            return self._found(recent.position)
        if not topic:
            raise InvalidRequestError(
                "msg_id outside the dedup window: give the topic to search the key index"
            )
        validate_topic(topic)
        for position in self.sm.index.query_key(topic, uniq, UNIQ_ID_CANDIDATES):
            if position >= self.sm.dispatch_end:
                continue
            try:
                found = self._found(position)
            except (CorruptMessageError, MessageNotFoundError) as exc:
                self._wrong_index_record(position, key_hash(build_key(topic, uniq)), exc)
                continue
            if found.message.uniq_id == uniq and found.message.topic == topic:
                return found
        raise MessageNotFoundError(f"no message {uniq} in topic {topic!r}")
