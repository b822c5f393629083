"""The fault proxy never listens on a port promised to a group process that has not bound it yet
(a proxy link that took the NameServer's port made a CI run fail: the NameServer could not
start and the admin client reached a proxy to a broker: "Method not found")."""

from __future__ import annotations

from typing import Any

import pytest

from jepsen_like import proxy
from jepsen_like.proxy import ProxyNet


class _FakeSocket:
    def __init__(self, port: int) -> None:
        self.port = port

    def getsockname(self) -> tuple[str, int]:
        return ("127.0.0.1", self.port)


class _FakeServer:
    def __init__(self, port: int) -> None:
        self.sockets = [_FakeSocket(port)]
        self.closed = False

    def close(self) -> None:
        self.closed = True

    async def wait_closed(self) -> None:
        return None


def test_a_link_skips_promised_ports_and_closes_the_refused_draws(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The kernel's next draws, scripted: the first two are ports promised to the group.
    draws = [_FakeServer(40001), _FakeServer(40002), _FakeServer(40003)]
    handed = iter(draws)

    async def start_server(*args: Any, **kwargs: Any) -> _FakeServer:
        return next(handed)

    monkeypatch.setattr(proxy.asyncio, "start_server", start_server)
    net = proxy.ProxyNet(seed=1)
    net.start()
    try:
        port = net.add_link("l", target_port=9, avoid={40001, 40002})
    finally:
        net.stop()
    assert port == 40003
    assert [d.closed for d in draws] == [True, True, True]  # refused at once, the link at stop


def test_a_link_refuses_when_every_draw_is_promised() -> None:
    net = ProxyNet(seed=2)
    net.start()
    try:
        with pytest.raises(RuntimeError, match="no free port"):
            net.add_link("c", target_port=9, avoid=range(1, 65536))
        assert net.links["c"].listen_port == 0
    finally:
        net.stop()
