"""The broker's record vocabulary: the application entry types of the Raft log, and the codecs
and rules of the records :mod:`broker.state.machine` owns (docs/FORMAT.md, "Broker: control
records").

The log is on disk and on the wire, so every byte written here is a format: a change to an
encoder is a format change (a new version byte, both versions read). This module holds only
names, bytes and rules: no state machine, no I/O, no asyncio or gRPC, so the leader-side
components that build records and the state machine that applies them share it without
importing each other.

Entry types (the application range of :class:`dledger.log.EntryType`), each with the module
that owns its body's codec:

- :data:`ENTRY_MESSAGES` (16): a message batch (``broker.state.message.encode_batch``);
- :data:`ENTRY_OFFSETS` (17): consumer offset updates, many per entry (here);
- :data:`ENTRY_TOPIC` (18): one topic admin operation (here);
- :data:`ENTRY_SCHEDULE` (19): due delayed messages delivered to their real queues, with the
  schedule level's new delivered offset (``broker.state.delayrules``);
- :data:`ENTRY_AUTH` (20): one user or ACL admin operation (``broker.state.auth.records``);
- :data:`ENTRY_POP` (21): one change of POP consumption's state (``broker.state.popstate``);
- :data:`ENTRY_SUBGROUP` (22): one subscription group's config (``broker.state.subgroups``);
- :data:`ENTRY_TIMER` (23): one move of a timer level's head (``broker.state.timerrules``);
- :data:`ENTRY_TXN` (24): one change of a transaction (``broker.state.transactions``);
- :data:`ENTRY_BROKER_CONFIG` (25): one live broker.conf override set or cleared
  (``broker.state.brokerconf``; proposed from feature level 2, broker/state/features.py).

:data:`RECORD_TYPES` lists them all; the state machine's handler table must cover exactly these
(``BrokerStateMachine`` asserts it at import).
"""

from __future__ import annotations

import struct
from collections.abc import Mapping
from dataclasses import dataclass

from broker.state.errors import BrokerError, CorruptMessageError, InvalidRequestError
from broker.state.names import (
    SCHEDULE_TOPIC,
    TIMER_TOPIC,
    TRANS_HALF_TOPIC,
    is_valid_group_name,
    is_valid_topic_name,
    validate_topic_name,
)
from dledger import log as dledger_log
from mqerrors import codes as E

# ------------------------------------------------------------------------- entry types

ENTRY_MESSAGES = 16
ENTRY_OFFSETS = 17
ENTRY_TOPIC = 18
ENTRY_SCHEDULE = 19
ENTRY_AUTH = 20
ENTRY_POP = 21
ENTRY_SUBGROUP = 22
ENTRY_TIMER = 23
ENTRY_TXN = 24
ENTRY_BROKER_CONFIG = 25

# Every broker record type -> its name in docs/FORMAT.md. A type not listed is not the
# broker's: apply passes over it (a newer broker's record on an older member).
RECORD_TYPES: Mapping[int, str] = {
    ENTRY_MESSAGES: "messages",
    ENTRY_OFFSETS: "consumer offsets",
    ENTRY_TOPIC: "topic",
    ENTRY_SCHEDULE: "schedule delivery",
    ENTRY_AUTH: "users and ACL rules",
    ENTRY_POP: "POP",
    ENTRY_SUBGROUP: "subscription group",
    ENTRY_TIMER: "timer move",
    ENTRY_TXN: "transaction",
    ENTRY_BROKER_CONFIG: "broker config",
}
assert all(
    dledger_log.APPLICATION_TYPE_MIN <= t <= dledger_log.ENTRY_TYPE_MAX for t in RECORD_TYPES
), "a record type outside the range dledger leaves to applications"

# ------------------------------------------------------------------------- limits and codes

