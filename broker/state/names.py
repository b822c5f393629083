"""What a valid name is: topics, consumer and producer groups, and which topics are internal.

The one place these rules live. The API checks requests with them, and the state machine checks
every replicated control record with them on apply (a record appended from outside the broker,
or read back from a hostile disk, is held to the same rules), so a name that reaches the topic
table, the offsets table or a file-system path has always passed here.

Every function is pure and O(len(name)), and every error detail is bounded: a name is echoed
only after its length was checked (at most :data:`MAX_GROUP_LENGTH` characters).
"""

from __future__ import annotations

import re

from broker.state.errors import BrokerError, InvalidRequestError, InvalidTopicError
from mqerrors import codes as E

# RocketMQ's TopicValidator.TOPIC_MAX_LENGTH. The broker keeps a topic's length in one byte in
# its records and uses the name as a directory name (consumequeue/{topic}); 127 is far below
# every file system's NAME_MAX (255 bytes).
MAX_TOPIC_LENGTH = 127
# RocketMQ's Validators.CHARACTER_MAX_LENGTH for consumer and producer group names. A group is
# stored with a one-byte length in offsets records and messages, so 255 is also the format's
# bound.
MAX_GROUP_LENGTH = 255
# RocketMQ's TopicValidator / Validators pattern, for topics and groups alike. ASCII only, so a
# name's length in characters is its length in bytes; no "." and no "/", so a valid name is
# always a single, safe path component (never "", "." or "..").
NAME_CHARACTERS = "%|a-zA-Z0-9_-"
NAME_PATTERN = re.compile(f"[{NAME_CHARACTERS}]+")

# Internal topics (RocketMQ's names). The broker creates and writes them itself: delayed
# messages wait in SCHEDULE_TOPIC (one queue per delay level), a consumer group's failed messages
# go to RETRY_PREFIX + group, and those that failed too often to DLQ_PREFIX + group.
SCHEDULE_TOPIC = "SCHEDULE_TOPIC_XXXX"
# Half messages of transactions wait here until their verdict (broker.components.transactions).
TRANS_HALF_TOPIC = "RMQ_SYS_TRANS_HALF_TOPIC"
# Timed messages (RocketMQ 5's timer messages, broker.state.timerrules) wait in TIMER_TOPIC, one
# queue per timer level (RocketMQ 5's name for its timer topic).
TIMER_TOPIC = "rmq_sys_wheel_timer"
RETRY_PREFIX = "%RETRY%"
DLQ_PREFIX = "%DLQ%"
# The longest group whose retry and dead-letter topics are valid topic names.
MAX_RETRYABLE_GROUP_LENGTH = MAX_TOPIC_LENGTH - len(RETRY_PREFIX)


class InvalidGroupError(InvalidRequestError):
    """A consumer or producer group name is empty, too long, or has a character outside
    ``[%|a-zA-Z0-9_-]``."""

    code = E.INVALID_GROUP


def _check_name(name: object, what: str, limit: int, error: type[BrokerError]) -> str:
    """``name`` as a valid str, or ``error`` with a bounded detail."""
    if not isinstance(name, str):
        raise error(f"{what} must be a str, not {type(name).__name__}")
    if not name:
        raise error(f"{what} is empty")
    if len(name) > limit:
        raise error(f"{what} is {len(name)} characters, more than {limit}")
    if NAME_PATTERN.fullmatch(name) is None:
        raise error(f"{what} {name!r} has characters outside [{NAME_CHARACTERS}]")
    return name


def validate_topic_name(name: object) -> None:
    """Raise :class:`~broker.state.errors.InvalidTopicError` (code ``INVALID_TOPIC``) unless
    ``name`` is a valid topic name: 1 to 127 characters from ``[%|a-zA-Z0-9_-]``."""
    _check_name(name, "topic", MAX_TOPIC_LENGTH, InvalidTopicError)


def is_valid_topic_name(name: object) -> bool:
    """True when :func:`validate_topic_name` would accept ``name`` (no exception cost)."""
    return (
        isinstance(name, str)
        and 0 < len(name) <= MAX_TOPIC_LENGTH
        and NAME_PATTERN.fullmatch(name) is not None
    )


def validate_group_name(name: object) -> None:
    """Raise :class:`InvalidGroupError` (code ``INVALID_GROUP``) unless ``name`` is a valid
    consumer or producer group name: 1 to 255 characters from ``[%|a-zA-Z0-9_-]``."""
    _check_name(name, "group", MAX_GROUP_LENGTH, InvalidGroupError)


def is_valid_group_name(name: object) -> bool:
    """True when :func:`validate_group_name` would accept ``name``."""
    return (
        isinstance(name, str)
        and 0 < len(name) <= MAX_GROUP_LENGTH
        and NAME_PATTERN.fullmatch(name) is not None
    )


def is_system_topic(name: str) -> bool:
    """True for the topics the broker owns: the schedule and timer topics, every retry and
    dead-letter topic, and the transactions' half topic. The public API neither creates,
    deletes nor sends to them directly."""
    return name in (SCHEDULE_TOPIC, TIMER_TOPIC, TRANS_HALF_TOPIC) or name.startswith(
        (RETRY_PREFIX, DLQ_PREFIX)
    )
