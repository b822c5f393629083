"""The error contract: every server failure carries a ``raftmq.common.v1.ErrorInfo`` in the
standard gRPC status details, clients read the fields (the text only from servers without
them), and every exception class of a product package derives from that package's root."""

from __future__ import annotations

import ast
import builtins
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import grpc
import pytest
from google.rpc import status_pb2
from raftmq.common.v1 import error_pb2

from broker.frontends.internal.forwarder import _forward_failure as forward_failure
from broker.frontends.v1.rpcerrors import error_failure
from broker.frontends.v2.codes import v2_code_name
from broker.state.errors import TooManyConsumersError
from client.errors import MQClientError
from dledger.core import BackPressureError, NotLeaderError, TransferInProgressError
from dledger.log import ConfigError, LogCompactedError
from dledger.server import errormap
from dledger.server.errors import ProposalLostError
from dledger.server.node import NodeConfig
from dledger.storage import DiskFullError, StoreConfig
from nameserver.routes import InvalidRequestError, TooManyBrokersError
from nameserver.server import TABLE_FULL_RETRY_AFTER_MS, failure_of
from rpckit import status

ROOT = Path(__file__).resolve().parents[2]
# Each product package and the one class every exception it defines derives from. Packages
# that define no exception class have no root and are not listed: mqcli, mqmetrics, prockit
# and rpckit (they raise builtins only, ValueError for a caller's bad argument, or take the
# caller's own error class). mqdashboard's one class,
# web.BadInput (a request refused with 400), is its root: a second class must derive from it.
PACKAGE_ROOTS = {
    "dledger": "DLedgerError",
    "broker": "BrokerError",
    "nameserver": "NameServerError",
    "client": "MQClientError",
    "jepsen_like": "JepsenError",
    "spark_audit": "AuditError",
    "bench": "BenchError",
    "msgcodec": "CodecError",
    "mqsecurity": "SecurityError",
    "mqdashboard": "BadInput",
}


# What the mapping reads of a node: the leader it knows and the append timeout.
NODE: Any = SimpleNamespace(
    leader_client_addr=lambda: ("n2", "127.0.0.1:7"), append_timeout_ms=3000
)


class FakeRpcError(grpc.RpcError):
    """What a failed call looks like to a client: status, text detail, trailers."""

    def __init__(self, code: grpc.StatusCode, details: str, trailers: Any = ()) -> None:
        self._code, self._details, self._trailers = code, details, tuple(trailers)

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details

    def trailing_metadata(self) -> Any:
        return self._trailers


def _answered(failure: status.RpcFailure, text: str | None = None) -> FakeRpcError:
    """The error a client gets for ``failure``; ``text`` replaces the text detail (as a proxy
    or a future server might word it), leaving the details as sent."""
    st = failure.grpc_status()
    return FakeRpcError(st.code, st.details if text is None else text, st.trailing_metadata)


@pytest.mark.parametrize(
    ("exc", "code", "grpc_status", "retryable", "hint_ms", "unknown"),
    [
        (NotLeaderError("x", leader_id="n2"), "NOT_LEADER", "FAILED_PRECONDITION", True, 0, False),
        (
            BackPressureError("b"),
            "BACK_PRESSURE",
            "RESOURCE_EXHAUSTED",
            True,
            errormap.BACK_PRESSURE_RETRY_AFTER_MS,
            False,
        ),
        (
            DiskFullError("d"),
            "DISK_FULL",
            "RESOURCE_EXHAUSTED",
            True,
            errormap.DISK_FULL_RETRY_AFTER_MS,
            False,
        ),
        (
            TransferInProgressError("t"),
            "TRANSFER_IN_PROGRESS",
            "UNAVAILABLE",
            True,
            errormap.TRANSFER_RETRY_AFTER_MS,
            False,
        ),
        (
            ProposalLostError("l"),
            "LEADERSHIP_LOST",
            "UNAVAILABLE",
            True,
            status.UNAVAILABLE_RETRY_AFTER_MS,
            True,
        ),
        (TimeoutError(), "NO_QUORUM", "UNAVAILABLE", True, status.UNAVAILABLE_RETRY_AFTER_MS, True),
        (LogCompactedError("c"), "LOG_COMPACTED", "OUT_OF_RANGE", False, 0, False),
    ],
)
def test_dledger_errors_map_to_fields(
    exc: BaseException,
    code: str,
    grpc_status: str,
    retryable: bool,
    hint_ms: int,
    unknown: bool,
) -> None:
    failure = errormap.dledger_failure(exc, NODE)
    assert failure is not None
    err = MQClientError.from_rpc(_answered(failure))
    assert (err.code, err.status, err.structured) == (code, grpc_status, True)
    assert (err.retryable, err.retry_after_ms, err.outcome_unknown) == (retryable, hint_ms, unknown)
    assert err.message.startswith(code)  # the text keeps its prefix for grpcurl users
    if code == "NOT_LEADER":
        assert (err.leader_id, err.leader_addr) == ("n2", "127.0.0.1:7")
    assert errormap.dledger_failure(ValueError("not ours"), NODE) is None


