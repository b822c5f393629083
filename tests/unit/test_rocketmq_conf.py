"""broker.conf and namesrv.conf as RocketMQ operators write them (issue #35): RocketMQ's keys
raftmq does not use are accepted with one warning, keys nobody knows are refused all at once
with close matches suggested, and the checks between keys say what they compared."""

from __future__ import annotations

import re

import pytest

from broker.config import (
    KEYS,
    ROCKETMQ_ONLY_KEYS,
    ConfigError,
    ignored_keys_warning,
    parse_config,
)
from prockit.properties import MAX_UNKNOWN_KEYS_NAMED, read_properties, suggestions
from prockit.rocketmq_keys import BROKER_KEYS, NAMESRV_KEYS

BASE = "dLegerPeers=n0-127.0.0.1:40911;n1-127.0.0.1:40912\ndLegerSelfId=n0\n"


class _Refused(Exception):
    pass


def _refusal(text: str) -> str:
    with pytest.raises(ConfigError) as err:
        parse_config(BASE + text, "node.conf")
    message = str(err.value)
    assert message.startswith("node.conf: ") and "\n" not in message, message
    return message


def test_the_rocketmq_table_holds_the_keys_operators_write() -> None:
    # From RocketMQ's stock broker.conf and conf/dledger/broker-n0.conf, and the docs' tables.
    for name in (
        "brokerId",
        "brokerRole",
        "sendMessageThreadPoolNums",
        "storePathCommitLog",
        "haListenPort",
        "serverWorkerThreads",
        "clientWorkerThreads",
        "transientStorePoolEnable",
    ):
        assert name in BROKER_KEYS and name in ROCKETMQ_ONLY_KEYS, name
    # raftmq's own keys with RocketMQ's names are raftmq's, not ignored.
    for name in ("fileReservedTime", "listenPort", "dLegerPeers", "diskMaxUsedSpaceRatio"):
        assert name in KEYS and name not in ROCKETMQ_ONLY_KEYS
    assert "scanNotActiveBrokerInterval" in NAMESRV_KEYS and "orderMessageEnable" in NAMESRV_KEYS


def test_rocketmq_keys_are_accepted_and_named_in_one_warning() -> None:
    cfg = parse_config(
        BASE + "sendMessageThreadPoolNums=16\nstorePathCommitLog=/x/commitlog\nbrokerRole=SYNC\n",
        "node.conf",
    )
    assert cfg.ignored_keys == ("brokerRole", "sendMessageThreadPoolNums", "storePathCommitLog")
    warning = ignored_keys_warning(cfg)
    assert warning is not None and "\n" not in warning
    assert warning.startswith(
        "node.conf: ignoring 3 RocketMQ broker key(s) raftmq does not use: brokerRole (Raft "
        "elects the leader), sendMessageThreadPoolNums, storePathCommitLog (a DLedger commitlog "
        "lives in storePathRootDir/dledger-<dLegerSelfId>"
    )
    assert ignored_keys_warning(parse_config(BASE)) is None


def test_unknown_keys_are_refused_all_at_once_with_suggestions() -> None:
    message = _refusal("fileReserveTime=48\nlistenport=1\nsendMessageThreadPoolNum=4\nzzz=1\n")
    assert message == (
        "node.conf: 4 unknown keys 'fileReserveTime' (did you mean 'fileReservedTime'?), "
        "'listenport' (did you mean 'listenPort'?), 'sendMessageThreadPoolNum' (did you mean "
        "'sendMessageThreadPoolNums'?), 'zzz' (mqbroker --help lists the keys; RocketMQ's "
        "other keys are accepted and ignored)"
    )


def test_a_file_of_junk_gives_one_bounded_line() -> None:
    junk = "".join(f"junkKey{i}=1\n" for i in range(500))
    message = _refusal(junk)
    assert "500 unknown keys" in message
    assert f"and {500 - MAX_UNKNOWN_KEYS_NAMED} more" in message
    assert message.count("'junkKey") == MAX_UNKNOWN_KEYS_NAMED
    message = _refusal("x" * 100_000 + "=1\n")
    assert len(message) < 300 and "'" + "x" * 80 + "...'" in message


def test_suggestions_prefer_own_keys_then_rocketmq_ones() -> None:
    assert suggestions("LISTENPORT", {"listenPort"}, {"x"}) == ["listenPort"]
    assert suggestions("brokerIdd", {"brokerName"}, {"brokerId"}) == ["brokerId"]
    assert suggestions("nothingLikeIt", {"listenPort"}, {"brokerId"}) == []
    props = read_properties("a=1\nb=2\n", "f", {"a"}, "t", _Refused, {"b"})
    assert (props.values, props.ignored) == ({"a": "1"}, {"b": "2"})


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        ("storePathDLedgerCommitLog=/disk2/log\n", "set storePathRootDir to move it"),
        ("aclEnable=true\n", "authenticationEnabled and authorizationEnabled"),
    ],
)
def test_rocketmq_keys_whose_ignoring_would_mislead_are_refused(extra: str, needle: str) -> None:
    assert needle in _refusal(extra)
    # Their harmless values are ignored like the rest.
    quiet = {"storePathDLedgerCommitLog": "", "aclEnable": "false"}
    name = extra.partition("=")[0]
    cfg = parse_config(BASE + f"{name}={quiet[name]}\n")
    assert cfg.ignored_keys == (name,)


