"""The server's side of membership changes: where a node keeps its configuration between
restarts, the address book of the members, and the joining of a node started empty.

The core keeps the configuration in the log (``dledger.core.membership``). The node saves the
committed configuration in ``membership.json`` in its store directory whenever it applies a
CONFIG entry (before it applies anything after it), so that a restart replays only the CONFIG
entries above its applied index. ``dLegerPeers`` is the *bootstrap* configuration: once the
group changed, the committed configuration wins, and ``dLegerPeers`` only still gives the
addresses of the members it lists (the others' travel in the configuration).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from pathlib import Path

from dledger.core import ConfState
from dledger.core.membership import CONF_FORMAT_VERSION, ChangeKind, decode, joining
from dledger.log import ConfigError, DLedgerError, FeatureLevelError, FormatTooNewError
from dledger.storage.files import atomic_write
from mqerrors import codes as E
from mqrelease import BASELINE_LEVEL, too_new_message

logger = logging.getLogger(__name__)

CONF_FILE = "membership.json"
# How often a node started to join asks the group to add it, until the group answers.
JOIN_RETRY_MS = 1000
# The largest membership.json read (a configuration is a few KiB at most).
CONF_FILE_MAX_BYTES = 64 << 10
# membership.json's own format ("v"; a file without it, written before it existed, is 1). A
# file or a CONFIG body of a newer format is refused (FormatTooNewError), never read as a
# malformed file: docs/FORMAT.md "Membership file".
CONF_FILE_VERSION = 1
# Log indexes are int64 in the core: a saved index above it is damage.
MAX_CONF_INDEX = (1 << 63) - 1
# The shared settings a Join carries (JoinRequest.shared_settings): a handful of store and
# apply settings today; the bounds only keep a hostile request's refusal short.
MAX_SHARED_SETTINGS = 32
MAX_SETTING_NAME_CHARS = 64
MAX_SETTING_VALUE_CHARS = 64
# Differences a refusal names at most (the detail stays one short line).
MAX_MISMATCHES_NAMED = 4
# Nodes whose refused Join the leader remembers (a few misconfigured nodes at a time).
MAX_REFUSED_JOINS = 16


class IncompatibleStoreError(DLedgerError):
    """A node asked to join with settings that differ from the group's where every member
    must agree (the log's segment size, what the application's apply assumes): it could never
    catch up, so it is not added. Nothing was changed."""

    code = E.INCOMPATIBLE_STORE


def _shown(text: str, limit: int) -> str:
    return repr(text if len(text) <= limit else text[:limit] + "...")


def check_shared_settings(
    group: str, mine: Mapping[str, str], theirs: Mapping[str, str], node_id: str
) -> None:
    """Refuse (:class:`IncompatibleStoreError`) a joiner whose ``theirs`` differ from this
    group's ``mine``: a setting missing on either side differs too (a node of another
    version). The message names each differing setting with both values."""
    if len(theirs) > MAX_SHARED_SETTINGS:
        raise IncompatibleStoreError(
            f"{node_id} sent {len(theirs)} shared settings, at most {MAX_SHARED_SETTINGS}"
        )
    diffs = []
    for name in sorted(set(mine) | set(theirs)):
        want, got = mine.get(name), theirs.get(name)
        if want == got:
            continue
        diffs.append(
            f"{_shown(name, MAX_SETTING_NAME_CHARS)} is "
            f"{'unset' if got is None else _shown(got, MAX_SETTING_VALUE_CHARS)} on {node_id}, "
            f"{'unset' if want is None else _shown(want, MAX_SETTING_VALUE_CHARS)} in the group"
        )
    if diffs:
        more = len(diffs) - MAX_MISMATCHES_NAMED
        raise IncompatibleStoreError(
            f"{node_id} cannot join group {group}: "
            + "; ".join(diffs[:MAX_MISMATCHES_NAMED])
            + (f"; and {more} more" if more > 0 else "")
            + " (every member needs the same value: set it and start the node with an"
            " empty store)"
        )


def check_joiner_level(group: str, node_id: str, supported: int, level: int) -> None:
    """FeatureLevelError unless a joiner that reports ``supported`` (0: a release before
    feature levels, read as the baseline) supports the group's feature level ``level``: the
    leader would send it nothing, and it could never catch up (docs/RAFT.md section 14)."""
    supported = max(supported, BASELINE_LEVEL)
    if supported < level:
        raise FeatureLevelError(
            f"node {_shown(node_id, 80)} supports feature levels up to {supported}, but group "
            f"{group} is at level {level}: start it with a release that supports the group's "
            "level"
        )


class DamagedConfFileError(ConfigError):
    """``membership.json`` is there but not a membership file this release wrote (it does
    not parse, a field is out of bounds or of the wrong type, the configuration fails
    validation, or it contradicts the log): damage, repaired at start from what else knows
    the configuration (dledger.server.confrepair)."""


def load_conf(store_dir: str, node_id: str) -> ConfState | None:
    """The configuration saved in ``store_dir`` (None: none saved yet). FormatTooNewError
    for a file of a newer release; DamagedConfFileError for any other bad file."""
    path = Path(store_dir) / CONF_FILE
    try:
        raw = path.read_bytes()[: CONF_FILE_MAX_BYTES + 1]
    except FileNotFoundError:
        return None
    try:
        if len(raw) > CONF_FILE_MAX_BYTES:
            raise ValueError(f"larger than {CONF_FILE_MAX_BYTES} bytes")
        doc = json.loads(raw)
        _refuse_newer(path, doc)
        return _conf_of(doc, node_id)
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise DamagedConfFileError(f"{path}: not a membership file: {exc}") from exc


def _conf_of(doc: object, node_id: str) -> ConfState:
    """The configuration a parsed file holds; ValueError (or KeyError, TypeError) for
    anything but what :func:`save_conf` writes."""
    if not isinstance(doc, dict):
        raise ValueError("not a JSON object")
    version = doc.get("v", 1)
    if type(version) is not int or version != CONF_FILE_VERSION:
        raise ValueError(f"format version {version!r} is not {CONF_FILE_VERSION}")
    if "joining" in doc:
        if doc["joining"] is not True or set(doc) - {"v", "joining"}:
            raise ValueError('"joining" must be true and alone')
        return joining(node_id)
    index = doc["index"]
    if type(index) is not int or not 0 <= index <= MAX_CONF_INDEX:
        raise ValueError("index is not an index")
    if not isinstance(doc["config"], dict):
        raise ValueError("config is not an object")
    return decode(json.dumps(doc["config"]).encode(), index)


def _refuse_newer(path: Path, doc: object) -> None:
    """FormatTooNewError when the file (``doc``, parsed from ``path``) or the CONFIG body it
    holds says a format version above this release's. Anything else malformed is left to the
    reader (ConfigError)."""
    if not isinstance(doc, dict):
        return
    body = doc.get("config")
    for what, version, newest in (
        ("membership file", doc.get("v"), CONF_FILE_VERSION),
        (
            "membership configuration in",
            body.get("v") if isinstance(body, dict) else None,
            CONF_FORMAT_VERSION,
        ),
    ):
        if isinstance(version, int) and version > newest:
            message = too_new_message(what, path, version, newest)
            raise FormatTooNewError(message, path=str(path), found=version, newest=newest)


def save_conf(store_dir: str, conf: ConfState, *, is_joining: bool = False) -> None:
    """Save atomically and durably (the storage package's ``atomic_write``: temp file written
    whole, fsync, rename, fsync of the directory)."""
    doc: dict[str, object]
    if is_joining:
        doc = {"v": CONF_FILE_VERSION, "joining": True}
    else:
        doc = {"v": CONF_FILE_VERSION, "index": conf.index, "config": json.loads(conf.encode())}
    atomic_write(Path(store_dir) / CONF_FILE, json.dumps(doc, separators=(",", ":")).encode())


class AddressBook:
    """Peer and client addresses of the members: the settings' (``dLegerPeers``,
    ``dLegerPeerClientAddrs``: this node's own view, which may go through a proxy or a NAT)
    completed by those the configuration carries, then by what a joining node was told."""

    def __init__(self, peers: Mapping[str, str], client_addrs: Mapping[str, str]) -> None:
        self._settings = {p: (a, client_addrs.get(p, "")) for p, a in peers.items()}
        self._conf: dict[str, tuple[str, str]] = {}
        # What a node joining a group was told by it (ListMembers) before its log has any.
        self._learned: dict[str, tuple[str, str]] = {}

    def update(self, conf: ConfState) -> None:
        self._conf = {a.node_id: (a.peer_addr, a.client_addr) for a in conf.addrs}

    def learn(self, node_id: str, peer_addr: str, client_addr: str) -> None:
        self._learned[node_id] = (peer_addr, client_addr)

    def _get(self, node_id: str) -> tuple[str, str]:
        return (
            self._settings.get(node_id)
            or self._conf.get(node_id)
            or self._learned.get(node_id, ("", ""))
        )

    def known(self, members: frozenset[str]) -> dict[str, tuple[str, str]]:
        """The addresses of ``members`` this book knows (id -> (peer, client))."""
        return {m: self._get(m) for m in sorted(members) if self._get(m)[0]}

    def peer_addr(self, node_id: str) -> str:
        return self._get(node_id)[0]

    def client_addr(self, node_id: str) -> str:
        return self._get(node_id)[1]

    def in_use(self, conf: ConfState) -> dict[str, str]:
        """Addresses the members of ``conf`` use -> their ids (a new member may take none)."""
        out: dict[str, str] = {}
        for nid in sorted(conf.members):
            a = conf.addr_of(nid)
            views = [self._settings.get(nid, ("", "")), ("", "") if a is None else a.pair()]
            for addr in (x for view in views for x in view):
                if addr:
                    out.setdefault(addr, nid)
        return out


class RefusedJoins:
    """The leader's memory of the nodes whose Join it refused for their settings: an
    operator's ``mqadmin addMember`` or ``promoteMember`` of such a node gets the same
    refusal instead of adding a member that never catches up. Kept in memory (a new leader
    learns again at the node's next Join), at most :data:`MAX_REFUSED_JOINS`, oldest first
    out; a node's accepted Join forgets it."""

    def __init__(self) -> None:
        self._by_id: dict[str, str] = {}  # node id -> the refusal's text

    def check(
        self, group: str, mine: Mapping[str, str], theirs: Mapping[str, str], node_id: str
    ) -> None:
        """:func:`check_shared_settings`, remembering the outcome for ``node_id``."""
        try:
            check_shared_settings(group, mine, theirs, node_id)
        except IncompatibleStoreError as exc:
            self._by_id.pop(node_id, None)
            if len(self._by_id) >= MAX_REFUSED_JOINS:
                del self._by_id[next(iter(self._by_id))]
            self._by_id[node_id] = str(exc)
            raise
        self._by_id.pop(node_id, None)

    def check_change(self, kind: ChangeKind, node_id: str) -> None:
        """Refuse adding or promoting a node whose Join was refused (removing it is fine)."""
        refused = self._by_id.get(node_id)
        if refused is not None and kind is not ChangeKind.REMOVE:
            raise IncompatibleStoreError(refused)
