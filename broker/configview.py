"""A node's broker.conf as it runs, for ``GetBrokerConfig`` (mqadmin getBrokerConfig): every
key with its effective value (the defaults filled in) spelled as broker.conf takes it.
Credentials never leave the node: a key that holds one shows ``(set)`` or nothing."""

from __future__ import annotations

import dataclasses
import enum

from broker.components.raftnode import RaftNode
from broker.config import BrokerConfig
from broker.configkeys import Peer
from mqrelease import RELEASE
from mqsecurity.credentials import Credentials

# What a credentials key shows when it is set (the secret itself is never shown).
SECRET_SET = "(set)"
# BrokerConfig fields that are not broker.conf keys.
_NOT_KEYS = frozenset({"path", "ignored_keys", "notes", "file_keys"})


def _text(value: object) -> str:
    if isinstance(value, Credentials):
        return SECRET_SET
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, enum.Enum):
        return str(value.value)
    if isinstance(value, tuple) and all(isinstance(p, Peer) for p in value):
        return ";".join(f"{p.node_id}-{p.addr}" for p in value)
    assert isinstance(value, str | int | float), f"no broker.conf spelling for {value!r}"
    return str(value)


def config_view(cfg: BrokerConfig) -> dict[str, str]:
    """Every broker.conf key of ``cfg`` and its value as text, sorted by key."""
    fields = [f.name for f in dataclasses.fields(cfg) if f.name not in _NOT_KEYS]
    return {name: _text(getattr(cfg, name)) for name in sorted(fields)}


def runtime_info(node: RaftNode, boot_ms: int, now_ms: int) -> dict[str, str]:
    """The node's runtime figures as brokerStatus prints them (RocketMQ's key names where
    RocketMQ has the figure): release, boot time and uptime, Raft role, term and leader, the
    extent of its log (entries and commitlog bytes)."""
    assert now_ms >= boot_ms, (now_ms, boot_ms)
    return {
        "brokerVersionDesc": f"raftmq {RELEASE}",
        "bootTimestamp": str(boot_ms),
        "runtimeMs": str(now_ms - boot_ms),
        "raftRole": node.role.name,
        "raftTerm": str(node.term),
        "raftLeaderId": node.leader_id or "",
        "raftFirstIndex": str(node.store.first_index()),
        "raftLastIndex": str(node.last_index),
        "commitLogMaxOffset": str(node.store.write_position),
    }
