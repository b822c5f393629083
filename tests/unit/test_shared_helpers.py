"""The helpers the tools and servers share: strict properties files (prockit/properties.py),
processes (prockit/processes.py) and ``--set KEY=VALUE`` lists (mqcli)."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import socket
import sys
import time
from pathlib import Path
from typing import ClassVar

import pytest

from mqcli import parse_assignments
from prockit import processes
from prockit.properties import int_in, parse_properties, parse_values, read_text


class MyConfigError(Exception):
    pass


def test_properties_refusals_name_the_file_and_key_in_the_callers_error() -> None:
    keys = {"a": int_in(1, 9), "b": str}
    assert parse_properties("# c\n\na=1\nb = x y\n", "f.conf", keys, "tool", MyConfigError) == {
        "a": "1",
        "b": "x y",
    }
    cases = {
        "a=1\na=2\n": "f.conf: key 'a' is set twice",
        "zz=1\n": "f.conf: unknown key 'zz' (tool --help lists the keys)",
        "a=\\u12\n": "f.conf: not a properties file",
    }
    for text, message in cases.items():
        with pytest.raises(MyConfigError, match="^" + re.escape(message)):
            parse_properties(text, "f.conf", keys, "tool", MyConfigError)
    assert parse_values({"a": " 7 "}, keys, "f.conf", MyConfigError) == {"a": 7}
    with pytest.raises(
        MyConfigError, match=re.escape("f.conf: key 'a': '10' is out of range [1, 9]")
    ):
        parse_values({"a": "10"}, keys, "f.conf", MyConfigError)
    with pytest.raises(MyConfigError, match=re.escape("f.conf: key 'a': 'x' is not an integer")):
        parse_values({"a": "x"}, keys, "f.conf", MyConfigError)


def test_read_text_refuses_missing_and_non_utf8(tmp_path: Path) -> None:
    with pytest.raises(MyConfigError, match="cannot read"):
        read_text(tmp_path / "none.conf", MyConfigError)
    bad = tmp_path / "bad.conf"
    bad.write_bytes(b"a=\xff\n")
    with pytest.raises(MyConfigError, match="not UTF-8 text"):
        read_text(bad, MyConfigError)


def test_parse_assignments() -> None:
    assert parse_assignments(["a=1", "b=x=y", "a=2", "c="]) == {"a": "2", "b": "x=y", "c": ""}
    for bad in (["novalue"], ["=1"]):
        with pytest.raises(ValueError, match="expected KEY=VALUE"):
            parse_assignments(bad)


def test_free_ports_are_distinct() -> None:
    ports = processes.free_ports(8)
    assert len(set(ports)) == 8 and all(0 < p < 65536 for p in ports)


def test_spawned_child_logs_and_its_exit_is_seen(tmp_path: Path) -> None:
    log = tmp_path / "child.log"
    log.write_text("earlier\n")
    proc = processes.spawn_logged(
        [sys.executable, "-c", "print('hello'); import sys; sys.exit(3)"], log
    )
    deadline = time.monotonic() + 10
    while not processes.exited(proc.pid):  # reaps it
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert log.read_text() == "earlier\nhello\n"  # appended, stderr and stdout together
    assert processes.exited(proc.pid)


def test_a_spawned_child_has_a_session_of_its_own(tmp_path: Path) -> None:
    proc = processes.spawn_logged(
        [sys.executable, "-c", "import time; time.sleep(30)"], tmp_path / "l"
    )
    try:
        assert not processes.exited(proc.pid)
        assert os.getsid(proc.pid) == proc.pid != os.getsid(0)
    finally:
        proc.kill()
        proc.wait()


def test_serve_until_signalled_stops_once() -> None:
    stops: list[int] = []

    async def stop() -> None:
        stops.append(1)
        await asyncio.sleep(0.2)  # the second signal arrives while stopping

    async def main() -> None:
        loop = asyncio.get_running_loop()
        loop.call_later(0.05, os.kill, os.getpid(), signal.SIGTERM)
        loop.call_later(0.06, os.kill, os.getpid(), signal.SIGINT)
        await asyncio.wait_for(processes.serve_until_signalled(stop), timeout=10)

    asyncio.run(main())
    assert stops == [1]


def test_free_ports_come_from_below_the_ephemeral_range(monkeypatch: pytest.MonkeyPatch) -> None:
    """A picked port is bound by a child a second later: outgoing connections and binds to
    port 0 (the ephemeral range) must not take it meanwhile."""
    monkeypatch.delenv(processes.PICK_PORTS_ENV, raising=False)
    ports = processes.free_ports(12)
    assert len(set(ports)) == 12
    assert all(processes.PICK_PORT_LOW <= p < processes.PICK_PORT_HIGH for p in ports)
    with socket.socket() as taken:  # the whole range in use: the kernel's choice instead
        taken.bind(("127.0.0.1", 0))
        busy = taken.getsockname()[1]
        monkeypatch.setattr(processes, "PICK_PORT_LOW", busy)
        monkeypatch.setattr(processes, "PICK_PORT_HIGH", busy + 1)
        (port,) = processes.free_ports(1)
    assert port != busy


def test_avoided_ports_are_never_picked(monkeypatch: pytest.MonkeyPatch) -> None:
    """Ports promised to processes not started yet (another group's) are free but not ours:
    in a range of 256 with 200 avoided, 40 picks land only on the other 56."""
    monkeypatch.setenv(processes.PICK_PORTS_ENV, "26000-26256")
    avoid = set(range(26000, 26200))
    for _ in range(5):
        ports = processes.free_ports(40, avoid=avoid)
        assert len(set(ports)) == 40 and not set(ports) & avoid


class _KernelSocket:
    """A socket whose port-0 binds get the kernel's next port from a fixed list, and whose
    binds to a chosen port are all refused (the whole pick range in use)."""

    next_ports: ClassVar[list[int]] = []

    def __init__(self, *_: object) -> None:
        self.port = 0

    def __enter__(self) -> _KernelSocket:
        return self

    def __exit__(self, *_: object) -> None:
        return None

    def bind(self, addr: tuple[str, int]) -> None:
        if addr[1] != 0:
            raise OSError("in use")
        self.port = self.next_ports.pop(0)

    def getsockname(self) -> tuple[str, int]:
        return ("127.0.0.1", self.port)


def test_an_avoided_kernel_choice_is_passed_over(monkeypatch: pytest.MonkeyPatch) -> None:
    """The whole pick range busy: the kernel's port-0 choice is taken instead, but never one
    that is avoided (it stays bound aside and the kernel is asked again)."""
    monkeypatch.setattr(_KernelSocket, "next_ports", [30001, 30002, 30003, 30004])
    monkeypatch.setattr(processes.socket, "socket", _KernelSocket)
    assert processes.free_ports(2, avoid={30001, 30003}) == [30002, 30004]


def test_a_pick_range_of_its_own_keeps_side_by_side_runs_apart(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(processes.PICK_PORTS_ENV, "26000-26256")
    assert processes.pick_port_range() == (26000, 26256)
    assert all(26000 <= p < 26256 for p in processes.free_ports(40))
    monkeypatch.delenv(processes.PICK_PORTS_ENV)
    assert processes.pick_port_range() == (processes.PICK_PORT_LOW, processes.PICK_PORT_HIGH)


@pytest.mark.parametrize(
    "spec", ["26000", "a-b", "26000-26100", "1000-30000", "30000-40000", "27000-26000", "-5-9"]
)
def test_a_malformed_pick_range_is_refused_saying_why(
    monkeypatch: pytest.MonkeyPatch, spec: str
) -> None:
    monkeypatch.setenv(processes.PICK_PORTS_ENV, spec)
    with pytest.raises(ValueError, match=processes.PICK_PORTS_ENV):
        processes.free_ports(1)
