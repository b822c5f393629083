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
import os
from collections.abc import Mapping
from pathlib import Path

from dledger.core import ConfState
from dledger.core.membership import decode, joining
from dledger.log import ConfigError

logger = logging.getLogger(__name__)

CONF_FILE = "membership.json"
# How often a node started to join asks the group to add it, until the group answers.
JOIN_RETRY_MS = 1000
# The largest membership.json read (a configuration is a few KiB at most).
CONF_FILE_MAX_BYTES = 64 << 10


def load_conf(store_dir: str, node_id: str) -> ConfState | None:
    """The configuration saved in ``store_dir`` (None: none saved yet)."""
    path = Path(store_dir) / CONF_FILE
    try:
        raw = path.read_bytes()[: CONF_FILE_MAX_BYTES + 1]
    except FileNotFoundError:
        return None
    try:
        if len(raw) > CONF_FILE_MAX_BYTES:
            raise ValueError(f"larger than {CONF_FILE_MAX_BYTES} bytes")
        doc = json.loads(raw)
        if doc.get("joining") is True:
            return joining(node_id)
        index = doc["index"]
        if not isinstance(index, int) or index < 0:
            raise ValueError("index is not an index")
        return decode(json.dumps(doc["config"]).encode(), index)
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ConfigError(f"{path}: not a membership file: {exc}") from exc


def save_conf(store_dir: str, conf: ConfState, *, is_joining: bool = False) -> None:
    """Save atomically and durably (temp file, fsync, rename, fsync of the directory)."""
    doc: dict[str, object]
    if is_joining:
        doc = {"joining": True}
    else:
        doc = {"index": conf.index, "config": json.loads(conf.encode())}
    root = Path(store_dir)
    tmp = root / (CONF_FILE + ".tmp")
    with open(tmp, "wb") as f:
        f.write(json.dumps(doc, separators=(",", ":")).encode())
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, root / CONF_FILE)
    fd = os.open(root, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


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
