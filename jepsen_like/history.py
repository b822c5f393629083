"""The history of a run: one JSON object per line, the way Jepsen records histories.

Every operation is recorded twice: an ``invoke`` when a client starts it and one completion,
``ok`` (it happened), ``fail`` (it certainly did not happen) or ``info`` (unknown: it may or
may not have happened, e.g. a timeout). Nemesis actions and polled node states are ``info``
and ``ok`` records of the processes ``nemesis`` and ``monitor``. ``time`` is seconds on the
monotonic clock since the run started.

Values by operation (``f``):

- ``send`` / ``append``: ``{"v": int, "queue": int}`` on invoke; ``ok`` adds ``"offset"`` (the
  queue offset, or the Raft index for ``append``, that the acknowledgement reported);
- ``poll`` / ``read`` / ``drain``: ``ok`` carries ``[[queue, offset, v], ...]`` read in order
  (``drain`` is the final read after heal; a failed drain is a ``fail`` record);
- ``start`` / ``stop`` (nemesis): ``{"fault": kind, "detail": text}``; a ``storage`` fault's
  ``start`` adds ``node``, ``damage`` and what was done (``file``, ``offset``, ``indexes``...);
- ``refused`` (nemesis): ``{"fault": "storage", "node", "damage", "reason"}``: a damaged node
  would not start;
- ``state`` (monitor): ``{"node", "role", "term", "commit", "repairing"}``.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TextIO, cast

logger = logging.getLogger(__name__)

OpType = Literal["invoke", "ok", "fail", "info"]
OP_TYPES: frozenset[str] = frozenset({"invoke", "ok", "fail", "info"})
NEMESIS = "nemesis"
MONITOR = "monitor"


@dataclass(frozen=True, slots=True)
class Op:
    index: int
    process: str
    type: OpType
    f: str
    value: Any
    time: float  # seconds since the run started (monotonic)

    def to_json(self) -> str:
        return json.dumps(
            {
                "index": self.index,
                "process": self.process,
                "type": self.type,
                "f": self.f,
                "value": self.value,
                "time": round(self.time, 6),
            },
            separators=(",", ":"),
        )

    @staticmethod
    def from_dict(d: dict[str, Any]) -> Op:
        if d.get("type") not in OP_TYPES:
            raise ValueError(f"op {d!r}: type must be one of {sorted(OP_TYPES)}")
        return Op(
            int(d["index"]),
            str(d["process"]),
            cast(OpType, d["type"]),
            str(d["f"]),
            d.get("value"),
            float(d["time"]),
        )


class History:
    """Thread-safe recorder; every op also goes to ``path`` (JSON lines) as it happens."""

    def __init__(self, path: Path | None = None) -> None:
        self._lock = threading.Lock()
        self._ops: list[Op] = []
        self._t0 = time.monotonic()
        self._file: TextIO | None = path.open("w", encoding="utf-8") if path else None

    def now(self) -> float:
        return time.monotonic() - self._t0

    def add(self, process: str, type_: OpType, f: str, value: Any) -> Op:
        with self._lock:
            op = Op(len(self._ops), process, type_, f, value, self.now())
            self._ops.append(op)
            if self._file is not None:
                self._file.write(op.to_json() + "\n")
            return op

    def ops(self) -> list[Op]:
        with self._lock:
            return list(self._ops)

    def close(self) -> None:
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None


def load_history(path: Path) -> list[Op]:
    """Read a history file written by :class:`History`."""
    ops = []
    with path.open(encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                ops.append(Op.from_dict(json.loads(line)))
            except (ValueError, KeyError, TypeError) as exc:
                raise ValueError(f"{path}:{lineno}: {exc}") from None
    return ops


def make_ops(records: Iterable[tuple[str, OpType, str, Any, float]]) -> list[Op]:
    """Ops from ``(process, type, f, value, time)`` tuples (hand-made histories in tests)."""
    return [Op(i, p, t, f, v, tm) for i, (p, t, f, v, tm) in enumerate(records)]


def pairs(ops: Iterable[Op]) -> Iterator[tuple[Op, Op | None]]:
    """Each client invoke with its completion (None if the run ended first)."""
    open_ops: dict[str, Op] = {}
    done: list[tuple[Op, Op | None]] = []
    for op in ops:
        if op.process in (NEMESIS, MONITOR):
            continue
        if op.type == "invoke":
            open_ops[op.process] = op
        else:
            inv = open_ops.pop(op.process, None)
            if inv is not None:
                done.append((inv, op))
    done.extend((inv, None) for inv in open_ops.values())
    done.sort(key=lambda p: p[0].index)
    return iter(done)