def test_stock_retention_and_disk_values_start_with_derived_defaults() -> None:
    # RocketMQ's stock broker.conf: fileReservedTime=48; its defaults diskMaxUsedSpaceRatio=75,
    # diskSpaceWarningLevelRatio=0.90 (or 90: RocketMQ 5's field is a percent).
    cfg = parse_config(
        BASE + "fileReservedTime=48\ndiskMaxUsedSpaceRatio=75\ndiskSpaceWarningLevelRatio=0.80\n"
    )
    assert cfg.timerMaxDelaySec == 48 * 3600
    assert (cfg.diskMaxUsedSpaceRatio, cfg.diskSpaceWarningLevelRatio) == (75, 80)
    assert cfg.diskSpaceResumeRatio == 75
    defaults = parse_config(BASE)
    assert (defaults.timerMaxDelaySec, defaults.diskSpaceResumeRatio) == (259_200, 85)
    # The lowest mark still leaves a resume mark below it.
    assert parse_config(BASE + "diskSpaceWarningLevelRatio=10\n").diskSpaceResumeRatio == 5


def test_cross_key_refusals_say_what_they_compared_and_how_to_fix_it() -> None:
    assert _refusal("diskSpaceResumeRatio=95\n") == (
        "node.conf: key 'diskSpaceResumeRatio' must be below diskSpaceWarningLevelRatio: "
        "compared diskSpaceResumeRatio=95 (set) with diskSpaceWarningLevelRatio=90 (default); "
        "lower diskSpaceResumeRatio, or leave it out (then: diskSpaceWarningLevelRatio - 5)"
    )
    assert _refusal("timerMaxDelaySec=300000\n") == (
        "node.conf: key 'timerMaxDelaySec' must not exceed fileReservedTime in seconds "
        "(retention would delete timed messages before their delivery time): compared "
        "timerMaxDelaySec=300000 (set) with fileReservedTime=72 (default) h = 259200 s; raise "
        "fileReservedTime to at least 84, or lower timerMaxDelaySec or leave it out (then: at "
        "most fileReservedTime)"
    )
    message = _refusal("raftTickMs=200\n")
    assert re.search(
        r"compared raftHeartbeatIntervalMs=100 \(default\) with raftTickMs=200 \(set\); "
        r"raise raftHeartbeatIntervalMs or lower raftTickMs$",
        message,
    ), message
    message = _refusal("raftHeartbeatIntervalMs=400\n")
    assert "compared raftElectionTimeoutMs=500 (default) with raftHeartbeatIntervalMs=400 " in (
        message
    )
    assert "raise raftElectionTimeoutMs to at least 800" in message


def test_namesrv_conf_takes_rocketmq_keys_and_bind_address() -> None:
    from nameserver import config as ns

    cfg = ns.parse_config(
        "listenPort=9877\nrocketmqHome=/opt/rocketmq\nkvConfigPath=/x/kv.json\n"
        "serverWorkerThreads=8\nbindAddress=127.0.0.1\n",
        "namesrv.conf",
    )
    assert (cfg.listenPort, cfg.listenHost) == (9877, "127.0.0.1")
    assert cfg.ignored_keys == ("kvConfigPath", "rocketmqHome", "serverWorkerThreads")
    assert ns.ignored_keys_warning(cfg, "namesrv.conf") == (
        "namesrv.conf: ignoring 3 RocketMQ NameServer key(s) raftmq does not use: "
        "kvConfigPath, rocketmqHome, serverWorkerThreads (docs/NAMESERVER.md lists them)"
    )
    with pytest.raises(ns.ConfigError, match="'bindAddress' and 'listenHost' name the same"):
        ns.parse_config("bindAddress=127.0.0.1\nlistenHost=0.0.0.0\n")
    with pytest.raises(ns.ConfigError) as err:
        ns.parse_config("scanNotActiveBrokerIntervl=5\nlistenPrt=1\n", "n.conf")
    assert str(err.value).startswith(
        "n.conf: 2 unknown keys 'listenPrt' (did you mean 'listenPort'?), "
        "'scanNotActiveBrokerIntervl' (did you mean 'scanNotActiveBrokerInterval'?)"
    )


def test_the_docs_list_the_keys_accepted_and_ignored() -> None:
    from pathlib import Path

    from nameserver import config as ns

    docs = Path(__file__).resolve().parents[2] / "docs"
    nameserver_docs = " ".join((docs / "NAMESERVER.md").read_text(encoding="utf-8").split())
    assert all(f"`{k}`" in nameserver_docs for k in ns.ROCKETMQ_ONLY_KEYS)
    config_docs = (docs / "CONFIG.md").read_text(encoding="utf-8")
    assert all(f"`{k}`" in config_docs for k in ROCKETMQ_ONLY_KEYS)
