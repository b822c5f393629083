"""broker.conf parsing: RocketMQ keys, strict validation, one clear line per mistake."""

from __future__ import annotations

from pathlib import Path

import pytest

from broker.config import (
    ConfigError,
    load_config,
    node_config,
    parse_config,
    parse_peers,
    render_config,
)

GOOD = """\
brokerClusterName = DefaultCluster
brokerName=RaftNode00
enableDLegerCommitLog=true
dLegerGroup=RaftNode00
dLegerPeers=n0-127.0.0.1:40911;n1-127.0.0.1:40912;n2-127.0.0.1:40913
## must be unique
dLegerSelfId=n1
listenPort=10921
storePathRootDir=/tmp/rmqstore/node01
flushDiskType=ASYNC_FLUSH
"""


def test_good_config_with_rocketmq_keys() -> None:
    cfg = parse_config(GOOD)
    assert cfg.brokerName == "RaftNode00"
    assert [p.node_id for p in cfg.dLegerPeers] == ["n0", "n1", "n2"]
    assert cfg.self_peer.port == 40912
    assert cfg.listenPort == 10921
    assert cfg.flushDiskType.name == "ASYNC_FLUSH"
    assert cfg.maxMessageSize == 4 * 1024 * 1024
    assert cfg.autoCreateTopicEnable is False
    assert str(cfg.dledger_dir) == "/tmp/rmqstore/node01/dledger-n1"


def test_namesrv_addr_and_register_period() -> None:
    cfg = parse_config(GOOD)
    assert (cfg.namesrvAddr, cfg.namesrv_addrs, cfg.registerBrokerPeriod) == ("", [], 30_000)
    cfg = parse_config(GOOD + "namesrvAddr= a:9876 ; b:9877;\nregisterBrokerPeriod=1000\n")
    assert cfg.namesrv_addrs == ["a:9876", "b:9877"]
    assert cfg.registerBrokerPeriod == 1000


def test_the_log_index_file_size_reaches_the_store() -> None:
    """32 MiB by default (512 Ki records of 64 bytes: docs/FORMAT.md, index format 2);
    smaller files take less disk at start."""
    assert node_config(parse_config(GOOD)).store.index_segment_size_bytes == 32 << 20
    cfg = parse_config(GOOD + "mappedFileSizeEntryIndex=1048576\n")
    assert node_config(cfg).store.index_segment_size_bytes == cfg.mappedFileSizeEntryIndex
    assert cfg.mappedFileSizeEntryIndex == 1 << 20


def test_defaults_group_to_broker_name_and_sync_flush() -> None:
    cfg = parse_config("dLegerPeers=n0-127.0.0.1:40911\ndLegerSelfId=n0\nbrokerName=b\n")
    assert cfg.dLegerGroup == "b"
    assert cfg.flushDiskType.name == "SYNC_FLUSH"


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        ("listenPortt=1\n", "unknown key 'listenPortt'"),
        ("listenPort=abc\n", "key 'listenPort': 'abc' is not an integer"),
        ("listenPort=70000\n", "key 'listenPort': '70000' is out of range"),
        ("flushDiskType=SOMETIMES\n", "key 'flushDiskType'"),
        ("autoCreateTopicEnable=maybe\n", "key 'autoCreateTopicEnable'"),
        ("deleteWhen=25\n", "key 'deleteWhen'"),
        ("enableDLegerCommitLog=false\n", "key 'enableDLegerCommitLog' must be true"),
        ("preferredLeaderId=n9\n", "key 'preferredLeaderId'"),
        ("listenPort=40911\n", "is a peer port"),
        ("brokerName=x\n", "key 'brokerName' is set twice"),
        ("namesrvAddr=localhost:99999\n", "key 'namesrvAddr'"),
        ("namesrvAddr=::1\n", "write an IPv6 address in brackets"),
        ("namesrvAddr=a:1;a:1\n", "repeats an address"),
        ("registerBrokerPeriod=10\n", "key 'registerBrokerPeriod': '10' is out of range"),
        ("snapshotTransferBytesPerSec=1000\n", "key 'snapshotTransferBytesPerSec'"),
        ("mappedFileSizeEntryIndex=32768\n", "key 'mappedFileSizeEntryIndex': '32768' is out"),
        ("mappedFileSizeEntryIndex=100000\n", "is not a multiple of 65536"),
    ],
)
def test_each_mistake_names_its_key(extra: str, needle: str) -> None:
    with pytest.raises(ConfigError) as err:
        base = GOOD.replace("listenPort=10921\n", "").replace("enableDLegerCommitLog=true\n", "")
        parse_config(base + extra, "node.conf")
    message = str(err.value)
    assert needle in message
    assert message.startswith("node.conf: ")
    assert "\n" not in message


