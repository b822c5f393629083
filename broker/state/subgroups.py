"""Subscription groups as replicated config: per consumer group its consume type (normal or
FIFO), its max delivery attempts and its retry backoff (RocketMQ's ``SubscriptionGroupConfig``:
``consumeMessageOrderly``, ``retryMaxTimes``, ``groupRetryPolicy``).

Every change is one :data:`broker.state.records.ENTRY_SUBGROUP` record (``mqadmin updateSubGroup``
and ``deleteSubGroup``, or a RocketMQ 5 consumer's Settings naming a group that does not exist yet),
applied the same on every member and kept in the broker snapshot. A group remembers the user
who created it (``owner``, "" without users): the leader bounds the groups one user creates
(``subscriptionGroupsPerUser``, :mod:`broker.components.subscriptions`), so that no user can fill
the table for everyone else. A record that breaks a rule raises
:class:`InvalidSubGroupRecordError` before anything changed, so every member skips it. A group
without a record behaves as :func:`default_group` says (docs/RMQ5.md, "Subscription groups").
"""

from __future__ import annotations

import struct
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from broker.state.errors import BrokerError, ResourceExhaustedError
from broker.state.names import is_valid_group_name
from mqerrors import codes as E

OP_UPSERT = 1  # create or replace the group's config
OP_CREATE_IF_ABSENT = 2  # a consumer's Settings: never replaces an admin's config
OP_DELETE = 3  # mqadmin deleteSubGroup: the group's config goes (a group without one: defaults)
_OPS = frozenset({OP_UPSERT, OP_CREATE_IF_ABSENT, OP_DELETE})
SUBGROUP_RECORD_VERSION = 1
# Version 2 adds the creator's username after the group name, and op 3. Records without an
# owner and of ops 1 and 2 are still written as version 1, which members of the previous
# release read.
SUBGROUP_RECORD_VERSION_OWNED = 2
# Characters of an owner (a username: broker.state.auth's limit is far below).
MAX_OWNER_CHARS = 255

BACKOFF_CUSTOMIZED = "CUSTOMIZED"
BACKOFF_EXPONENTIAL = "EXPONENTIAL"
_KINDS = (BACKOFF_CUSTOMIZED, BACKOFF_EXPONENTIAL)

# Groups with a config: far above a deployment's consumer groups, small enough that made-up
# group names in consumers' Settings cannot grow the table (and the snapshot) without bound.
MAX_SUBGROUPS = 10_000
# Deliveries of a message before %DLQ%{group}: broker.components.pop.MAX_ATTEMPTS_LIMIT.
MAX_ATTEMPTS_LIMIT = 1000
# Steps of a customized backoff: RocketMQ's default has 18 (its delay levels from 1 s).
MAX_BACKOFF_STEPS = 32
# One backoff delay becomes an invisible time: at most broker.components.pop.MAX_INVISIBLE_MS (12
# h).
MAX_BACKOFF_MS = 12 * 3600 * 1000
# An exponential backoff's multiplier, kept in thousandths: 1.0 (constant) to 10.0.
MIN_MULTIPLIER_MILLI = 1000
MAX_MULTIPLIER_MILLI = 10_000
# RocketMQ's default group retry policy: its delay levels from 1 s (1s 5s 10s 30s 1m .. 2h).
DEFAULT_BACKOFF_MS = (
    1000, 5000, 10_000, 30_000, 60_000, 120_000, 180_000, 240_000, 300_000, 360_000, 420_000,
    480_000, 540_000, 600_000, 1_200_000, 1_800_000, 3_600_000, 7_200_000,
)  # fmt: skip

# version, op, flags, max attempts, backoff kind, step count
_HEAD = struct.Struct(">BBBHBB")
_U32 = struct.Struct(">I")
_EXP = struct.Struct(">III")  # initial ms, max ms, multiplier in thousandths
_U8 = struct.Struct(">B")
_FLAG_FIFO = 1


class InvalidSubGroupRecordError(BrokerError):
    """A subscription-group record that breaks a rule: every member skips it."""

    code = E.INVALID_RECORD


class TooManySubGroupsError(ResourceExhaustedError):
    """The broker holds :data:`MAX_SUBGROUPS` group configs."""

    code = E.TOO_MANY_SUBGROUPS