CONTROL_VERSION = 1
TOPIC_UPSERT = 1
TOPIC_CREATE_IF_ABSENT = 2  # auto-creation: concurrent first sends must not reset a config
TOPIC_DELETE = 3
# A topic record naming the user who created the topic (counted against topicsPerUser): the
# message type byte always present, then u8 length + the owner (UTF-8). Written only for a topic
# with an owner, so a group without users writes the version-1 bytes it always did.
TOPIC_RECORD_VERSION_OWNED = 2
# Bytes of an owner (a username: broker.state.auth's limit is far below).
MAX_TOPIC_OWNER_BYTES = 255

# RocketMQ PermName bits.
PERM_INHERIT = 1
PERM_WRITE = 2
PERM_READ = 4
PERM_RW = PERM_READ | PERM_WRITE

# A topic has at most this many queues: each one is a directory of 6 MB files on every member;
# RocketMQ has no hard limit, but thousands of queues per topic are a configuration mistake.
MAX_QUEUE_NUMS = 1024
# A broker group holds at most this many topics: the NameServer refuses a registration listing
# more (nameserver.routes.MAX_TOPICS_PER_NODE), so one topic more would cut the group off from
# every client. A topic record that would add one is skipped on apply.
MAX_TOPICS = 100_000
# Store timestamps are the leader's clock in ms. The key index names its files by the store
# time as yyyyMMddHHmmssSSS (4-digit years), so a message stamped past the year 9000 (or before
# 1970) is a forged or corrupt record, skipped on apply; 9000 leaves the index ~1000 years of
# file names to count up through.
MAX_STORE_TIMESTAMP_MS = 221_845_392_000_000  # 9000-01-01T00:00:00Z
# RocketMQ's defaultTopicQueueNums (broker side) for auto-created topics and CreateTopic
# requests that leave the counts at 0.
DEFAULT_TOPIC_QUEUE_NUMS = 8
_TOPIC_RECORD = struct.Struct(">BBiii")  # version, op, read, write, perm (then u8 len + name)
# RocketMQ 5's topic attribute ``message.type``: the message types a topic takes, which RocketMQ
# 5 clients read from its route (docs/RMQ5.md). MIXED (RocketMQ's default) takes every type.
# The index is the byte a topic record carries after its name (no byte: MIXED).
TOPIC_MESSAGE_TYPES = ("MIXED", "NORMAL", "FIFO", "DELAY", "TRANSACTION")
DEFAULT_TOPIC_MESSAGE_TYPE = "MIXED"
_OFFSETS_HEAD = struct.Struct(">BI")  # version, number of (group, topic) runs
# An offsets record whose every (group, topic) run also names, after the topic, the user whose
# commit first gave the group offsets (u8 length + UTF-8; counted against offsetGroupsPerUser;
# "" for an existing group or nobody). Written only when some run has an owner, so a group
# without users writes the version-1 bytes it always did.
OFFSETS_RECORD_VERSION_OWNED = 2
# Consumer groups that hold offsets in a broker group: each one's offsets are kept in memory,
# the log and every snapshot of every member, and a user with Sub on ``Group:*`` may commit for
# made-up groups. As many as the subscription groups a broker group holds
# (broker.state.subgroups.MAX_SUBGROUPS): every real consumer group fits. A record that would add a
# group beyond it has that group's offsets skipped on apply (the leader refuses them first).
MAX_OFFSET_GROUPS = 10_000
_OFFSET_ITEM = struct.Struct(">iq")  # queue id, offset
_U8 = struct.Struct(">B")
_U16 = struct.Struct(">H")
# The largest offset a record may carry (an i64 on the wire).
I64_MAX = (1 << 63) - 1


class InvalidRecordError(BrokerError):
    """A committed control record breaks a rule the API enforces (a name, a range, a
    schedule header beyond its queue). Raised on apply only: every member skips the record."""

    code = E.INVALID_RECORD


