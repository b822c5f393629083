"""mqaudit's console script (spark_audit.launch) without the [audit] extra: one line naming
what is missing and the install command, exit 2; with it, the audit's own main runs."""

from __future__ import annotations

import importlib.util
from typing import Any

import pytest

import spark_audit.__main__ as audit_cli
from spark_audit import launch


def _record_main(monkeypatch: pytest.MonkeyPatch, code: int) -> list[object]:
    """The audit's main replaced by one that records its argv and returns ``code``."""
    called: list[object] = []

    def main(argv: object = None) -> int:
        called.append(argv)
        return code

    monkeypatch.setattr(audit_cli, "main", main)
    return called


def test_without_the_extra_it_says_what_is_missing(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    real = importlib.util.find_spec

    def find_spec(name: str, *args: Any) -> Any:
        return None if name in ("numpy", "pyspark") else real(name, *args)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    called = _record_main(monkeypatch, 0)
    assert launch.main(["--help"]) == launch.EXIT_USAGE
    err = capsys.readouterr().err
    assert err.startswith("mqaudit: needs the [audit] extra, and pyspark, numpy are not installed")
    assert "pip install 'raftmq[audit]'" in err and err.count("\n") == 1
    assert not called


def test_with_the_extra_it_runs_the_audit(monkeypatch: pytest.MonkeyPatch) -> None:
    called = _record_main(monkeypatch, 7)
    assert launch.main(["/some/group"]) == 7
    assert called == [["/some/group"]]
