"""The broker's contract with its Raft member (``broker/components/raftnode.py``), kept: no broker
module but the composition root names ``DLedgerNode``, every read of a node in ``broker/`` is a
member of ``RaftNode``, and ``DLedgerNode`` has every member (mypy checks the types where
``broker/app.py`` hands the node over)."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

from broker.components.raftnode import LogStore, RaftNode
from dledger.server.node import DLedgerNode
from dledger.storage import SegmentedLogStore

ROOT = Path(__file__).resolve().parents[2]
BROKER = ROOT / "broker"
# The one module that builds the node and may name its class (and read past the contract:
# the disk guard's allocation figure, the Raft metrics of the concrete node).
COMPOSITION_ROOT = "broker/app.py"
# Names a node goes by in broker code: ``node``, ``self.node``, ``ctx.node``, ``self._node``.
NODE_NAMES = frozenset({"node", "_node"})


def _members(protocol: type) -> set[str]:
    """The public members a Protocol class declares (methods and properties)."""
    return {name for name in vars(protocol) if not name.startswith("_")}


def _modules() -> list[tuple[str, ast.Module]]:
    return [
        (path.relative_to(ROOT).as_posix(), ast.parse(path.read_text(), str(path)))
        for path in sorted(BROKER.rglob("*.py"))
    ]


def _is_node(expr: ast.expr) -> bool:
    return (isinstance(expr, ast.Name) and expr.id in NODE_NAMES) or (
        isinstance(expr, ast.Attribute) and expr.attr in NODE_NAMES
    )


def _node_reads(tree: ast.Module) -> list[tuple[int, str]]:
    """(line, member) of every ``<node>.member`` and ``getattr(<node>, "member", ...)``."""
    out = []
    for n in ast.walk(tree):
        if isinstance(n, ast.Attribute) and _is_node(n.value):
            out.append((n.lineno, n.attr))
        elif (
            isinstance(n, ast.Call)
            and isinstance(n.func, ast.Name)
            and n.func.id in ("getattr", "hasattr", "setattr")
            and len(n.args) >= 2
            and _is_node(n.args[0])
            and isinstance(n.args[1], ast.Constant)
        ):
            out.append((n.lineno, str(n.args[1].value)))
    return out


def test_no_broker_module_but_the_composition_root_names_the_node_class() -> None:
    offenders = []
    for rel, tree in _modules():
        if rel == COMPOSITION_ROOT:
            continue
        for n in ast.walk(tree):
            named = (
                (isinstance(n, ast.ImportFrom) and any(a.name == "DLedgerNode" for a in n.names))
                or (
                    isinstance(n, ast.Import)
                    and any(a.name == "dledger.server.node" for a in n.names)
                )
                or (isinstance(n, ast.Name) and n.id == "DLedgerNode")
                or (isinstance(n, ast.Attribute) and n.attr == "DLedgerNode")
            )
            if named:
                offenders.append(f"{rel}:{n.lineno}")
    assert offenders == [], (
        f"use broker.components.raftnode.RaftNode instead of DLedgerNode: {offenders}"
    )


def test_the_composition_root_builds_the_node() -> None:
    """The rule above has its one exception where the node is built (not a stale name)."""
    tree = dict(_modules())[COMPOSITION_ROOT]
    calls = [
        n
        for n in ast.walk(tree)
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "DLedgerNode"
    ]
    assert len(calls) == 1


def test_broker_code_reads_only_the_members_of_the_contract() -> None:
    allowed = _members(RaftNode)
    offenders = [
        f"{rel}:{line} node.{member}"
        for rel, tree in _modules()
        if rel != COMPOSITION_ROOT
        for line, member in _node_reads(tree)
        if member not in allowed
    ]
    assert offenders == [], (
        "broker code reads a node member RaftNode does not declare (add it to "
        f"broker/components/raftnode.py, documented, or use one it has): {offenders}"
    )


def test_the_scan_sees_node_reads() -> None:
    """The scan above is not vacuous: it finds reads in every spelling the broker uses."""
    tree = ast.parse(
        "node.core.role\nself.node.cfg\nself.ctx.node.propose\nself._node.store\n"
        "getattr(self.node, 'raft_stats', None)\n"
    )
    assert sorted(m for _, m in _node_reads(tree)) == [
        "cfg",
        "core",
        "propose",
        "raft_stats",
        "store",
    ]


def test_the_dledger_node_and_its_store_have_every_member() -> None:
    """mypy checks the types at ``broker/app.py``; this names a missing member plainly.
    ``store`` and ``removed_listeners`` are instance attributes set by the node itself."""
    attributes = {"store", "removed_listeners"}
    missing = sorted(m for m in _members(RaftNode) - attributes if not hasattr(DLedgerNode, m))
    assert missing == []
    assert "removed_listeners" in inspect.getsource(DLedgerNode.__init__)
    assert "self.store = " in inspect.getsource(DLedgerNode)
    assert sorted(m for m in _members(LogStore) if not hasattr(SegmentedLogStore, m)) == []


def test_every_member_is_documented() -> None:
    undocumented = [
        f"{protocol.__name__}.{name}"
        for protocol in (RaftNode, LogStore)
        for name in sorted(_members(protocol))
        if not inspect.getdoc(
            vars(protocol)[name].fget
            if isinstance(vars(protocol)[name], property)
            else vars(protocol)[name]
        )
    ]
    assert undocumented == []
