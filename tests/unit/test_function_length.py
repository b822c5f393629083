"""Issue #17's structure rule, enforced: no function over 70 lines in ``dledger/core`` or
``broker/``, data tables excepted. A function grows a line at a time; this scan fails on the
commit that crosses the line, naming the function, instead of waiting for the next audit."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MAX_LINES = 70
SCANNED = ("dledger/core", "broker")

# Functions allowed past MAX_LINES, as "path:qualified.name". DATA TABLES ONLY: a function
# whose body is one literal table (a dict or tuple of rows, a match of constants) reads best
# whole. Logic is never listed here: split it into named steps instead. Each entry says which
# table it is. Empty today.
ALLOWED: dict[str, str] = {}


def _functions(tree: ast.AST, prefix: str = "") -> list[tuple[str, ast.AST]]:
    """(qualified name, node) of every function and method, nested ones included."""
    out: list[tuple[str, ast.AST]] = []
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            name = f"{prefix}{node.name}"
            out.append((name, node))
            out.extend(_functions(node, f"{name}."))
        elif isinstance(node, ast.ClassDef):
            out.extend(_functions(node, f"{prefix}{node.name}."))
        else:
            out.extend(_functions(node, prefix))
    return out


def too_long(base: Path, roots: tuple[str, ...] = SCANNED) -> list[str]:
    """``path:Qualified.name (N lines)`` for every function over MAX_LINES under ``roots``
    (decorators not counted, the docstring counted), except ALLOWED."""
    found = []
    for root in roots:
        for path in sorted((base / root).rglob("*.py")):
            rel = path.relative_to(base).as_posix()
            for name, node in _functions(ast.parse(path.read_text(), str(path))):
                assert isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
                assert node.end_lineno is not None
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_LINES and f"{rel}:{name}" not in ALLOWED:
                    found.append(f"{rel}:{name} ({lines} lines)")
    return found


def test_no_function_over_the_limit_in_the_core_and_the_broker() -> None:
    offenders = too_long(ROOT)
    assert offenders == [], (
        f"functions over {MAX_LINES} lines (split them into named steps; ALLOWED is for data "
        "tables only):\n  " + "\n  ".join(offenders)
    )


def test_the_allow_list_names_functions_that_exist() -> None:
    """A stale entry would silently allow the next function to take that name."""
    present = set()
    for root in SCANNED:
        for path in sorted((ROOT / root).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            present.update(f"{rel}:{name}" for name, _ in _functions(ast.parse(path.read_text())))
    assert sorted(set(ALLOWED) - present) == []


def test_the_scan_has_teeth(tmp_path: Path) -> None:
    pkg = tmp_path / "broker" / "sub"
    pkg.mkdir(parents=True)
    body = "\n".join(f"        x{i} = {i}" for i in range(MAX_LINES))  # 71 lines with the def
    edge = "\n".join(f"    y{i} = {i}" for i in range(MAX_LINES - 1))  # exactly 70: allowed
    (pkg / "m.py").write_text(
        f"class C:\n    async def long(self):\n{body}\n\n"
        f"def ok():\n{edge}\n\n"
        "def outer():\n    def inner():\n" + "\n".join(f"        z{i} = 0" for i in range(80))
    )
    assert too_long(tmp_path, ("broker",)) == [
        "broker/sub/m.py:C.long (71 lines)",
        "broker/sub/m.py:outer (82 lines)",
        "broker/sub/m.py:outer.inner (81 lines)",
    ]
