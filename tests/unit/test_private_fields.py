"""No module of dledger writes another object's private fields (issue #33 item 7): a class's
underscored attributes are assigned, augmented or deleted only through ``self`` (or ``cls``)
in its own methods. A module that decides for another class returns the decision or calls a
method (as dledger.core.snapshot does for RaftNode)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("dledger",)
OWN = frozenset({"self", "cls"})


def _targets(node: ast.AST) -> list[ast.expr]:
    if isinstance(node, ast.Assign):
        return list(node.targets)
    if isinstance(node, ast.AugAssign | ast.AnnAssign):
        return [node.target]
    if isinstance(node, ast.Delete):
        return list(node.targets)
    return []


def _flatten(target: ast.expr) -> list[ast.expr]:
    if isinstance(target, ast.Tuple | ast.List):
        return [t for e in target.elts for t in _flatten(e)]
    if isinstance(target, ast.Subscript):
        return _flatten(target.value)  # x._d[k] = v writes x._d
    return [target]


def foreign_private_writes(source: str, filename: str) -> list[str]:
    """``file:line object._field`` for each write of an underscored (non-dunder) attribute
    of anything other than ``self``/``cls``."""
    found = []
    for node in ast.walk(ast.parse(source, filename)):
        for target in _targets(node):
            for t in _flatten(target):
                if not isinstance(t, ast.Attribute):
                    continue
                name = t.attr
                if not name.startswith("_") or name.startswith("__"):
                    continue
                if isinstance(t.value, ast.Name) and t.value.id in OWN:
                    continue
                found.append(f"{filename}:{node.lineno} {ast.unparse(t)}")
    return found


def test_no_module_writes_another_objects_private_fields() -> None:
    bad = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            rel = str(path.relative_to(ROOT))
            bad += foreign_private_writes(path.read_text(encoding="utf-8"), rel)
    assert not bad, "private fields written from outside their object:\n" + "\n".join(bad)


def test_the_check_sees_each_kind_of_write() -> None:
    source = (
        "node._commit = 1\n"
        "node._n += 1\n"
        "node._log.store = s\n"  # a public field of a private one: allowed
        "a, node._b = 1, 2\n"
        "node._d['k'] = 1\n"
        "del node._e\n"
        "self._mine = 1\n"
        "node.public = 1\n"
        "node.__dict__ = {}\n"
    )
    got = [f.split(" ", 1)[1] for f in foreign_private_writes(source, "x.py")]
    assert got == ["node._commit", "node._n", "node._b", "node._d", "node._e"]
