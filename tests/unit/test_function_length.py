"""Issue #17's structure rule, enforced: no function over 70 lines in any product package (the
Makefile's ``PACKAGES``; issue #33 item 8 widened it from ``dledger/core`` and ``broker/``),
data tables excepted, and the functions that were longer when it widened pinned at their length
until they are split. A function grows a line at a time; this scan fails on the commit that
crosses the line, naming the function, instead of waiting for the next audit."""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

from source_tree import ROOT, product_packages

MAX_LINES = 70
SCANNED = product_packages()

# Functions allowed past MAX_LINES, as "path:qualified.name". DATA TABLES ONLY: a function
# whose body is one literal table (a dict or tuple of rows, a match of constants) reads best
# whole. Logic is never listed here: split it into named steps instead. Each entry says which
# table it is. Empty today.
ALLOWED: dict[str, str] = {}

# Functions over MAX_LINES when the rule widened to every product package, with their length
# then: a debt list that may only shrink. A listed function may not grow past its pin; once
# split under the limit (or gone) its entry must go, and a shortened one gets its pin lowered
# (test_the_long_functions_are_pinned_at_their_length). Never add an entry: split instead.
LONG_TODAY: dict[str, int] = {
    "bench/audit.py:main": 85,
    "bench/broker.py:main": 87,
    "bench/peers.py:_run_load": 73,
    "bench/store.py:bench_sync_event_loop": 78,
    "dledger/server/metrics.py:raft_families": 90,
    "jepsen_like/__main__.py:_cmd_run": 73,
    "jepsen_like/checker.py:check_order": 83,
    "jepsen_like/report.py:plot": 73,
    "jepsen_like/run.py:run": 111,
    "msgcodec/encode.py:encode_batch_fields": 93,
    "spark_audit/report.py:build_report": 90,
    "spark_audit/report.py:write_summary": 77,
    "spark_audit/scan.py:ReplicaScanner._fast_batch": 83,
    "spark_audit/scan.py:ReplicaScanner._scan": 80,
    "spark_audit/scan.py:_compare": 82,
}


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


@cache
def function_lengths(base: Path, roots: tuple[str, ...]) -> dict[str, int]:
    """``{"path:Qualified.name": lines}`` of every function under ``roots`` (decorators not
    counted, the docstring counted). Scanned once per run: the tests below share it."""
    out = {}
    for root in roots:
        for path in sorted((base / root).rglob("*.py")):
            rel = path.relative_to(base).as_posix()
            for name, node in _functions(ast.parse(path.read_text(), str(path))):
                assert isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
                assert node.end_lineno is not None
                out[f"{rel}:{name}"] = node.end_lineno - node.lineno + 1
    return out


def too_long(base: Path, roots: tuple[str, ...] = SCANNED) -> list[str]:
    """``path:Qualified.name (N lines)`` for every function over MAX_LINES under ``roots``,
    except ALLOWED."""
    return [
        f"{name} ({lines} lines)"
        for name, lines in function_lengths(base, roots).items()
        if lines > MAX_LINES and name not in ALLOWED
    ]


def test_no_function_over_the_limit_in_the_product() -> None:
    offenders = [o for o in too_long(ROOT) if o.rpartition(" (")[0] not in LONG_TODAY]
    assert offenders == [], (
        f"functions over {MAX_LINES} lines (split them into named steps; ALLOWED is for data "
        "tables only):\n  " + "\n  ".join(offenders)
    )


def test_the_long_functions_are_pinned_at_their_length() -> None:
    """LONG_TODAY only shrinks: no pinned function grows, and one split or shortened has its
    entry dropped or its pin lowered."""
    lengths = function_lengths(ROOT, SCANNED)
    changed = {
        name: (pin, lengths.get(name, 0))
        for name, pin in LONG_TODAY.items()
        if lengths.get(name, 0) != pin
    }
    assert changed == {}, (
        "LONG_TODAY (pinned, now): a grown function must be split; a shortened one gets its"
        f" pin lowered, one of {MAX_LINES} lines or fewer (or gone) its entry dropped"
    )


def test_the_allow_list_names_functions_that_exist() -> None:
    """A stale entry would silently allow the next function to take that name."""
    assert sorted(set(ALLOWED) - function_lengths(ROOT, SCANNED).keys()) == []


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
