"""Group membership: the configuration, quorums over it, and the rules of a change.

raftmq changes membership one server at a time (Raft thesis 4.1): every change adds, promotes
or removes exactly one member, so any majority of the old voters and any majority of the new
ones share a member, and no joint configuration is needed. A configuration takes effect on a
member as soon as its ``CONFIG`` entry is in that member's log (committed or not), and a
member whose log loses the entry (a follower's conflict cut) returns to the one before it.
Each ``CONFIG`` entry carries the whole resulting configuration, not a delta, so a member can
adopt it without knowing the one before (a new member replaying the log, a snapshot).

Pure: no I/O. :class:`Membership` is the history a :class:`~dledger.core.raft.RaftNode` keeps
(the configuration at a base index plus the ``CONFIG`` entries above it); :func:`check_change`
says whether a change may be proposed on top of a configuration.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from dledger.core.config import MAX_GROUP_SIZE
from dledger.log import DLedgerError
from mqerrors import codes as E
from mqrelease import BASELINE_LEVEL

# Non-voting members at once: each costs the leader a replication stream, and a learner is only
# a waiting room before its promotion (one at a time is the usual operation, two allow a
# replacement to be prepared while another catches up).
MAX_LEARNERS = 2
# Removed ids remembered (oldest forgotten first). A removed id is never added again while it
# is remembered (a node still holding the old configuration would not know it came back), and
# messages from it are dropped. 32 removals of 64 characters keep a CONFIG entry near 2 KiB.
MAX_REMOVED_IDS = 32
# A member id: what ``dLegerPeers`` and certificates use, bounded like every id on the wire.
MEMBER_ID_MAX_CHARS = 64
MEMBER_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
# A learner within this many entries of the leader's last index counts as caught up and may be
# promoted: promoting one far behind would make every commit of the new majority wait for it
# (a second of sends at the broker's usual batch rate, so the wait it adds is short).
PROMOTE_MAX_LAG_ENTRIES = 1000
# A member's addresses as the configuration carries them (opaque to the core, "host:port" to
# the server): bounded like any field a peer sends.
MEMBER_ADDR_MAX_CHARS = 255
# Largest CONFIG entry body accepted: the encoding of MAX_GROUP_SIZE voters, MAX_LEARNERS
# learners and MAX_REMOVED_IDS removed ids of MEMBER_ID_MAX_CHARS each fits well below it.
CONF_BODY_MAX_BYTES = 16384
# The CONFIG body's format ("v"): the newest this release writes and reads.
CONF_FORMAT_VERSION = 1
# Largest group feature level a CONFIG body may carry ("features"): levels count releases that
# changed what a group writes, a handful per year; the bound only keeps a peer's number sane.
MAX_FEATURE_LEVEL = 1 << 16


class ConfChangeError(DLedgerError):
    """A membership change that can never be accepted as asked (a member added twice, a
    non-member removed, too few voters left, a reused id ...). Nothing was changed."""

    code = E.INVALID_MEMBERSHIP_CHANGE


class ConfChangePendingError(DLedgerError):
    """A membership change cannot be accepted *now*: another one is not committed yet, this
    leader has not committed an entry of its term yet, or a learner is still catching up.
    Retry later. Nothing was changed."""

    code = E.MEMBERSHIP_CHANGE_PENDING


class ChangeKind(enum.Enum):
    ADD_LEARNER = "add_learner"  # a non-voting member that receives the log
    ADD_VOTER = "add_voter"  # a voting member straight away
    PROMOTE = "promote"  # a learner becomes a voter
    REMOVE = "remove"  # a voter or a learner leaves


@dataclass(frozen=True, slots=True)
class MemberAddr:
    """Where a member is reached: its peer (Raft) and client addresses. The core only stores
    them (and refuses a second member at the same peer address); the server dials them."""

    node_id: str
    peer_addr: str
    client_addr: str = ""

    def pair(self) -> tuple[str, str]:
        return self.peer_addr, self.client_addr


@dataclass(frozen=True, slots=True)
class ConfChange:
    kind: ChangeKind
    node_id: str
    # For an addition: where the new member is reached ("" for the peer address: the driver
    # knows it otherwise, e.g. from its settings).
    peer_addr: str = ""
    client_addr: str = ""


@dataclass(frozen=True, slots=True)
class ConfState:
    """One configuration of the group: a frozen value a snapshot can carry.

    ``index`` is the log index of the CONFIG entry that set it (0: the bootstrap
    configuration from the node's settings). ``removed`` lists removed ids, oldest first.
    ``addrs`` holds the addresses of members added at run time (sorted by id); the bootstrap
    members' come from the settings.
    """

    voters: frozenset[str]
    learners: frozenset[str] = frozenset()
    removed: tuple[str, ...] = ()
    index: int = 0
    addrs: tuple[MemberAddr, ...] = ()
    # The group's feature level (docs/RAFT.md "Feature level"): raised by a CONFIG entry with
    # the same members, never lowered; BASELINE_LEVEL for a group that never raised one.
    features: int = BASELINE_LEVEL

    def addr_of(self, node_id: str) -> MemberAddr | None:
        return next((a for a in self.addrs if a.node_id == node_id), None)

    @property
    def members(self) -> frozenset[str]:
        return self.voters | self.learners

    def quorum(self) -> int:
        """Votes (or stable copies) that make a majority of the voters."""
        return len(self.voters) // 2 + 1

    def apply(
        self,
        change: ConfChange,
        index: int,
        member_addrs: Mapping[str, tuple[str, str]] | None = None,
    ) -> ConfState:
        """The configuration after ``change`` (already checked), set by the entry at ``index``.
        ``member_addrs`` (id -> (peer, client), the driver's address book) completes the
        addresses of members the configuration has none for, so that every node that learns
        it can reach every member (a node that joined knows only its own settings)."""
        voters, learners, removed = set(self.voters), set(self.learners), list(self.removed)
        addrs = {a.node_id: a for a in self.addrs}
        for nid, (peer, client) in (member_addrs or {}).items():
            if nid in self.members and nid not in addrs and peer:
                addrs[nid] = MemberAddr(nid, peer, client)
        nid = change.node_id
        if change.kind in (ChangeKind.ADD_LEARNER, ChangeKind.ADD_VOTER):
            (learners if change.kind is ChangeKind.ADD_LEARNER else voters).add(nid)
            if change.peer_addr:
                addrs[nid] = MemberAddr(nid, change.peer_addr, change.client_addr)
        elif change.kind is ChangeKind.PROMOTE:
            learners.discard(nid)
            voters.add(nid)
        else:
            voters.discard(nid)
            learners.discard(nid)
            addrs.pop(nid, None)
            removed = [*removed, nid][-MAX_REMOVED_IDS:]
        return ConfState(
            frozenset(voters),
            frozenset(learners),
            tuple(removed),
            index,
            tuple(addrs[k] for k in sorted(addrs)),
            self.features,
        )

    def raised(self, level: int, index: int) -> ConfState:
        """The same members at feature level ``level``, set by the CONFIG entry at ``index``."""
        assert level > self.features, (level, self.features)
        return dataclasses.replace(self, index=index, features=level)

    def encode(self) -> bytes:
        """The body of a CONFIG entry (``index`` is the entry's, so it is not encoded). The
        ``features`` key is left out at the baseline level, so a group that never raised its
        level writes the very bytes raftmq 0.2.0 writes (and 0.2.0 ignores the key)."""
        doc: dict[str, object] = {
            "v": CONF_FORMAT_VERSION,
            "voters": sorted(self.voters),
            "learners": sorted(self.learners),
            "removed": list(self.removed),
            "addrs": [[a.node_id, a.peer_addr, a.client_addr] for a in self.addrs],
        }
        if self.features != BASELINE_LEVEL:
            doc["features"] = self.features
        return json.dumps(doc, separators=(",", ":")).encode()

    def describe(self) -> str:
        learners = f" learners={','.join(sorted(self.learners))}" if self.learners else ""
        return f"voters={','.join(sorted(self.voters))}{learners}"


def bootstrap(node_id: str, peer_ids: Iterable[str]) -> ConfState:
    """The configuration from a node's settings: every listed id (and itself) a voter."""
    return ConfState(voters=frozenset([node_id, *peer_ids]))


def joining(node_id: str) -> ConfState:
    """The configuration of a node started empty to join an existing group: it only knows
    itself, as a learner (it never campaigns), until the log brings the group's."""
    return ConfState(voters=frozenset(), learners=frozenset([node_id]))


def _ids(doc: Mapping[str, object], key: str, limit: int) -> list[str]:
    raw = doc.get(key)
    if not isinstance(raw, list) or len(raw) > limit:
        raise ValueError(f"{key}: a list of at most {limit} ids")
    for x in raw:
        if not isinstance(x, str) or not MEMBER_ID_RE.fullmatch(x):
            raise ValueError(f"{key}: bad member id")
    if len(set(raw)) != len(raw):
        raise ValueError(f"{key}: duplicate ids")
    return raw


def decode(body: bytes, index: int) -> ConfState:
    """The configuration a CONFIG entry at ``index`` sets; ValueError for a malformed body."""
    if len(body) > CONF_BODY_MAX_BYTES:
        raise ValueError(f"configuration body of {len(body)} bytes > {CONF_BODY_MAX_BYTES}")
    try:
        doc = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"configuration body is not JSON: {exc}") from exc
    if not isinstance(doc, dict) or doc.get("v") != CONF_FORMAT_VERSION:
        raise ValueError("configuration body: unknown format")
    voters = _ids(doc, "voters", MAX_GROUP_SIZE)
    learners = _ids(doc, "learners", MAX_LEARNERS)
    removed = _ids(doc, "removed", MAX_REMOVED_IDS)
    if not voters:
        raise ValueError("configuration body: no voter")
    if set(voters) & set(learners) or set(removed) & (set(voters) | set(learners)):
        raise ValueError("configuration body: an id in two roles")
    addrs = _addrs(doc, set(voters) | set(learners))
    features = doc.get("features", BASELINE_LEVEL)
    if (
        not isinstance(features, int)
        or isinstance(features, bool)
        or not BASELINE_LEVEL <= features <= MAX_FEATURE_LEVEL
    ):
        raise ValueError(
            f"configuration body: features must be an integer in [{BASELINE_LEVEL}, "
            f"{MAX_FEATURE_LEVEL}]"
        )
    return ConfState(frozenset(voters), frozenset(learners), tuple(removed), index, addrs, features)


def _addrs(doc: Mapping[str, object], members: set[str]) -> tuple[MemberAddr, ...]:
    raw = doc.get("addrs", [])
    if not isinstance(raw, list) or len(raw) > len(members):
        raise ValueError("addrs: a list of at most one address per member")
    out: dict[str, MemberAddr] = {}
    for item in raw:
        if (
            not isinstance(item, list)
            or len(item) != 3
            or not all(isinstance(x, str) and len(x) <= MEMBER_ADDR_MAX_CHARS for x in item)
            or item[0] not in members
            or not item[1]
            or item[0] in out
        ):
            raise ValueError("addrs: [member id, peer address, client address] per member")
        out[item[0]] = MemberAddr(item[0], item[1], item[2])
    return tuple(out[k] for k in sorted(out))


def _check_addrs(change: ConfChange, in_use: Mapping[str, str]) -> None:
    for what, addr in (("peer", change.peer_addr), ("client", change.client_addr)):
        if len(addr) > MEMBER_ADDR_MAX_CHARS or any(c.isspace() for c in addr):
            raise ConfChangeError(
                f"{what} address {addr!r:.80} must be at most {MEMBER_ADDR_MAX_CHARS} "
                "characters without spaces"
            )
    for addr in (change.peer_addr, change.client_addr):
        owner = in_use.get(addr) if addr else None
        if owner is not None and owner != change.node_id:
            raise ConfChangeError(f"address {addr} is already in use by member {owner}")


def addresses_in_use(conf: ConfState, known: Mapping[str, tuple[str, str]]) -> dict[str, str]:
    """Every address a member of ``conf`` uses -> its id: ``known`` (id -> (peer, client),
    the driver's view of the bootstrap members) completed by ``conf.addrs``."""
    out: dict[str, str] = {}
    for nid in sorted(conf.members):
        a = conf.addr_of(nid)
        peer, client = (a.peer_addr, a.client_addr) if a is not None else known.get(nid, ("", ""))
        for addr in (peer, client):
            if addr:
                out[addr] = nid
    return out


def check_change(
    conf: ConfState,
    change: ConfChange,
    active: frozenset[str],
    in_use: Mapping[str, str] | None = None,
) -> None:
    """Raise ConfChangeError unless ``change`` may follow ``conf``. ``active`` holds the
    members that answered the leader recently (the leader included): the new configuration's
    majority must be among them, or the change would leave the group unable to commit.
    ``in_use`` maps the addresses members use to their ids (a new member may not take one)."""
    in_use = in_use if in_use is not None else addresses_in_use(conf, {})
    nid, kind = change.node_id, change.kind
    if not isinstance(nid, str) or not MEMBER_ID_RE.fullmatch(nid):
        raise ConfChangeError(
            f"member id {nid!r:.80} must be 1-{MEMBER_ID_MAX_CHARS} characters of "
            "letters, digits, '.', '_' and '-', starting with a letter or digit"
        )
    if kind in (ChangeKind.ADD_LEARNER, ChangeKind.ADD_VOTER):
        if nid in conf.members:
            role = "voter" if nid in conf.voters else "learner"
            raise ConfChangeError(f"{nid} is already a {role} of the group")
        if nid in conf.removed:
            raise ConfChangeError(f"{nid} was removed from the group; a new member needs a new id")
        _check_addrs(change, in_use)
    elif kind is ChangeKind.PROMOTE and nid not in conf.learners:
        what = "already a voter" if nid in conf.voters else "not a learner of the group"
        raise ConfChangeError(f"{nid} is {what}")
    elif kind is ChangeKind.REMOVE and nid not in conf.members:
        raise ConfChangeError(f"{nid} is not a member of the group")
    new = conf.apply(change, conf.index)
    if len(new.voters) > MAX_GROUP_SIZE:
        raise ConfChangeError(f"a group has at most {MAX_GROUP_SIZE} voters")
    if len(new.learners) > MAX_LEARNERS:
        raise ConfChangeError(f"a group has at most {MAX_LEARNERS} learners at once")
    if not new.voters:
        raise ConfChangeError(f"removing {nid} would leave the group without a voter")
    alive = len(new.voters & active)
    if alive < new.quorum():
        raise ConfChangeError(
            f"after this change {new.quorum()} of {len(new.voters)} voters must be up to "
            f"commit, but only {alive} answered recently ({','.join(sorted(new.voters & active))}):"
            " the group would stop; bring members back first"
        )


class Membership:
    """A member's configurations: the one at a base index (committed and applied, or from a
    snapshot) and those of the CONFIG entries above it in its log, in index order."""

    __slots__ = ("_base", "_history")

    def __init__(self, base: ConfState) -> None:
        self._base = base
        self._history: list[ConfState] = []

    @property
    def base_index(self) -> int:
        """Index of the base configuration's CONFIG entry (committed, applied or a snapshot's)."""
        return self._base.index

    def latest(self) -> ConfState:
        """The configuration in force: the last one in the log."""
        return self._history[-1] if self._history else self._base

    def at(self, index: int) -> ConfState:
        """The configuration in force at ``index`` (at or above the base)."""
        for conf in reversed(self._history):
            if conf.index <= index:
                return conf
        return self._base

    def pending_index(self, commit_index: int) -> int:
        """Index of the last CONFIG entry above ``commit_index``; 0 when none is pending."""
        last = self._history[-1].index if self._history else 0
        return last if last > commit_index else 0

    def append(self, conf: ConfState) -> None:
        if conf.index <= self._base.index:
            # Already in the base: a snapshot's or a restart's configuration was taken from
            # a later committed CONFIG entry (the leader's applied index may lag behind the
            # configuration it saved), so the log still brings the entries it folded in.
            return
        assert conf.index > self.latest().index, "configurations out of order"
        assert conf.features >= self.latest().features, "the feature level went down"
        self._history.append(conf)

    def truncate(self, from_index: int) -> bool:
        """The log lost every entry from ``from_index`` on; True when the latest changed."""
        before = self.latest()
        while self._history and self._history[-1].index >= from_index:
            self._history.pop()
        return self.latest() is not before

    def compact(self, upto: int) -> None:
        """Entries up to ``upto`` are applied: fold their configurations into the base."""
        while self._history and self._history[0].index <= upto:
            self._base = self._history.pop(0)

    def restore(self, conf: ConfState) -> None:
        """Replace everything with ``conf`` (a snapshot installed at ``conf``'s index or above)."""
        self._base = conf
        self._history = []