@pytest.mark.parametrize(
    ("exc", "moved", "refuses_writes"),
    [
        (NotLeaderError("x", leader_id="n2"), True, False),
        (TransferInProgressError("t"), True, False),
        (ProposalLostError("l"), True, False),
        (TimeoutError(), True, False),
        # The leader speaking of itself: it stays the leader.
        (BackPressureError("b"), False, False),
        (DiskFullError("d"), False, True),
        (TooManyConsumersError("c"), False, False),
    ],
)
def test_what_an_answer_tells_a_client_about_the_leader(
    exc: BaseException, moved: bool, refuses_writes: bool
) -> None:
    """Only an answer saying leadership may have moved sends a client to another node of the
    group; a full disk is not cured by any node of the group nor by a retry soon."""
    err = MQClientError.from_rpc(_answered(error_failure(exc, NODE)))
    assert err.retryable
    assert (err.leader_moved, err.group_refuses_writes) == (moved, refuses_writes)


def test_a_node_that_never_answered_may_have_lost_the_lead() -> None:
    for code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
        err = MQClientError.from_rpc(FakeRpcError(code, "failed to connect to all addresses"))
        assert err.leader_moved and not err.group_refuses_writes
    # A server without ErrorInfo: the code from its text decides.
    text_only = FakeRpcError(grpc.StatusCode.RESOURCE_EXHAUSTED, "DISK_FULL node=n0 used=95%")
    err = MQClientError.from_rpc(text_only)
    assert (err.code, err.group_refuses_writes, err.leader_moved) == ("DISK_FULL", True, False)


def test_the_v2_front_end_passes_a_full_disk_on_as_what_it_is() -> None:
    """A v2 send forwarded to a leader whose disk is full: the forwarder keeps DISK_FULL, and
    the v2 client reads TOO_MANY_REQUESTS (back off and retry) with the DISK_FULL text."""
    st = error_failure(DiskFullError("node=n0 used=95.0%"), NODE).grpc_status()
    exc = grpc.aio.AioRpcError(
        st.code, grpc.aio.Metadata(), grpc.aio.Metadata(*st.trailing_metadata), st.details
    )
    failure = forward_failure(exc)
    assert (failure.code, failure.retryable) == ("DISK_FULL", True)
    assert failure.text.startswith("DISK_FULL node=n0 ")
    assert v2_code_name(failure.code) == "TOO_MANY_REQUESTS"


def test_a_not_leader_without_a_known_leader_asks_for_a_short_wait() -> None:
    info = status.not_leader(None, "").info()
    assert (info.leader_id, info.leader_addr, info.retryable) == ("", "", True)
    assert info.retry_after_ms == status.NO_LEADER_RETRY_AFTER_MS


def test_fields_win_over_a_garbled_text() -> None:
    exc = _answered(status.not_leader("n1", "10.0.0.1:9"), text="garbage without a code")
    err = MQClientError.from_rpc(exc)
    assert (err.code, err.leader_addr, err.retryable) == ("NOT_LEADER", "10.0.0.1:9", True)
    # The repository's own tools (rpckit.status.read_error) take the details only when
    # they match the call's text: a status changed on the way counts as none for them.
    assert status.read_error(exc) is None
    info = status.read_error(_answered(status.not_leader("n1", "10.0.0.1:9")))
    assert info is not None and (info.leader_id, info.leader_addr) == ("n1", "10.0.0.1:9")


def test_text_is_read_only_without_details() -> None:
    err = MQClientError.from_rpc(FakeRpcError(grpc.StatusCode.NOT_FOUND, "TOPIC_NOT_EXIST T"))
    assert (err.code, err.structured, err.retryable) == ("TOPIC_NOT_EXIST", False, False)
    # No code at the start of the text: the gRPC status names the failure.
    err = MQClientError.from_rpc(FakeRpcError(grpc.StatusCode.UNAVAILABLE, "failed to connect"))
    assert (err.code, err.retryable) == ("UNAVAILABLE", True)
    # A damaged trailer counts as none.
    damaged = FakeRpcError(
        grpc.StatusCode.INTERNAL, "x", [(status.DETAILS_KEY, b"\xff\xff not protobuf")]
    )
    assert status.read_error(damaged) is None
    assert MQClientError.from_rpc(damaged).code == "INTERNAL"
    # A status with details of another type only.
    other = status_pb2.Status(code=13, message="x")
    other.details.add().Pack(status_pb2.Status(code=1))
    foreign = FakeRpcError(
        grpc.StatusCode.INTERNAL, "x", [(status.DETAILS_KEY, other.SerializeToString())]
    )
    assert status.read_error(foreign) is None