@dataclass(frozen=True, slots=True)
class TopicConfig:
    name: str
    read_queue_nums: int = DEFAULT_TOPIC_QUEUE_NUMS
    write_queue_nums: int = DEFAULT_TOPIC_QUEUE_NUMS
    perm: int = PERM_RW
    message_type: str = DEFAULT_TOPIC_MESSAGE_TYPE
    owner: str = ""  # the user who created it ("" without users, or the broker's own)

    def validate(self) -> None:
        """The API's rules, also applied to every topic record on apply and to every topic
        of a snapshot on load: a valid name, 1 to :data:`MAX_QUEUE_NUMS` read and write
        queues, a perm of RocketMQ's three bits, a message type of
        :data:`TOPIC_MESSAGE_TYPES`."""
        validate_topic_name(self.name)
        for what, n in (("read", self.read_queue_nums), ("write", self.write_queue_nums)):
            if not _is_int(n) or not 1 <= n <= MAX_QUEUE_NUMS:
                raise InvalidRequestError(
                    f"{what} queue nums {n!r:.24} is outside [1, {MAX_QUEUE_NUMS}]"
                )
        if not _is_int(self.perm) or not 0 <= self.perm <= PERM_READ | PERM_WRITE | PERM_INHERIT:
            raise InvalidRequestError(f"perm {self.perm!r:.24} is outside [0, 7]")
        if self.message_type not in TOPIC_MESSAGE_TYPES:
            raise InvalidRequestError(
                f"message type {self.message_type!r:.24} is not one of {TOPIC_MESSAGE_TYPES}"
            )
        if not isinstance(self.owner, str) or len(self.owner.encode()) > MAX_TOPIC_OWNER_BYTES:
            raise InvalidRequestError(f"topic owner over {MAX_TOPIC_OWNER_BYTES} bytes")


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_queue(topic: str, queue_id: int) -> None:
    """A message's queue as a send checks it: a valid topic name, a queue id below
    :data:`MAX_QUEUE_NUMS` (every topic has at most that many; the schedule topic's queue is
    its level - 1, below 255)."""
    if not is_valid_topic_name(topic):
        raise InvalidRecordError(f"message for invalid topic {shown_name(topic)}")
    if not 0 <= queue_id < MAX_QUEUE_NUMS:
        raise InvalidRecordError(f"message queue id {queue_id} is outside [0, {MAX_QUEUE_NUMS})")


OffsetKey = tuple[str, str, int]  # consumer group, topic, queue id


# ------------------------------------------------------------------------- control records


def encode_topic_record(op: int, topic: TopicConfig) -> bytes:
    """The record; a message type other than MIXED as one byte after the name (a MIXED
    topic's record is the same bytes as before the attribute existed); a topic with an owner:
    :data:`TOPIC_RECORD_VERSION_OWNED`, the type byte and the owner."""
    name = topic.name.encode("ascii")
    kind = _U8.pack(TOPIC_MESSAGE_TYPES.index(topic.message_type))
    version = TOPIC_RECORD_VERSION_OWNED if topic.owner else CONTROL_VERSION
    head = _TOPIC_RECORD.pack(
        version, op, topic.read_queue_nums, topic.write_queue_nums, topic.perm
    ) + _U8.pack(len(name))
    if topic.owner:
        owner = topic.owner.encode()
        return head + name + kind + _U8.pack(len(owner)) + owner
    return head + name + (b"" if topic.message_type == DEFAULT_TOPIC_MESSAGE_TYPE else kind)


