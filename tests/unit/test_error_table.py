"""The one error table (mqerrors/errors.json, docs/ERRORS.md): every code raised anywhere in a
product package is in it, every code in it is raised somewhere or marked reserved, every code
has a gRPC status and an ``apache.rocketmq.v2.Code`` of the pinned stubs, the servers'
mappings send the status and retryability the table says, and what derives from the table
(mqerrors/codes.py, the docs' table) is current."""

from __future__ import annotations

import ast
import functools
import importlib
import pkgutil
import re
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from broker.frontends.v1.rpcerrors import error_failure
from broker.frontends.v2 import stubs
from broker.frontends.v2.codes import v2_code_name
from broker.state.errors import BrokerError
from client.errors import MQClientError
from dledger.log import CorruptLogError, DLedgerError
from mqerrors import codes as E
from mqerrors import generate
from mqerrors.table import TABLE, Outcome, Retry, TableError, codes, parse
from msgcodec.errors import CodecError
from nameserver.routes import NameServerError
from nameserver.server import failure_of

ROOT = Path(__file__).resolve().parents[2]
# The product packages (Makefile PACKAGES, less mqerrors itself).
PRODUCT = [
    "mqrelease",
    "mqcli",
    "mqsecurity",
    "mqmetrics",
    "prockit",
    "rpckit",
    "dledger",
    "msgcodec",
    "broker",
    "mqcluster",
    "nameserver",
    "client",
    "jepsen_like",
    "spark_audit",
    "mqdashboard",
    "bench",
]
CODE_SHAPE = re.compile(r"^[A-Z][A-Z0-9_]{2,}$")
# Calls whose first positional argument is a stable code ...
CODE_FIRST = {"MQClientError", "local", "Failure", "_invalid"}
# ... and whose second is (the first is a status or a flag).
CODE_SECOND = {"RpcFailure", "Refusal", "_refuse"}
# The node a mapping reads (the leader it knows, the append timeout).
NODE: Any = SimpleNamespace(
    leader_client_addr=lambda: ("n2", "127.0.0.1:7"), cfg=SimpleNamespace(append_timeout_ms=3000)
)


def _sources(packages: tuple[str, ...] | list[str] = PRODUCT) -> Iterator[tuple[Path, ast.AST]]:
    for pkg in packages:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            if "_v2" not in path.parts:
                yield path, _parsed(path)


@functools.cache
def _parsed(path: Path) -> ast.AST:
    return ast.parse(path.read_text(encoding="utf-8"))


