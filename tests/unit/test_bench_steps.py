"""bench.steps' counting tool (issue 36): the in-node hook counts calls and copies of a body
in a window, the runner parses strace's summary and turns windows into figures per message.
No figure of speed is asserted."""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from bench import __main__ as bench_main
from bench import steps

sys.path.insert(0, str(steps.HOOK_DIR))
import raftmq_stepcount as hook  # the hook lives beside sitecustomize.py

BODY_BYTES = 64 * 1024


def _copy_twice(body: bytes) -> int:
    first = bytes(bytearray(body))  # a copy
    second = first + b"!"  # and another
    return len(second)


def _small_work() -> int:
    return sum(len(str(i)) for i in range(100))


def test_copies_window_finds_each_copy_of_a_body() -> None:
    body = os.urandom(BODY_BYTES)
    window = hook.Window("copies", BODY_BYTES)
    window.open()
    try:
        _copy_twice(body)
        _small_work()
    finally:
        result = window.close()
    assert result["mode"] == "copies"
    sites = result["copies"]
    assert sum(sites.values()) >= 2, sites
    assert any("_copy_twice" in s or "bytearray" in s for s in sites), sites
    assert not any("_small_work" in s for s in sites), sites


def test_profile_window_counts_calls() -> None:
    window = hook.Window("profile", 0)
    window.open()
    try:
        for _ in range(7):
            _small_work()
    finally:
        result = window.close()
    calls = result["calls"]
    assert calls["test_bench_steps.py:_small_work"] == 7
    assert result["top_tottime"]


def test_signals_open_and_close_a_window(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(hook.ENV_DIR, str(tmp_path))
    (tmp_path / hook.WINDOW_FILE).write_text(json.dumps({"mode": "profile"}))
    saved = (signal.getsignal(signal.SIGUSR1), signal.getsignal(signal.SIGUSR2))
    try:
        hook.arm()
        os.kill(os.getpid(), signal.SIGUSR1)
        _small_work()
        os.kill(os.getpid(), signal.SIGUSR2)
    finally:
        signal.signal(signal.SIGUSR1, saved[0])
        signal.signal(signal.SIGUSR2, saved[1])
    dump = json.loads((tmp_path / f"{os.getpid()}.json").read_text())
    assert dump["mode"] == "profile"
    assert dump["calls"]["test_bench_steps.py:_small_work"] == 1


STRACE = """\
% time     seconds  usecs/call     calls    errors syscall
------ ----------- ----------- --------- --------- ----------------
 41.43    0.010000          10      1000           futex
 20.00    0.005000           5       900       120 recvmsg
  1.00    0.000100         100         3           fdatasync
------ ----------- ----------- --------- --------- ----------------
100.00    0.015100                  1903       120 total
"""


def test_parse_strace_summary() -> None:
    assert steps.parse_strace(STRACE) == {"futex": 1000, "recvmsg": 900, "fdatasync": 3}


def _window(mode: str, leader_figures: dict[str, Any]) -> dict[str, Any]:
    return {
        "mode": mode,
        "flush": "SYNC_FLUSH",
        "size": 1024,
        "in_flight": 1,
        "load": {"messages_per_s": 100.0},
        "per_message": {"leader": leader_figures, "follower n1": {"cpu_us": 10.0}},
    }


def test_per_message_and_merge_take_each_figure_from_its_window() -> None:
    node = {
        "cpu_s": 0.2,
        "loop_cpu_s": 0.1,
        "loop_wakeups": 400,
        "calls": {"raft.py:ready": 300},
        "syscalls": {"fdatasync": 100},
    }
    figures = steps.per_message(node, 100)
    assert figures["cpu_us"] == pytest.approx(2000.0)
    assert figures["loop_wakeups"] == 4.0
    assert figures["Readys"] == 3.0
    assert figures["sys fdatasync"] == 1.0
    merged = steps.merge(
        [
            _window("plain", {"cpu_us": 1000.0, "Readys": 99.0}),
            _window("profile", {"cpu_us": 5000.0, "Readys": 3.0}),
        ]
    )
    leader = merged[("SYNC_FLUSH", 1024, 1, "leader")]
    assert leader["cpu_us"] == 1000.0  # from the plain window: the profiler slows a node
    assert leader["Readys"] == 3.0  # from the profile
    assert leader["msg/s"] == 100.0
    md = steps.markdown({"this": [_window("plain", {"cpu_us": 1000.0})]})
    assert "| CPU us, all threads | 1,000 |" in md  # the table names what it measures
    assert "| msg/s of the load (a rate, not per message) | 100.00 |" in md


ROOT = Path(__file__).resolve().parents[2]


def _defined(module_file: str, function: str) -> bool:
    """Whether a module of that file name in the project's code defines ``function``."""
    for package in ("dledger", "broker"):
        for path in (ROOT / package).rglob(module_file):
            if f"def {function}(" in path.read_text():
                return True
    return False


def test_every_profile_key_names_a_function_of_the_code() -> None:
    """A key whose function moved or was renamed counts 0 without a word (the persist job
    moved to persister.py and the entry encoder was renamed while the labels stayed)."""
    keys = [k for _label, ks in steps.CALLS for k in ks if not k.startswith("<")]
    assert keys
    known = steps.OLDER_TREE_KEYS | steps.STDLIB_KEYS
    stale = [k for k in keys if k not in known and not _defined(*k.split(":"))]
    assert stale == []
    labels = [label for label, _ in steps.CALLS]
    assert len(labels) == len(set(labels))


def test_another_checkouts_brokers_get_only_the_keys_they_know(tmp_path: Path) -> None:
    """``--compare`` with an older checkout: its mqbroker refuses a key added since (as
    remotingListenPort was), so the group's files keep only the keys its --help lists."""
    keys = steps.broker_keys(Path(steps.__file__).resolve().parent.parent)
    assert {"dLegerPeers", "listenPort", "remotingListenPort"} <= keys
    conf = tmp_path / "n0.conf"
    conf.write_text("# a node\nlistenPort=1\nremotingListenPort=2\ndLegerPeers=n0-a:1\n")

    cluster = SimpleNamespace(nodes=[SimpleNamespace(conf=str(conf))])
    bench_main._drop_unknown_keys(cluster, frozenset({"listenPort", "dLegerPeers"}))  # type: ignore[arg-type]
    assert conf.read_text() == "# a node\nlistenPort=1\ndLegerPeers=n0-a:1\n"


def test_the_hook_finds_the_send_path_of_an_older_checkout() -> None:
    """Before the broker's layers, SendPath lived in broker/sending.py: the hook counts there."""
    assert hook.SEND_PATH_MODULES[-1] == "broker.sending"
    assert "broker.components.sending" in hook.SEND_PATH_MODULES
