"""The two broker.conf keys the harness needs: ``advertisedClientAddr`` (a proxy in front of
the client port) and the test-only ``unsafeAckBeforeReplication`` (off by default)."""

from __future__ import annotations

import pytest

from broker.config import ConfigError, node_config, parse_config

BASE = "dLegerPeers=n0-127.0.0.1:40911;n1-127.0.0.1:40912\ndLegerSelfId=n0\nlistenPort=10911\n"


def test_defaults_advertise_the_bound_address_and_ack_safely() -> None:
    cfg = parse_config(BASE)
    assert cfg.client_addr == "127.0.0.1:10911"
    assert cfg.unsafeAckBeforeReplication is False
    node = node_config(cfg)
    assert node.public_client_addr == node.client_addr == "127.0.0.1:10911"
    assert node.unsafe_ack_before_replication is False


def test_advertised_address_is_what_clients_and_peers_are_told() -> None:
    cfg = parse_config(BASE + "advertisedClientAddr=127.0.0.1:5555\n")
    assert cfg.client_addr == "127.0.0.1:5555"  # registered with the NameServer
    node = node_config(cfg)
    assert node.client_addr == "127.0.0.1:10911"  # still bound here
    assert node.public_client_addr == "127.0.0.1:5555"


def test_unsafe_ack_key() -> None:
    node = node_config(parse_config(BASE + "unsafeAckBeforeReplication=true\n"))
    assert node.unsafe_ack_before_replication is True


@pytest.mark.parametrize(
    "line",
    ["advertisedClientAddr=nohost", "advertisedClientAddr=h:0", "unsafeAckBeforeReplication=maybe"],
)
def test_bad_values_are_config_errors(line: str) -> None:
    with pytest.raises(ConfigError, match=line.split("=")[0]):
        parse_config(BASE + line + "\n")