def _codes_in(node: ast.AST) -> Iterator[tuple[str, bool]]:
    """``(code, literal)`` of an expression in a code position: a string literal, ``E.X``,
    either branch of a conditional."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        if CODE_SHAPE.match(node.value):
            yield node.value, True
    elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
        if node.value.id == "E":
            yield node.attr, False
    elif isinstance(node, ast.IfExp):
        yield from _codes_in(node.body)
        yield from _codes_in(node.orelse)
    elif isinstance(node, (ast.Set, ast.Tuple, ast.List)):
        for elt in node.elts:
            yield from _codes_in(elt)


def _code_positions(tree: ast.AST) -> Iterator[tuple[int, ast.AST]]:
    """Every expression of ``tree`` that stands for a stable code: ``code = ...`` (a class's
    or an object's), ``code=...``, the code argument of the failure constructors, and what
    ``.code`` / ``code`` is compared with."""
    for n in ast.walk(tree):
        line = getattr(n, "lineno", 0)
        if isinstance(n, (ast.Assign, ast.AnnAssign)) and n.value is not None:
            targets = n.targets if isinstance(n, ast.Assign) else [n.target]
            for t in targets:
                name = t.id if isinstance(t, ast.Name) else getattr(t, "attr", "")
                if name == "code" or name.endswith("_CODE"):
                    yield line, n.value
        elif isinstance(n, ast.keyword) and n.arg == "code":
            yield line, n.value
        elif isinstance(n, ast.Call):
            f = n.func
            name = f.id if isinstance(f, ast.Name) else getattr(f, "attr", "")
            if name in CODE_FIRST and n.args:
                yield line, n.args[0]
            if name in CODE_SECOND and len(n.args) > 1:
                yield line, n.args[1]
        elif isinstance(n, ast.Compare):
            left = n.left
            if getattr(left, "attr", None) == "code" or getattr(left, "id", None) == "code":
                for c in n.comparators:
                    yield line, c


@functools.cache
def _product_codes() -> dict[str, list[str]]:
    return _used_codes(PRODUCT)


def _used_codes(packages: tuple[str, ...] | list[str]) -> dict[str, list[str]]:
    """Each code a product package raises or tests, with where (``path:line``)."""
    used: dict[str, list[str]] = {}
    for path, tree in _sources(packages):
        where = path.relative_to(ROOT)
        for line, expr in _code_positions(tree):
            for code, _ in _codes_in(expr):
                used.setdefault(code, []).append(f"{where}:{line}")
        for n in ast.walk(tree):  # E.X anywhere (a set of codes, an argument)
            if isinstance(n, ast.Attribute) and getattr(n.value, "id", None) == "E":
                used.setdefault(n.attr, []).append(f"{where}:{n.lineno}")
    return used


def test_every_code_raised_is_in_the_table() -> None:
    missing = {c: w for c, w in _product_codes().items() if c not in TABLE}
    assert not missing, f"codes raised but not in mqerrors/errors.json: {missing}"


def test_every_code_in_the_table_is_raised_or_reserved() -> None:
    used = _product_codes()
    idle = [c for c, row in TABLE.items() if c not in used and not row.reserved]
    assert not idle, f"in the table, raised nowhere and not reserved: {idle}"
    stale = [c for c, row in TABLE.items() if c in used and row.reserved]
    assert not stale, f"marked reserved but raised: {stale}"


def test_codes_are_named_by_their_constants_not_strings() -> None:
    # ``code = E.NOT_LEADER``, never ``code = "NOT_LEADER"``: mypy then checks each name
    # against mqerrors/codes.py, and a typo cannot become a new code no table knows.
    loose = []
    for path, tree in _sources(PRODUCT):
        for line, expr in _code_positions(tree):
            loose += [f"{path.relative_to(ROOT)}:{line} {c}" for c, lit in _codes_in(expr) if lit]
    assert not loose, f"use the constants of mqerrors.codes (E.X): {loose}"


def test_the_scan_finds_codes_in_every_position(tmp_path: Path) -> None:
    # The scan itself can fail: a planted module with one code in each position.
    pkg = tmp_path / "planted"
    pkg.mkdir()
    (pkg / "m.py").write_text(
        "class X(Exception):\n    code = 'PLANTED_A'\n"
        "def f(err):\n"
        "    RpcFailure(s, 'PLANTED_B', 't')\n"
        "    MQClientError('PLANTED_C', 'NOT_FOUND', 't')\n"
        "    ClientError('t', status='S', code='PLANTED_D')\n"
        "    return err.code in {'PLANTED_E', E.PLANTED_F}\n"
    )
    global ROOT
    saved, ROOT = ROOT, tmp_path
    try:
        found = set(_used_codes(["planted"]))
    finally:
        ROOT = saved
    assert {f"PLANTED_{x}" for x in "ABCDEF"} <= found


def test_every_code_has_a_status_and_a_v2_code_of_the_pinned_stubs() -> None:
    definition = stubs.load()[0]
    v2_names = set(definition.Code.keys())
    wrong = {c: row.v2_code for c, row in TABLE.items() if row.v2_code not in v2_names}
    assert not wrong, f"v2 codes the pinned apache.rocketmq.v2.Code lacks: {wrong}"
    assert all(row.grpc_status and row.grpc_status != "OK" for row in TABLE.values())
    assert all(v2_code_name(c) == row.v2_code for c, row in TABLE.items())
    assert v2_code_name("A_NEWER_LEADERS_CODE") == "INTERNAL_ERROR"


def test_the_constants_and_the_docs_are_current() -> None:
    assert generate.main(["--check"]) == 0, "run python -m mqerrors.generate"
    assert all(getattr(E, c) == c for c in TABLE)
    assert set(E.__all__) == set(TABLE)


def test_a_stale_docs_table_is_found(tmp_path: Path) -> None:
    text = generate.docs_text(generate.DOCS_FILE.read_text(encoding="utf-8"), TABLE)
    assert text == generate.DOCS_FILE.read_text(encoding="utf-8")
    short = {c: row for c, row in TABLE.items() if c != E.NOT_LEADER}
    assert "`NOT_LEADER`" not in generate.docs_section(short)
    assert generate.docs_text(text, short) != text


@pytest.mark.parametrize(
    ("rows", "why"),
    [
        ([], "1 to"),
        ([{"code": "x"}], "unknown fields"),
        ("not a list", "1 to"),
    ],
)
def test_a_damaged_table_is_refused(rows: Any, why: str) -> None:
    with pytest.raises(TableError, match=why):
        parse(rows)


def _row(**change: Any) -> dict[str, Any]:
    row: dict[str, Any] = {
        "code": "A_CODE",
        "grpc_status": "INTERNAL",
        "v2_code": "INTERNAL_ERROR",
        "retry": "no",
        "outcome": "unknown",
        "origin": "broker",
        "description": "one line",
    }
    return {**row, **change}


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({"code": "lower"}, "is not"),
        ({"grpc_status": "OK"}, "no failing gRPC status"),
        ({"grpc_status": "NOPE"}, "no failing gRPC status"),
        ({"retry": "sometimes"}, "is not a valid Retry"),
        ({"outcome": 1}, "every field"),
        ({"description": "two\nlines"}, "one line"),
        ({"description": "x" * 201}, "one line"),
        ({"reserved": "yes"}, "reserved"),
    ],
)
def test_a_bad_row_is_refused_with_its_reason(change: dict[str, Any], why: str) -> None:
    with pytest.raises(TableError, match=why):
        parse([_row(**change)])


def test_a_code_twice_or_out_of_order_is_refused() -> None:
    with pytest.raises(TableError, match="twice"):
        parse([_row(), _row()])
    with pytest.raises(TableError, match="sorted"):
        parse([_row(code="B_CODE"), _row(code="A_CODE")])


def _error_classes() -> list[type[BaseException]]:
    """Every exception class with a code of the packages whose servers answer failures."""
    for pkg in ("dledger", "broker", "nameserver", "msgcodec"):
        root = importlib.import_module(pkg)
        for mod in pkgutil.walk_packages(root.__path__, f"{pkg}."):
            if not mod.name.endswith("__main__") and "._v2" not in mod.name:
                importlib.import_module(mod.name)
    seen: list[type[BaseException]] = []
    todo: list[type[BaseException]] = [DLedgerError, BrokerError, NameServerError, CodecError]
    while todo:
        cls = todo.pop()
        if cls not in seen:
            seen.append(cls)
            todo.extend(cls.__subclasses__())
    return seen


def _instance(cls: type[BaseException]) -> BaseException:
    """An instance of ``cls`` without its own constructor (whose arguments vary)."""
    exc = cls.__new__(cls)
    Exception.__init__(exc, "planted")
    # The fields the mappings read of the classes that have them.
    for field, value in (("index", 7), ("leader_id", "n2")):
        if field in getattr(cls.__init__, "__code__", SimpleNamespace(co_varnames=())).co_varnames:
            setattr(exc, field, value)
    if isinstance(exc, CorruptLogError):
        exc.index = 7
    return exc


# Codes whose one RPC answers them itself, with the table's status (checked by the test of
# failures built in place), and never through the exception mappings.
ANSWERED_IN_PLACE = {E.SNAPSHOT_REFUSED}  # InstallSnapshot (dledger/server/snapshots.py)


def test_the_servers_send_the_status_and_retryability_the_table_says() -> None:
    wrong = []
    for cls in _error_classes():
        exc = _instance(cls)
        if getattr(exc, "code", None) in ANSWERED_IN_PLACE:
            continue
        nameserver = isinstance(exc, NameServerError)
        failure = failure_of(exc) if nameserver else error_failure(exc, NODE)
        row = TABLE[failure.code]
        said = (failure.status.name, failure.retryable)
        if said != (row.grpc_status, row.retryable):
            wrong.append(f"{cls.__name__} -> {failure.code} {said}")
    assert not wrong, f"mappings that disagree with mqerrors/errors.json: {wrong}"


def test_failures_built_in_place_send_the_status_the_table_says() -> None:
    # RpcFailure(grpc.StatusCode.X, E.CODE, ...) written out in a server.
    wrong = []
    for path, tree in _sources(["rpckit", "dledger", "broker", "nameserver"]):
        for n in ast.walk(tree):
            if not isinstance(n, ast.Call):
                continue
            f = n.func
            if (f.id if isinstance(f, ast.Name) else getattr(f, "attr", "")) != "RpcFailure":
                continue
            if len(n.args) < 2 or getattr(n.args[0], "attr", None) is None:
                continue
            status = n.args[0].attr  # type: ignore[attr-defined]
            for code, _ in _codes_in(n.args[1]):
                if TABLE[code].grpc_status != status:
                    wrong.append(f"{path.relative_to(ROOT)}:{n.lineno} {code} {status}")
    assert not wrong, wrong


def test_client_errors_built_in_place_take_the_status_from_the_table() -> None:
    # MQClientError(E.CODE, "STATUS", ...) written out: one code, one status, wherever the
    # client raises it (MQClientError.local derives it). A server's answer (from_rpc) keeps
    # the status it came with.
    wrong = []
    for path, tree in _sources(PRODUCT):
        for n in ast.walk(tree):
            if not isinstance(n, ast.Call) or getattr(n.func, "id", None) != "MQClientError":
                continue
            if len(n.args) < 2 or not isinstance(n.args[1], ast.Constant):
                continue
            for code, _ in _codes_in(n.args[0]):
                if TABLE[code].grpc_status != n.args[1].value:
                    wrong.append(f"{path.relative_to(ROOT)}:{n.lineno} {code} {n.args[1].value}")
    assert not wrong, f"use MQClientError.local(code, message): {wrong}"
    err = MQClientError.local(E.NO_BROKER, "none")
    assert (err.status, err.retryable) == (TABLE[E.NO_BROKER].grpc_status, False)


def test_what_derives_from_the_table() -> None:
    from client.errors import GROUP_REFUSES_WRITES_CODES, LEADER_MOVED_CODES
    from jepsen_like.workloads import DEFINITE_FAILURE_CODES

    assert {E.NOT_LEADER, E.NO_QUORUM, E.LEADERSHIP_LOST} <= LEADER_MOVED_CODES
    assert E.BACK_PRESSURE not in LEADER_MOVED_CODES  # a busy leader is still the leader
    assert {E.DISK_FULL} == GROUP_REFUSES_WRITES_CODES
    # Outcome unknown is never a definite failure to the checker.
    assert not DEFINITE_FAILURE_CODES & codes(outcome=Outcome.UNKNOWN)
    assert {E.NOT_LEADER, E.TOPIC_NOT_FOUND, E.BACK_PRESSURE} <= DEFINITE_FAILURE_CODES
    assert E.NO_QUORUM not in DEFINITE_FAILURE_CODES
    assert codes(retry=Retry.LEADER) == LEADER_MOVED_CODES