@dataclass(frozen=True, slots=True)
class Backoff:
    """A retry backoff: ``steps_ms`` (CUSTOMIZED: the delay before attempt n + 1 is step n,
    the last one repeating), or ``initial_ms`` times ``multiplier_milli / 1000`` per attempt up
    to ``max_ms`` (EXPONENTIAL)."""

    kind: str = BACKOFF_CUSTOMIZED
    steps_ms: tuple[int, ...] = DEFAULT_BACKOFF_MS
    initial_ms: int = 0
    max_ms: int = 0
    multiplier_milli: int = MIN_MULTIPLIER_MILLI

    def delay_ms(self, attempt: int) -> int:
        """The delay after delivery ``attempt`` (1 first) failed."""
        n = max(1, attempt)
        if self.kind == BACKOFF_CUSTOMIZED:
            return self.steps_ms[min(n, len(self.steps_ms)) - 1]
        factor = (self.multiplier_milli / 1000) ** min(n - 1, 64)
        return int(min(self.initial_ms * factor, self.max_ms))


@dataclass(frozen=True, slots=True)
class SubGroup:
    """One consumer group's config."""

    name: str
    fifo: bool = False
    max_attempts: int = 16
    backoff: Backoff = Backoff()
    owner: str = ""  # the user who created it ("" without users); kept by later upserts


def default_group(name: str, max_attempts: int) -> SubGroup:
    """A group without a record: normal, the broker's ``popMaxDeliveryAttempts``, RocketMQ's
    default backoff."""
    return SubGroup(name, False, max_attempts, Backoff())


def check_group(g: SubGroup) -> None:
    """Raise :class:`InvalidSubGroupRecordError` unless every field is in range."""
    if not is_valid_group_name(g.name):
        raise InvalidSubGroupRecordError("subscription group record names an invalid group")
    if len(g.owner.encode("utf-8")) > MAX_OWNER_CHARS:
        raise InvalidSubGroupRecordError(f"an owner over {MAX_OWNER_CHARS} bytes")
    if not 1 <= g.max_attempts <= MAX_ATTEMPTS_LIMIT:
        raise InvalidSubGroupRecordError(
            f"max delivery attempts {g.max_attempts} outside [1, {MAX_ATTEMPTS_LIMIT}]"
        )
    b = g.backoff
    if b.kind == BACKOFF_CUSTOMIZED:
        if not 1 <= len(b.steps_ms) <= MAX_BACKOFF_STEPS:
            raise InvalidSubGroupRecordError(f"a backoff of 1 to {MAX_BACKOFF_STEPS} steps")
        if any(not 0 <= s <= MAX_BACKOFF_MS for s in b.steps_ms):
            raise InvalidSubGroupRecordError(f"a backoff step outside [0, {MAX_BACKOFF_MS}] ms")
    elif b.kind == BACKOFF_EXPONENTIAL:
        if not 0 <= b.initial_ms <= b.max_ms <= MAX_BACKOFF_MS:
            raise InvalidSubGroupRecordError(
                f"exponential backoff needs 0 <= initial <= max <= {MAX_BACKOFF_MS} ms"
            )
        if not MIN_MULTIPLIER_MILLI <= b.multiplier_milli <= MAX_MULTIPLIER_MILLI:
            raise InvalidSubGroupRecordError("exponential backoff multiplier outside [1, 10]")
    else:
        raise InvalidSubGroupRecordError(f"backoff kind {b.kind!r}")


def encode_subgroup_record(op: int, g: SubGroup) -> bytes:
    owned = bool(g.owner) or op == OP_DELETE
    b = g.backoff
    kind = _KINDS.index(b.kind)
    name = g.name.encode("utf-8")
    flags = _FLAG_FIFO if g.fifo else 0
    if b.kind == BACKOFF_CUSTOMIZED:
        body = b"".join(_U32.pack(s) for s in b.steps_ms)
        count = len(b.steps_ms)
    else:
        body = _EXP.pack(b.initial_ms, b.max_ms, b.multiplier_milli)
        count = 0
    version = SUBGROUP_RECORD_VERSION_OWNED if owned else SUBGROUP_RECORD_VERSION
    head = _HEAD.pack(version, op, flags, g.max_attempts, kind, count)
    out = head + body + _U8.pack(len(name)) + name
    if owned:
        owner = g.owner.encode("utf-8")
        assert len(owner) <= MAX_OWNER_CHARS
        out += _U8.pack(len(owner)) + owner
    return out


