"""A real NameServer and a one-node broker started with ``--log-file ... --log-format json``
(docs/DEPLOY.md, "Logs"): each writes its own file of JSON lines (its start and, for the broker,
its leadership), nothing of Python's logging on stderr, and both stop on SIGTERM."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from prockit.processes import free_ports

pytestmark = [pytest.mark.integration]

START_S = 30.0
STOP_S = 15.0
POLL_S = 0.05


def _json_lines(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    text = path.read_text()
    return [json.loads(line) for line in text[: text.rfind("\n") + 1].splitlines()]


def _wait_line(proc: subprocess.Popen[bytes], log: Path, needle: str) -> list[dict[str, Any]]:
    deadline = time.monotonic() + START_S
    while time.monotonic() < deadline:
        lines = _json_lines(log)
        if any(needle in x["msg"] for x in lines):
            return lines
        assert proc.poll() is None, f"exited {proc.returncode}: {log.read_text()[-2000:]}"
        time.sleep(POLL_S)
    raise AssertionError(f"no {needle!r} in {log} within {START_S} s")


def _start(argv: list[str], tmp_path: Path, name: str) -> subprocess.Popen[bytes]:
    with (tmp_path / f"{name}.stderr").open("wb") as err:
        return subprocess.Popen(
            [sys.executable, *argv], stdin=subprocess.DEVNULL, stdout=err, stderr=err, cwd=tmp_path
        )


def test_servers_write_json_lines_to_their_own_files(tmp_path: Path) -> None:
    ns_port, client_port, peer_port = free_ports(3)
    ns_log, broker_log = tmp_path / "namesrv.log", tmp_path / "broker.log"
    conf = tmp_path / "broker.conf"
    conf.write_text(
        f"dLegerSelfId=n0\ndLegerPeers=n0-127.0.0.1:{peer_port}\nlistenPort={client_port}\n"
        f"storePathRootDir={tmp_path / 'store'}\nnamesrvAddr=127.0.0.1:{ns_port}\n"
        "mappedFileSizeCommitLog=1048576\nmappedFileSizeEntryIndex=1048576\n"
        "diskSpaceReserveBytes=0\ndiskSpaceWarningLevelRatio=99\ndiskSpaceResumeRatio=98\n"
    )
    json_log = ["--log-format", "json", "--log-max-bytes", "1048576", "--log-backups", "2"]
    procs = [
        _start(
            ["-m", "nameserver", "-p", str(ns_port), "--log-file", str(ns_log), *json_log],
            tmp_path,
            "namesrv",
        )
    ]
    try:
        procs.append(
            _start(
                ["-m", "broker", "-c", str(conf), "--log-file", str(broker_log), *json_log],
                tmp_path,
                "broker",
            )
        )
        _wait_line(procs[0], ns_log, "nameserver started")
        lines = _wait_line(procs[1], broker_log, "role=leader")
        assert {x["logger"].split(".")[0] for x in lines} >= {"dledger", "broker"}
        assert all(x["pid"] == procs[1].pid for x in lines)
        _wait_line(procs[0], ns_log, "node=n0 role=LEADER")  # its registration, there
    finally:
        for p in procs:
            p.send_signal(signal.SIGTERM)
        codes = [p.wait(timeout=STOP_S) for p in procs]
    assert codes == [0, 0]
    for name in ("namesrv", "broker"):
        stderr = (tmp_path / f"{name}.stderr").read_text()
        assert " INFO " not in stderr and '"level"' not in stderr, stderr[-2000:]