def test_self_id_must_be_a_peer() -> None:
    with pytest.raises(ConfigError, match="'dLegerSelfId': 'n7' is not in dLegerPeers"):
        parse_config(GOOD.replace("dLegerSelfId=n1", "dLegerSelfId=n7"))


def test_required_keys() -> None:
    with pytest.raises(ConfigError, match="key 'dLegerPeers' is required"):
        parse_config("dLegerSelfId=n0\n")


@pytest.mark.parametrize(
    "peers",
    ["n0", "n0-127.0.0.1", "n0-127.0.0.1:x", "n0-a:1;n0-b:2", "n0-a:1;n1-a:1", ";;"],
)
def test_bad_peer_lists(peers: str) -> None:
    with pytest.raises(ValueError):
        parse_peers(peers)


def test_unreadable_and_binary_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "missing.conf")
    bad = tmp_path / "bin.conf"
    bad.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(ConfigError, match="not UTF-8"):
        load_config(bad)


def test_render_round_trips(tmp_path: Path) -> None:
    text = render_config(
        {"dLegerPeers": "n0-127.0.0.1:1;n1-127.0.0.1:2", "dLegerSelfId": "n1", "listenPort": 3}
    )
    path = tmp_path / "b.conf"
    path.write_text(text)
    assert load_config(path).listenPort == 3
    with pytest.raises(ConfigError):
        render_config({"nope": 1})


def test_grpc_server_port_is_off_by_default_and_must_not_reuse_a_port() -> None:
    assert parse_config(GOOD).grpcServerPort == 0
    assert parse_config(GOOD + "grpcServerPort=8081\n").grpcServerPort == 8081
    for clash in ("10921", "40913", "70000", "-1"):
        with pytest.raises(ConfigError, match="grpcServerPort"):
            parse_config(GOOD + f"grpcServerPort={clash}\n")


def test_timed_messages_may_not_outlive_retention() -> None:
    # A timed message waits in the commitlog until its time: retention must keep it that long.
    # RocketMQ's defaults (72 h and 3 days) are equal: allowed.
    cfg = parse_config(GOOD)
    assert cfg.timerMaxDelaySec == cfg.fileReservedTime * 3600 == 259_200
    assert parse_config(GOOD + "fileReservedTime=1\ntimerMaxDelaySec=3600\n").timerMaxDelaySec
    # Left out, timerMaxDelaySec follows a shorter retention down (RocketMQ's stock 48 h).
    assert parse_config(GOOD + "fileReservedTime=24\n").timerMaxDelaySec == 24 * 3600
    for extra in ("fileReservedTime=24\ntimerMaxDelaySec=86401\n", "timerMaxDelaySec=259201\n"):
        with pytest.raises(ConfigError) as err:
            parse_config(GOOD + extra, "node.conf")
        message = str(err.value)
        assert message.startswith("node.conf: key 'timerMaxDelaySec'")
        assert "fileReservedTime" in message and "\n" not in message


def test_the_peer_socket_port_is_off_by_default_reaches_the_node_and_must_not_reuse_a_port() -> (
    None
):
    from broker.config import node_config

    cfg = parse_config(GOOD)
    assert (cfg.dLegerPeerSocketPort, cfg.dLegerPeerSocketEnable) == (0, True)
    node = node_config(parse_config(GOOD + "dLegerPeerSocketPort=41012\n"))
    assert (node.peer_socket_port, node.peer_socket_enable) == (41012, True)
    off = node_config(parse_config(GOOD + "dLegerPeerSocketEnable=false\n"))
    assert off.peer_socket_enable is False
    for clash in ("10921", "40912", "40913", "70000", "-1"):  # client, own and others' peer
        with pytest.raises(ConfigError, match="dLegerPeerSocketPort"):
            parse_config(GOOD + f"dLegerPeerSocketPort={clash}\n")