def decode_subgroup_record(body: bytes) -> tuple[int, SubGroup]:
    try:
        version, op, flags, attempts, kind, count = _HEAD.unpack_from(body, 0)
        at = _HEAD.size
        if kind >= len(_KINDS):
            raise InvalidSubGroupRecordError(f"subscription group record backoff kind {kind}")
        if _KINDS[kind] == BACKOFF_CUSTOMIZED:
            steps = tuple(_U32.unpack_from(body, at + 4 * i)[0] for i in range(count))
            backoff = Backoff(BACKOFF_CUSTOMIZED, steps)
            at += 4 * count
        else:
            initial, most, multiplier = _EXP.unpack_from(body, at)
            backoff = Backoff(BACKOFF_EXPONENTIAL, (), initial, most, multiplier)
            at += _EXP.size
        name, at = _text(body, at)
        owner = ""
        if version == SUBGROUP_RECORD_VERSION_OWNED:
            owner, at = _text(body, at)
    except (IndexError, struct.error, UnicodeDecodeError) as exc:
        raise InvalidSubGroupRecordError(f"truncated subscription group record: {exc}") from None
    known = version == SUBGROUP_RECORD_VERSION_OWNED or (
        version == SUBGROUP_RECORD_VERSION and op != OP_DELETE
    )
    if at != len(body) or not known or op not in _OPS:
        raise InvalidSubGroupRecordError(f"subscription group record version {version} op {op}")
    if flags & ~_FLAG_FIFO:
        raise InvalidSubGroupRecordError(f"subscription group record flags {flags}")
    group = SubGroup(name, bool(flags & _FLAG_FIFO), attempts, backoff, owner)
    check_group(group)
    return op, group


def _text(body: bytes, at: int) -> tuple[str, int]:
    """A u8-length UTF-8 string at ``at``; it and the offset after it."""
    n = body[at]
    if at + 1 + n > len(body):
        raise IndexError("string past the record's end")
    return bytes(body[at + 1 : at + 1 + n]).decode("utf-8"), at + 1 + n


class SubGroupTable:
    """Every group's config, built from committed records only."""

    def __init__(self) -> None:
        self.groups: dict[str, SubGroup] = {}
        self._owned: Counter[str] = Counter()  # groups by owner ("" included)

    def get(self, name: str) -> SubGroup | None:
        return self.groups.get(name)

    def room_for(self, name: str) -> bool:
        return name in self.groups or len(self.groups) < MAX_SUBGROUPS

    def held_by(self, owner: str) -> int:
        """Groups ``owner`` created that still exist."""
        return self._owned[owner]

    def apply(self, body: bytes) -> SubGroup | None:
        """The group as the record leaves it (None: deleted)."""
        op, group = decode_subgroup_record(body)
        known = self.groups.get(group.name)
        if op == OP_DELETE:
            if known is not None:
                self._forget(known)
            return None
        if known is None and len(self.groups) >= MAX_SUBGROUPS:
            raise TooManySubGroupsError(f"the broker holds {MAX_SUBGROUPS} subscription groups")
        if known is None:
            self._put(group)
        elif op == OP_UPSERT:  # a new config; the creator stays the owner
            self.groups[group.name] = replace(group, owner=known.owner)
        return self.groups[group.name]

    def _put(self, group: SubGroup) -> None:
        self.groups[group.name] = group
        self._owned[group.owner] += 1

    def _forget(self, group: SubGroup) -> None:
        del self.groups[group.name]
        self._owned[group.owner] -= 1
        if self._owned[group.owner] <= 0:
            del self._owned[group.owner]

    def reset(self) -> None:
        self.groups = {}
        self._owned = Counter()

    def capture(self) -> list[list[Any]]:
        """JSON-ready rows: [name, fifo, max attempts, kind, steps, initial, max, multiplier,
        owner] (a snapshot of the previous release has no owner: "")."""
        return [
            [
                g.name,
                g.fifo,
                g.max_attempts,
                g.backoff.kind,
                list(g.backoff.steps_ms),
                g.backoff.initial_ms,
                g.backoff.max_ms,
                g.backoff.multiplier_milli,
                g.owner,
            ]
            for g in self.groups.values()
        ]

    def load(self, rows: Iterable[Sequence[Any]]) -> list[str]:
        """Replace the table with a snapshot's rows; the rows left out (invalid, or past the
        limit)."""
        self.reset()
        bad: list[str] = []
        for row in rows:
            try:
                name, fifo, attempts, kind, steps, initial, most, multiplier, *rest = row
                owner = str(rest[0]) if rest else ""
                if not isinstance(fifo, bool) or not isinstance(steps, list) or len(rest) > 1:
                    raise ValueError("fifo or steps of the wrong type, or extra fields")
                if len(owner.encode("utf-8")) > MAX_OWNER_CHARS:
                    raise ValueError("owner too long")
                backoff = Backoff(
                    str(kind), tuple(map(int, steps)), int(initial), int(most), int(multiplier)
                )
                group = SubGroup(str(name), fifo, int(attempts), backoff, owner)
                check_group(group)
            except (TypeError, ValueError, InvalidSubGroupRecordError):
                bad.append(str(row)[:80])
                continue
            if len(self.groups) >= MAX_SUBGROUPS or group.name in self.groups:
                bad.append(group.name)
                continue
            self._put(group)
        return bad
