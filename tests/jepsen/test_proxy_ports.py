"""The fault proxy never listens on a port promised to a group process that has not bound it yet
(a proxy link that took the NameServer's port made a CI run fail: the NameServer could not
start and the admin client reached a proxy to a broker: "Method not found")."""

from __future__ import annotations

import pytest

from jepsen_like.proxy import ProxyNet


def test_a_link_avoids_the_ports_it_is_told() -> None:
    net = ProxyNet(seed=1)
    net.start()
    try:
        first = net.add_link("a", target_port=9)
        # Every port a draw can give, but the few the kernel hands out next, is promised away:
        # the link must come back outside the promised set or refuse; never inside it.
        promised = {first + d for d in range(-200, 200)} | {first}
        try:
            port = net.add_link("b", target_port=9, avoid=promised)
        except RuntimeError:
            return
        assert port not in promised
    finally:
        net.stop()


def test_a_link_refuses_when_every_draw_is_promised_and_leaves_nothing_bound() -> None:
    net = ProxyNet(seed=2)
    net.start()
    try:
        with pytest.raises(RuntimeError, match="no free port"):
            net.add_link("c", target_port=9, avoid=range(1, 65536))
        assert net.links["c"].listen_port == 0
    finally:
        net.stop()