def decode_topic_record(body: bytes) -> tuple[int, TopicConfig]:
    if len(body) < _TOPIC_RECORD.size + 1:
        raise CorruptMessageError("truncated topic record", 0)
    version, op, read, write, perm = _TOPIC_RECORD.unpack_from(body, 0)
    n = body[_TOPIC_RECORD.size]
    start = _TOPIC_RECORD.size + 1
    versions = (CONTROL_VERSION, TOPIC_RECORD_VERSION_OWNED)
    if version not in versions or op not in (TOPIC_UPSERT, TOPIC_CREATE_IF_ABSENT, TOPIC_DELETE):
        raise CorruptMessageError(f"topic record version {version} op {op}", 0)
    end = start + n  # the name's end
    owner = _topic_record_owner(body, end) if version == TOPIC_RECORD_VERSION_OWNED else None
    if owner is None and len(body) not in (end, end + 1):
        raise CorruptMessageError("topic record size mismatch", 0)
    kind = DEFAULT_TOPIC_MESSAGE_TYPE
    if len(body) > end:
        if body[end] >= len(TOPIC_MESSAGE_TYPES):
            raise CorruptMessageError(f"topic record message type {body[end]}", end)
        kind = TOPIC_MESSAGE_TYPES[body[end]]
    try:
        name = body[start:end].decode("ascii")
    except UnicodeDecodeError:
        raise CorruptMessageError("topic record name is not ASCII", start) from None
    return op, TopicConfig(name, read, write, perm, kind, owner or "")


def _topic_record_owner(body: bytes, end: int) -> str:
    """The owner of a version-2 topic record whose name ends at ``end`` (then the type byte,
    u8 length, the owner: nothing after)."""
    if len(body) < end + 2 or len(body) != end + 2 + body[end + 1]:
        raise CorruptMessageError("topic record size mismatch", 0)
    try:
        owner = body[end + 2 :].decode()
    except UnicodeDecodeError:
        raise CorruptMessageError("topic record owner is not UTF-8", end + 2) from None
    if not owner:
        raise CorruptMessageError("version-2 topic record without an owner", end + 1)
    return owner


def check_topic_record(op: int, topic: TopicConfig, topics: Mapping[str, TopicConfig]) -> None:
    """Raise unless a topic record passes the API's rules given the current ``topics``: a
    valid name (InvalidTopicError) for every op, and for a create or update a valid config
    (:meth:`TopicConfig.validate`) and room in the table (:data:`MAX_TOPICS`). A delete's
    queue counts and perm are not used, so not checked. ``SCHEDULE_TOPIC_XXXX`` is never in a
    record: its queues are the delay levels, owned by the scheduler, and a delete would drop
    every pending delayed message; nor is ``RMQ_SYS_TRANS_HALF_TOPIC``, whose messages are the
    half messages of transactions (a topic config would let consumers read them)."""
    if op == TOPIC_DELETE:
        validate_topic_name(topic.name)
    else:
        topic.validate()
    if topic.name in (SCHEDULE_TOPIC, TIMER_TOPIC, TRANS_HALF_TOPIC):
        raise InvalidRecordError(f"topic record op={op} for {topic.name}, which is internal")
    if op != TOPIC_DELETE and topic.name not in topics and len(topics) >= MAX_TOPICS:
        raise InvalidRecordError(f"topic {topic.name}: the broker holds {MAX_TOPICS} topics")


def encode_offsets_record(
    offsets: Mapping[OffsetKey, int], owners: Mapping[str, str] | None = None
) -> bytes:
    """Offsets grouped by (group, topic): each name once, then (queue id, offset) pairs. With
    ``owners`` (group -> the user creating it; only groups new to the table), a version-2
    record that names each run's owner ("" for the others)."""
    runs: dict[tuple[str, str], list[tuple[int, int]]] = {}
    for (group, topic, queue_id), offset in sorted(offsets.items()):
        runs.setdefault((group, topic), []).append((queue_id, offset))
    owned = any(owners.get(g) for g, _ in runs) if owners else False
    version = OFFSETS_RECORD_VERSION_OWNED if owned else CONTROL_VERSION
    parts = [_OFFSETS_HEAD.pack(version, len(runs))]
    for (group, topic), items in runs.items():
        g, t = group.encode("utf-8"), topic.encode("ascii")
        if len(g) > 255 or len(t) > 255 or len(items) > 0xFFFF:
            raise InvalidRequestError("consumer group or topic too long, or too many queues")
        parts += [_U8.pack(len(g)), g, _U8.pack(len(t)), t]
        if owned:
            assert owners is not None
            o = owners.get(group, "").encode("utf-8")
            if len(o) > MAX_TOPIC_OWNER_BYTES:
                raise InvalidRequestError(f"owner of consumer group {group!r} too long")
            parts += [_U8.pack(len(o)), o]
        parts.append(_U16.pack(len(items)))
        parts.extend(_OFFSET_ITEM.pack(q, o) for q, o in items)
    return b"".join(parts)