def test_details_stay_bounded_and_carry_the_same_text() -> None:
    failure = status.RpcFailure(grpc.StatusCode.INTERNAL, "INTERNAL", "\u00e9" * 100_000)
    st = failure.grpc_status()
    assert len(st.details.encode()) <= status.MAX_DETAIL_BYTES
    trailer = dict(st.trailing_metadata)[status.DETAILS_KEY]
    decoded = status_pb2.Status.FromString(trailer)
    assert decoded.message == st.details and decoded.code == grpc.StatusCode.INTERNAL.value[0]
    assert len(trailer) < status.MAX_DETAIL_BYTES + 200
    info = error_pb2.ErrorInfo()
    assert decoded.details[0].Unpack(info) and info.code == "INTERNAL"


def test_nameserver_errors_carry_fields() -> None:
    full = failure_of(TooManyBrokersError("full")).info()
    assert (full.code, full.retryable, full.retry_after_ms) == (
        "TOO_MANY_BROKERS",
        True,
        TABLE_FULL_RETRY_AFTER_MS,
    )
    bad = failure_of(InvalidRequestError("bad")).info()
    assert (bad.code, bad.retryable) == ("INVALID_REQUEST", False)


def test_config_validation_raises_the_package_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError):
        StoreConfig(flush_interval_ms=0)
    with pytest.raises(ConfigError, match="self_id"):
        NodeConfig(
            group="g",
            self_id="n9",
            peers={"n0": "127.0.0.1:1"},
            client_host="127.0.0.1",
            client_port=2,
            store_dir=str(tmp_path),
        )


def _bases(node: ast.ClassDef) -> list[str]:
    names = []
    for b in node.bases:
        if isinstance(b, ast.Name):
            names.append(b.id)
        elif isinstance(b, ast.Attribute):
            names.append(b.attr)
    return names


def _strays(package: str, root: str, base: Path = ROOT) -> list[str]:
    """Exception classes of ``package`` whose bases never reach ``root`` (name resolution
    over the package's own class definitions; builtin exceptions end a chain)."""
    classes: dict[str, list[str]] = {}
    where: dict[str, str] = {}
    for path in sorted((base / package).rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                classes.setdefault(node.name, []).extend(_bases(node))
                where[node.name] = f"{path.relative_to(base)}:{node.lineno}"

    def reaches(name: str, seen: frozenset[str]) -> tuple[bool, bool]:
        """(is an exception, reaches root)."""
        if name == root:
            return True, True
        builtin = getattr(builtins, name, None)
        if isinstance(builtin, type) and issubclass(builtin, BaseException):
            return True, False
        if name not in classes or name in seen:
            return False, False
        results = [reaches(b, seen | {name}) for b in classes[name]]
        return any(r[0] for r in results), any(r[1] for r in results)

    out = []
    for name in classes:
        is_exc, ok = reaches(name, frozenset())
        if is_exc and not ok and name != root:
            out.append(f"{where[name]} {name}")
    return out


@pytest.mark.parametrize(("package", "root"), sorted(PACKAGE_ROOTS.items()))
def test_every_exception_derives_from_its_package_root(package: str, root: str) -> None:
    assert _strays(package, root) == []


def test_the_scan_finds_a_stray(tmp_path: Path) -> None:
    """The scan has teeth: a class deriving from Exception directly is reported."""
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "a.py").write_text(
        "class PkgError(Exception): ...\nclass Good(PkgError): ...\n"
        "class Stray(RuntimeError): ...\nclass Mixed(PkgError, ValueError): ...\n"
    )
    assert [s.split()[-1] for s in _strays("pkg", "PkgError", tmp_path)] == ["Stray"]


def test_a_write_gRPC_failed_on_its_own_has_an_unknown_outcome() -> None:
    """A deadline or a broken connection may come after the server carried the write out."""
    for code in (grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.UNAVAILABLE):
        assert MQClientError.from_rpc(FakeRpcError(code, "deadline")).outcome_unknown
    refused = FakeRpcError(grpc.StatusCode.NOT_FOUND, "TOPIC_NOT_EXIST T")
    assert not MQClientError.from_rpc(refused).outcome_unknown
    # A server's answer says itself: a redirect is definite, a lost quorum is not.
    assert not MQClientError.from_rpc(_answered(status.not_leader("n1", "a:1"))).outcome_unknown
    assert MQClientError.from_rpc(_answered(status.no_quorum(3000))).outcome_unknown


def test_a_retry_keeps_an_earlier_attempts_unknown_outcome_on_a_copy() -> None:
    definite = MQClientError.from_rpc(_answered(status.not_leader("n1", "a:1")))
    assert definite.marked_unknown(False) is definite
    marked = definite.marked_unknown(True)
    assert marked.outcome_unknown and not definite.outcome_unknown  # shared objects untouched
    assert (marked.code, marked.leader_addr, marked.__cause__) == ("NOT_LEADER", "a:1", definite)
