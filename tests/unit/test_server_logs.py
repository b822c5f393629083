"""Where a server's log goes (mqcli/logs.py, docs/DEPLOY.md "Logs"): a file of its own rotated
at its size with a bounded number of backups, JSON lines on request, bounds and an unwritable
directory refused before anything starts."""

from __future__ import annotations

import argparse
import json
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from mqcli import server_parser
from mqcli.logs import MIN_MAX_BYTES, check_log_arguments, setup_server_logging


def _parser() -> argparse.ArgumentParser:
    return server_parser("mqtest", "a server", "keys", {"k": "a key"})


@pytest.fixture
def restore_root() -> Iterator[None]:
    """The root logger as pytest had it, whatever a test set up."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    for h in list(root.handlers):
        root.removeHandler(h)
        h.close()
    for h in handlers:
        root.addHandler(h)
    root.setLevel(level)


def _setup(argv: list[str]) -> logging.Handler:
    parser = _parser()
    ns = parser.parse_args(argv)
    check_log_arguments(parser, ns)
    return setup_server_logging(ns)


def test_a_log_file_rotates_at_its_size_and_keeps_its_backups(
    tmp_path: Path, restore_root: None
) -> None:
    log = tmp_path / "broker.log"
    argv = ["--log-file", str(log), "--log-max-bytes", str(MIN_MAX_BYTES), "--log-backups", "2"]
    handler = _setup(argv)
    line = "x" * 1000
    for i in range(5 * MIN_MAX_BYTES // 1000):  # five files' worth
        logging.getLogger("broker.test").info("%d %s", i, line)
    handler.flush()
    files = sorted(p.name for p in tmp_path.iterdir())
    assert files == ["broker.log", "broker.log.1", "broker.log.2"]
    assert all((tmp_path / f).stat().st_size <= MIN_MAX_BYTES for f in files)
    last = log.read_text().splitlines()[-1]
    assert last.endswith(line) and " INFO broker.test " in last


def test_json_lines_carry_time_level_logger_and_exception(
    tmp_path: Path, restore_root: None
) -> None:
    log = tmp_path / "namesrv.log"
    handler = _setup(["--log-file", str(log), "--log-format", "json", "--log-level", "DEBUG"])
    logging.getLogger("nameserver.x").debug("registered %s", "n0")
    try:
        raise ValueError("boom")
    except ValueError:
        logging.getLogger("nameserver.x").exception("failed")
    handler.flush()
    first, second = (json.loads(s) for s in log.read_text().splitlines())
    assert first["level"] == "DEBUG" and first["logger"] == "nameserver.x"
    assert first["msg"] == "registered n0" and first["ts"].endswith("Z") and first["pid"] > 0
    assert second["level"] == "ERROR" and "ValueError: boom" in second["exc"]


@pytest.mark.parametrize(
    "argv",
    [
        ["--log-max-bytes", "1000"],
        ["--log-max-bytes", str(11 << 30)],
        ["--log-backups", "0"],
        ["--log-backups", "101"],
        ["--log-format", "xml"],
        ["--log-file", "/nonexistent-dir/x.log"],
    ],
)
def test_bad_log_options_are_refused(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    parser = _parser()
    with pytest.raises(SystemExit) as exc:
        check_log_arguments(parser, parser.parse_args(argv))
    assert exc.value.code == 2
    assert argv[0] in capsys.readouterr().err