def decode_offsets_record(body: bytes) -> dict[OffsetKey, int]:
    """The offsets of a record of either version."""
    return decode_offsets_record_owned(body)[0]


def decode_offsets_record_owned(body: bytes) -> tuple[dict[OffsetKey, int], dict[str, str]]:
    """The offsets of a record of either version, and the owners it names (group -> user, the
    first non-empty one of a group's runs; none in a version-1 record)."""
    owners: dict[str, str] = {}
    try:
        version, runs = _OFFSETS_HEAD.unpack_from(body, 0)
        if version not in (CONTROL_VERSION, OFFSETS_RECORD_VERSION_OWNED):
            raise CorruptMessageError(f"offsets record version {version}", 0)
        at = _OFFSETS_HEAD.size
        out: dict[OffsetKey, int] = {}
        for _ in range(runs):
            n = body[at]
            group = body[at + 1 : at + 1 + n].decode("utf-8")
            at += 1 + n
            n = body[at]
            topic = body[at + 1 : at + 1 + n].decode("ascii")
            at += 1 + n
            if version == OFFSETS_RECORD_VERSION_OWNED:
                n = body[at]
                if n > len(body) - at - 1:
                    raise IndexError("owner past the record's end")
                owner = body[at + 1 : at + 1 + n].decode("utf-8")
                at += 1 + n
                if owner:
                    owners.setdefault(group, owner)
            (count,) = _U16.unpack_from(body, at)
            at += 2
            for queue_id, offset in _OFFSET_ITEM.iter_unpack(
                body[at : at + count * _OFFSET_ITEM.size]
            ):
                out[(group, topic, queue_id)] = offset
            at += count * _OFFSET_ITEM.size
    except (IndexError, struct.error, UnicodeDecodeError) as exc:
        raise CorruptMessageError(f"truncated offsets record: {exc}", 0) from None
    if at != len(body):
        raise CorruptMessageError("offsets record size mismatch", at)
    return out, owners


def shown_name(name: str) -> str:
    """A name for a log line or error detail, cut short (it may be a hostile one)."""
    return repr(name) if len(name) <= 80 else f"{name[:80]!r}... ({len(name)} chars)"


def check_offsets(offsets: Mapping[OffsetKey, int]) -> None:
    """Raise :class:`InvalidRecordError` unless every offset passes the API's rules: a valid
    group and topic name, a queue id in ``[0, MAX_QUEUE_NUMS)`` and an offset ``>= 0``. Not
    checked: that the topic exists with that many queues (a commit may race a topic's delete
    or shrink; members applied such records before, and still do). Names are checked once per
    (group, topic)."""
    seen: set[tuple[str, str]] = set()
    for (group, topic, queue_id), offset in offsets.items():
        if (group, topic) not in seen:
            if not is_valid_group_name(group):
                raise InvalidRecordError(
                    f"offsets record: invalid consumer group {shown_name(group)}"
                )
            if not is_valid_topic_name(topic):
                raise InvalidRecordError(f"offsets record: invalid topic {shown_name(topic)}")
            seen.add((group, topic))
        if not 0 <= queue_id < MAX_QUEUE_NUMS:
            raise InvalidRecordError(
                f"offsets record: queue id {queue_id} of {topic} is outside [0, {MAX_QUEUE_NUMS})"
            )
        if not 0 <= offset <= I64_MAX:
            raise InvalidRecordError(f"offsets record: offset {offset} of {topic} is negative")
