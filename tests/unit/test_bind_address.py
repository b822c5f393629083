"""bindAddress and brokerIP1: where a node's ports bind is apart from what it advertises, and
an every-interface address is never advertised."""

from __future__ import annotations

import pytest

from broker.config import ConfigError, node_config, parse_config

BASE = """\
brokerName=g0
dLegerPeers=n0-10.0.0.1:40911;n1-10.0.0.2:40911;n2-10.0.0.3:40911
dLegerSelfId=n0
listenPort=10911
storePathRootDir=/tmp/rmq-bind-test
"""


def test_bind_defaults_to_the_advertised_address() -> None:
    cfg = parse_config(BASE + "brokerIP1=10.0.0.1\n")
    node = node_config(cfg)
    assert cfg.bind_host == "10.0.0.1"
    assert node.bind_addr(10911) == "10.0.0.1:10911"
    assert node.public_client_addr == "10.0.0.1:10911"


def test_every_interface_is_bound_while_a_name_is_advertised() -> None:
    cfg = parse_config(BASE + "brokerIP1=192.0.2.10\nbindAddress=0.0.0.0\n")
    node = node_config(cfg)
    # Peer port: the port of this node's dLegerPeers entry, on the bind host.
    assert node.bind_addr(40911) == "0.0.0.0:40911"
    assert node.bind_addr(node.client_port) == "0.0.0.0:10911"
    # What others are told stays the routable name.
    assert node.public_client_addr == "192.0.2.10:10911"
    assert cfg.client_addr == "192.0.2.10:10911"
    assert node.peers["n0"] == "10.0.0.1:40911"


def test_ipv6_any_is_bracketed_for_binding() -> None:
    cfg = parse_config(BASE + "brokerIP1=10.0.0.1\nbindAddress=::\n")
    assert node_config(cfg).bind_addr(10911) == "[::]:10911"


def test_the_v2_port_advertises_broker_ip1_and_binds_the_bind_address() -> None:
    cfg = parse_config(BASE + "brokerIP1=10.0.0.1\nbindAddress=0.0.0.0\ngrpcServerPort=8081\n")
    assert cfg.rmq5_addr == "10.0.0.1:8081"
    assert cfg.bind_host == "0.0.0.0"


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "[::]", "0:0:0:0:0:0:0:0"])
def test_advertising_every_interface_is_refused(host: str) -> None:
    with pytest.raises(ConfigError, match=r"brokerIP1.*every-interface address.*bindAddress"):
        parse_config(BASE + f"brokerIP1={host}\n")


@pytest.mark.parametrize(
    ("extra", "key"),
    [
        ("dLegerPeers=n0-0.0.0.0:40911;n1-10.0.0.2:40911\n", "dLegerPeers"),
        ("dLegerPeerClientAddrs=n1-0.0.0.0:10911\n", "dLegerPeerClientAddrs"),
        ("dLegerJoinAddr=0.0.0.0:40911\n", "dLegerJoinAddr"),
        ("advertisedClientAddr=0.0.0.0:9999\n", "advertisedClientAddr"),
    ],
)
def test_dialled_addresses_may_not_be_every_interface(extra: str, key: str) -> None:
    text = BASE.replace("dLegerPeers=", "#") if key == "dLegerPeers" else BASE
    with pytest.raises(ConfigError, match=rf"key .{key}..*every-interface.*bindAddress=0.0.0.0"):
        parse_config(text + extra)


@pytest.mark.parametrize("host", ["broker-0.example.net", "::1", "10.0.0"])
def test_broker_ip1_is_an_ipv4_address(host: str) -> None:
    # Message ids embed it (4 bytes): a name used to fail each send, at apply time.
    with pytest.raises(ConfigError, match=r"brokerIP1.*not an IPv4 address"):
        parse_config(BASE + f"brokerIP1={host}\n")


@pytest.mark.parametrize("bad", ["not a host!", "-x", "a b"])
def test_bind_address_must_be_an_address_or_a_name(bad: str) -> None:
    with pytest.raises(ConfigError, match="bindAddress"):
        parse_config(BASE + f"bindAddress={bad}\n")
