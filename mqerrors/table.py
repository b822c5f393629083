"""The error table (``errors.json`` of this package), read and checked once at import.

Each code has: ``grpc_status``, the name of the gRPC status a server's failure with the code
carries (for a code only a client or tool raises, the status it gives the error);
``v2_code``, the ``apache.rocketmq.v2.Code`` name the RocketMQ 5 front end answers with;
``retry``, where another attempt may succeed (:class:`Retry`); ``outcome``, whether a write so
failed certainly did not happen (:class:`Outcome`); ``origin``, the component that raises it;
``description``, one line for the docs.
"""

from __future__ import annotations

import enum
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from typing import Any

TABLE_FILE = "errors.json"
# A code: upper-case words joined by underscores, short enough for a log line's key.
CODE_PATTERN = re.compile(r"^[A-Z][A-Z0-9_]{2,47}$")
# A v2 code name has the same shape (the test checks each against the pinned v2 stubs).
V2_CODE_PATTERN = CODE_PATTERN
# The description is one line of the docs' table: long enough for a sentence, no more.
MAX_DESCRIPTION_CHARS = 200
# More codes than this is a damaged file, not a table (there are about 110).
MAX_CODES = 1000
# gRPC's status names (grpc.StatusCode), written out: this package imports no gRPC.
GRPC_STATUS_NAMES = frozenset(
    {
        "OK",
        "CANCELLED",
        "UNKNOWN",
        "INVALID_ARGUMENT",
        "DEADLINE_EXCEEDED",
        "NOT_FOUND",
        "ALREADY_EXISTS",
        "PERMISSION_DENIED",
        "RESOURCE_EXHAUSTED",
        "FAILED_PRECONDITION",
        "ABORTED",
        "OUT_OF_RANGE",
        "UNIMPLEMENTED",
        "INTERNAL",
        "UNAVAILABLE",
        "DATA_LOSS",
        "UNAUTHENTICATED",
    }
)


class TableError(ValueError):
    """``errors.json`` is malformed (a build that ships a damaged table must not start)."""


class Retry(enum.Enum):
    """Where another attempt of the same request may succeed."""

    NO = "no"  # the same request fails again: fix it
    BACKOFF = "backoff"  # the same node, after the failure's retry_after_ms
    LEADER = "leader"  # the leader moved or may have: find it again (refresh, another member)
    OTHER_GROUP = "other_group"  # no node of this group soon: only another broker group


class Outcome(enum.Enum):
    """What a write that failed with the code did."""

    DEFINITE = "definite"  # refused before anything was proposed: it did not happen
    UNKNOWN = "unknown"  # it may have happened (retry only with the same message ids)


class Origin(enum.Enum):
    """The component that raises the code."""

    DLEDGER = "dledger"  # the Raft node, its log store and its client
    BROKER = "broker"
    V2 = "v2"  # the broker's RocketMQ 5 front end
    NAMESERVER = "nameserver"
    CODEC = "codec"  # the message codec (msgcodec), raised by broker and clients alike
    CLIENT = "client"  # the Python clients, mqadmin and the dashboard, never a server
    TOOL = "tool"  # development tools (simulator, failpoints, mqcluster): never on the wire


@dataclass(frozen=True, slots=True)
class ErrorSpec:
    """One row of the table."""

    code: str
    grpc_status: str
    v2_code: str
    retry: Retry
    outcome: Outcome
    origin: Origin
    description: str
    reserved: bool = False  # in the table for clients and docs, raised by nothing today

    @property
    def retryable(self) -> bool:
        """Another attempt may succeed somewhere (:attr:`retry` is not ``NO``)."""
        return self.retry is not Retry.NO


def parse(rows: Any) -> dict[str, ErrorSpec]:
    """The table of ``rows`` (the decoded JSON), every field checked; :class:`TableError`
    names the first bad row."""
    if not isinstance(rows, list) or not 0 < len(rows) <= MAX_CODES:
        raise TableError(f"the table is a list of 1 to {MAX_CODES} rows")
    table: dict[str, ErrorSpec] = {}
    for i, row in enumerate(rows):
        spec = _row(i, row)
        if spec.code in table:
            raise TableError(f"row {i}: code {spec.code} is in the table twice")
        table[spec.code] = spec
    if list(table) != sorted(table):
        raise TableError("rows are not sorted by code")
    return table


_FIELDS = ("code", "grpc_status", "v2_code", "retry", "outcome", "origin", "description")


def _row(i: int, row: Any) -> ErrorSpec:
    if not isinstance(row, dict):
        raise TableError(f"row {i}: not an object")
    unknown = set(row) - {*_FIELDS, "reserved"}
    missing = set(_FIELDS) - set(row)
    if unknown or missing:
        raise TableError(f"row {i}: unknown fields {sorted(unknown)}, missing {sorted(missing)}")
    if not all(isinstance(row[f], str) for f in _FIELDS):
        raise TableError(f"row {i}: every field but reserved is a string")
    code, status, v2 = row["code"], row["grpc_status"], row["v2_code"]
    if not CODE_PATTERN.match(code):
        raise TableError(f"row {i}: code {code[:60]!r} is not {CODE_PATTERN.pattern}")
    if status not in GRPC_STATUS_NAMES or status == "OK":
        raise TableError(f"row {i} ({code}): {status[:60]!r} is no failing gRPC status")
    if not V2_CODE_PATTERN.match(v2):
        raise TableError(f"row {i} ({code}): v2_code {v2[:60]!r} is not a code name")
    text = row["description"]
    if not 0 < len(text) <= MAX_DESCRIPTION_CHARS or "\n" in text or "|" in text:
        raise TableError(
            f"row {i} ({code}): the description is one line of 1 to "
            f"{MAX_DESCRIPTION_CHARS} characters without '|'"
        )
    reserved = row.get("reserved", False)
    if not isinstance(reserved, bool):
        raise TableError(f"row {i} ({code}): reserved is true or false")
    try:
        kinds = Retry(row["retry"]), Outcome(row["outcome"]), Origin(row["origin"])
    except ValueError as exc:
        raise TableError(f"row {i} ({code}): {exc}") from None
    return ErrorSpec(code, status, v2, *kinds, description=text, reserved=reserved)


def load() -> dict[str, ErrorSpec]:
    """The table this package ships."""
    text = resources.files(__package__).joinpath(TABLE_FILE).read_text(encoding="utf-8")
    try:
        rows = json.loads(text)
    except json.JSONDecodeError as exc:
        raise TableError(f"{TABLE_FILE}: {exc}") from None
    return parse(rows)


TABLE: Mapping[str, ErrorSpec] = load()


def spec(code: str) -> ErrorSpec | None:
    """The row of ``code`` (None for a code not in the table: a newer server's, or a gRPC
    status name a client took as the code of a bare failure)."""
    return TABLE.get(code)


def codes(*, retry: Retry | None = None, outcome: Outcome | None = None) -> frozenset[str]:
    """The codes whose ``retry`` and ``outcome`` are those given (None: any)."""
    return frozenset(
        s.code
        for s in TABLE.values()
        if (retry is None or s.retry is retry) and (outcome is None or s.outcome is outcome)
    )


def v2_code_name(code: str) -> str:
    """The ``apache.rocketmq.v2.Code`` name of ``code``; a code outside the table (a newer
    leader's) is an internal error."""
    row = TABLE.get(code)
    return row.v2_code if row is not None else "INTERNAL_ERROR"


__all__ = [
    "TABLE",
    "ErrorSpec",
    "Origin",
    "Outcome",
    "Retry",
    "TableError",
    "codes",
    "load",
    "parse",
    "spec",
    "v2_code_name",
]
