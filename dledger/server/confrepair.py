"""A damaged ``membership.json`` repaired at start (docs/FORMAT.md "Membership file",
docs/STORAGE.md "Damage and repair").

The file is a cache: the configuration in force at an index, so that a start replays only the
CONFIG entries above the applied index. Every way it can be bad is detected when it is read:
it does not parse, a field is out of bounds or of the wrong type, the configuration fails
validation (:func:`dledger.server.membership.load_conf`), its index is above both the log's
end and the promised index, or the log holds a CONFIG entry at its index that says otherwise
(:func:`check_against_log`). A file of a newer release is not damage: it stops the start
(``FORMAT_TOO_NEW``) as every other file of the store does.

A damaged file is rebuilt from what else knows the configuration in force at the applied index
``A``, in the order of what is known (:func:`decide`):

1. ``log``: the last CONFIG entry of the log at or below ``A`` (committed: the application
   applied it). The log is the authoritative record; the scan reads it from its first index.
2. ``settings``: the log holds no CONFIG entry up to ``A`` and starts at index 1, and the node
   was not started to join a group: the configuration in force is the one the group started
   from, ``dLegerPeers``. A node started to join (``joinAddr``) began from the group's log, not
   from its settings: with an empty log it is still the learner that knows only itself, as at
   its first start; with entries, the settings decide nothing.
3. ``quorum``: the other members' answers to ``Holdings`` carry the configuration in force at
   their commit index ``K``, set at index ``c``: it is the one in force at ``A`` when
   ``c <= A <= K`` (no CONFIG entry between ``c`` and ``K``, and the committed prefixes agree).
   Every such answer must agree; rounds repeat until one decides or ``QUORUM_WAIT_MS`` passed.

Nothing here ever picks a configuration no committed entry or agreed answer says: when none
decides, the start is refused with a clear error (``INVALID_CONFIG``) as before.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import grpc
from raftmq.dledger.v1 import dledger_pb2 as pb
from raftmq.dledger.v1 import dledger_pb2_grpc as pb_grpc

from dledger.core import ConfState
from dledger.core.membership import CONF_BODY_MAX_BYTES, decode, joining
from dledger.log import ConfigError, EntryType, LogStore
from dledger.server.membership import DamagedConfFileError, load_conf
from mqsecurity.channels import open_aio_channel

if TYPE_CHECKING:
    from dledger.server.node import DLedgerNode

logger = logging.getLogger(__name__)

# Where the configuration a start uses came from: the file, or the repair's source.
FROM_FILE = "file"
FROM_LOG = "log"
FROM_SETTINGS = "settings"
FROM_QUORUM = "quorum"
REPAIR_SOURCES = (FROM_LOG, FROM_SETTINGS, FROM_QUORUM)
# Bytes the log scan reads per step (the store's read_range bound; a few segments' worth of
# entries held at once at most).
SCAN_STEP_BYTES = 4 << 20
# How long a start waits for the members' answers before it refuses: long enough for a
# member restarting alongside this one to serve, short enough that a node nothing can decide
# for stops with its error within a minute (a supervisor sees it).
QUORUM_WAIT_MS = 30_000
# Between two rounds of questions.
QUORUM_ROUND_MS = 1_000
# Each call's deadline.
QUORUM_CALL_TIMEOUT_MS = 2_000
# Indexes are int64 in the core: larger answers are out of bounds.
MAX_INDEX = (1 << 63) - 1
# Where the operator reads what to do.
DOCS = 'docs/FORMAT.md "Membership file"'


@dataclass(frozen=True, slots=True)
class StartConf:
    """The configuration a start uses (None: the settings' ``dLegerPeers``), where it came
    from, and what was wrong with the file ("" when it was good)."""

    conf: ConfState | None
    source: str
    damage: str = ""
    is_joining: bool = False


@dataclass(frozen=True, slots=True)
class Answer:
    """A member's committed configuration: the one in force at its ``commit_index``."""

    member: str
    conf: ConfState
    commit_index: int


# Asks every other member once (concurrently) what its committed configuration is.
AskQuorum = Callable[[], Awaitable[Sequence[Answer]]]


def check_against_log(conf: ConfState, log: LogStore, promised: int) -> None:
    """DamagedConfFileError when the saved ``conf`` contradicts the log: its index above both
    the log's end and the promised index (a log cut at damage may end below a saved index, but
    never below what it promised), or a CONFIG entry at its index saying otherwise."""
    last = log.last_index()
    if conf.index > max(last, promised):
        raise DamagedConfFileError(
            f"index {conf.index} is above the log's last index {last} and the promised "
            f"index {promised}"
        )
    if not log.first_index() <= conf.index <= last:
        return
    entry = log.read_range(conf.index, SCAN_STEP_BYTES, 1)[0]
    if entry.type == EntryType.CONFIG and _decoded(entry.body, entry.index) != conf:
        raise DamagedConfFileError(
            f"the configuration of index {conf.index} differs from the log's CONFIG entry there"
        )


def _decoded(body: bytes, index: int) -> ConfState:
    try:
        return decode(body, index)
    except ValueError as exc:
        raise ConfigError(f"CONFIG entry {index} of the log: {exc}") from exc


def last_config_in_log(log: LogStore, upto: int) -> ConfState | None:
    """The configuration of the last CONFIG entry in ``[first index, upto]`` (None: none)."""
    upto = min(upto, log.last_index())
    start = log.first_index()
    found: ConfState | None = None
    while start <= upto:
        batch = log.read_range(start, SCAN_STEP_BYTES, upto - start + 1)
        assert batch and batch[0].index == start, "a read of a held range returned nothing"
        for e in batch:
            if e.type == EntryType.CONFIG:
                found = _decoded(e.body, e.index)
        start = batch[-1].index + 1
    return found


def from_answers(answers: Sequence[Answer], applied: int) -> ConfState | None:
    """The configuration in force at ``applied`` the answers decide (None: none decides).
    ConfigError when two deciding answers differ (a member's state cannot be trusted)."""
    deciding = [a for a in answers if a.conf.index <= applied <= a.commit_index]
    if not deciding:
        return None
    first = deciding[0]
    for other in deciding[1:]:
        # The index may differ (a snapshot's, a CONFIG entry's) while the two agree.
        if dataclasses.replace(other.conf, index=0) != dataclasses.replace(first.conf, index=0):
            raise ConfigError(
                f"members disagree on the configuration at index {applied}: "
                f"{first.member} says {first.conf.describe()}, "
                f"{other.member} says {other.conf.describe()}"
            )
    return first.conf


async def decide(
    store_dir: str,
    node_id: str,
    log: LogStore,
    *,
    applied: int,
    promised: int,
    joins: bool,
    ask: AskQuorum,
) -> StartConf:
    """The configuration this start uses (module docstring). ConfigError when the file is
    damaged and nothing decides; FormatTooNewError for a newer release's file."""
    try:
        conf = load_conf(store_dir, node_id)
        if conf is not None:
            check_against_log(conf, log, promised)
        return StartConf(conf, FROM_FILE)
    except DamagedConfFileError as exc:
        damage = str(exc)
    local = decide_locally(node_id, log, applied=applied, joins=joins, damage=damage)
    if local is not None:
        return local
    conf = await _ask_until_decided(ask, applied)
    if conf is None:
        raise ConfigError(
            f"{damage}; nothing decides the configuration in force at the applied index "
            f"{applied}: the log {log.first_index()}..{log.last_index()} holds no CONFIG "
            f"entry up to it, {_why_not_settings(log, joins)}, and no member answered with "
            f"its configuration at that index within {QUORUM_WAIT_MS // 1000} s. Start the "
            f"other members, or restore membership.json from a backup ({DOCS})"
        )
    return StartConf(conf, FROM_QUORUM, damage)


def decide_locally(
    node_id: str, log: LogStore, *, applied: int, joins: bool, damage: str
) -> StartConf | None:
    """What the node's own store and settings decide (None: nothing)."""
    found = last_config_in_log(log, applied)
    if found is not None:
        return StartConf(found, FROM_LOG, damage)
    if log.first_index() == 1 and not joins:
        return StartConf(None, FROM_SETTINGS, damage)
    if joins and log.last_index() == 0 and log.first_index() == 1:
        return StartConf(joining(node_id), FROM_SETTINGS, damage, is_joining=True)
    return None


def _why_not_settings(log: LogStore, joins: bool) -> str:
    if joins:
        return "the node was started to join a group (its settings are not the group's)"
    return f"the log's start (index {log.first_index()}) was deleted"


async def _ask_until_decided(ask: AskQuorum, applied: int) -> ConfState | None:
    deadline = time.monotonic() + QUORUM_WAIT_MS / 1000
    while True:
        answers = await ask()
        conf = from_answers(answers, applied)
        if conf is not None:
            return conf
        left_s = deadline - time.monotonic()
        if left_s <= 0:
            return None
        logger.warning(
            "membership: %d answers, none decides the configuration at index %d; asking again",
            len(answers),
            applied,
        )
        await asyncio.sleep(min(QUORUM_ROUND_MS / 1000, left_s))


def answer_from(member: str, resp: pb.HoldingsResponse) -> Answer | None:
    """A member's committed configuration (None: none given, out of bounds or malformed)."""
    if not resp.config or len(resp.config) > CONF_BODY_MAX_BYTES:
        return None
    if resp.commit_index > MAX_INDEX or resp.config_index > resp.commit_index:
        return None
    try:
        conf = decode(resp.config, resp.config_index)
    except ValueError:
        return None
    return Answer(member, conf, resp.commit_index)


def quorum_asker(node: DLedgerNode, members: Sequence[str]) -> AskQuorum:
    """Ask ``members`` (their peer ports' ``Holdings``, authenticated as the peers' streams)."""
    metadata = node.peer_metadata()
    req = pb.HoldingsRequest(group=node.cfg.group)

    async def one(member: str) -> Answer | None:
        addr = node.peer_addr(member)
        if not addr:
            return None
        try:
            async with open_aio_channel(addr, node.cfg.client_security) as channel:
                resp = await pb_grpc.DLedgerPeerStub(channel).Holdings(
                    req, metadata=metadata, timeout=QUORUM_CALL_TIMEOUT_MS / 1000
                )
        except (grpc.aio.AioRpcError, OSError):
            return None
        return answer_from(member, resp)

    async def ask() -> Sequence[Answer]:
        got = await asyncio.gather(*(one(m) for m in members))
        return [a for a in got if a is not None]

    return ask


__all__ = [
    "FROM_FILE",
    "FROM_LOG",
    "FROM_QUORUM",
    "FROM_SETTINGS",
    "REPAIR_SOURCES",
    "Answer",
    "StartConf",
    "answer_from",
    "check_against_log",
    "decide",
    "decide_locally",
    "from_answers",
    "last_config_in_log",
    "quorum_asker",
]
