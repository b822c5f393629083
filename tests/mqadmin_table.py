"""The table "RocketMQ's letters, command by command" of docs/CLIENT.md, read for the tests: per
shared command its RocketMQ letters and the command lines the compatibility test runs, each
honoured (exit 0) or refused (exit 2). The doc is the single source: a test that reads it
cannot drift from it."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

DOC = Path(__file__).resolve().parents[1] / "docs" / "CLIENT.md"
HEADING = "### RocketMQ's letters, command by command"
_RUN = re.compile(r"(refused )?`([^`]+)`")
_LETTER = re.compile(r"`(-[A-Za-z])`")


@dataclass(frozen=True, slots=True)
class Run:
    command: str
    line: str  # the command line after ``mqadmin``, with {placeholders}
    refused: bool


@dataclass(frozen=True, slots=True)
class Row:
    command: str
    letters: tuple[str, ...]
    runs: tuple[Run, ...]


def compat_rows(doc: Path = DOC) -> list[Row]:
    """The table's rows in order (the order the compatibility test runs them)."""
    text = doc.read_text(encoding="utf-8")
    start = text.index(HEADING)
    rows: list[Row] = []
    for line in text[start:].splitlines()[1:]:
        if line.startswith("#"):
            break
        if not line.startswith("| `"):
            continue
        cells = [c.strip() for c in line.strip().strip("|").split(" | ")]
        assert len(cells) == 4, f"a row of four cells: {line}"
        command = cells[0].strip("`")
        runs = tuple(Run(command, m.group(2), bool(m.group(1))) for m in _RUN.finditer(cells[3]))
        assert runs, f"{command}: no runs"
        for run in runs:
            assert run.line.split()[0] == command, f"{command}: a run of another command: {run}"
        rows.append(Row(command, tuple(_LETTER.findall(cells[1])), runs))
    assert rows, f"no table under {HEADING!r} in {doc}"
    return rows
