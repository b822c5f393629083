"""mqadmin without a network: table formatting, usage errors (exit 2), --help for every
command, and a failed operation's exit code 1 with one stderr line."""

from __future__ import annotations

import argparse
import json

import pytest

from client import mqadmin
from client.admin import MQAdmin, QueueProgress
from client.errors import MQClientError

COMMANDS = {
    "updateTopic": ["-t", "T"],
    "deleteTopic": ["-t", "T"],
    "topicList": [],
    "topicRoute": ["-t", "T"],
    "topicStatus": ["-t", "T"],
    "clusterList": [],
    "brokerStatus": [],
    "consumerProgress": ["-g", "G", "-t", "T"],
    "queryMsgByKey": ["-t", "T", "-k", "K"],
    "queryMsgById": ["-t", "T", "-i", "ID"],
    "resetOffsetByTime": ["-g", "G", "-t", "T", "-s", "now"],
    "sendMessage": ["-t", "T", "-p", "body"],
    "consumeMessage": ["-t", "T"],
    "createUser": ["-u", "alice", "-p", "secret-1234"],
    "updateUser": ["-u", "alice"],
    "deleteUser": ["-u", "alice"],
    "listUser": [],
    "createAcl": ["-s", "User:alice", "-r", "Topic:t", "-a", "Pub"],
    "updateAcl": ["-s", "User:alice", "-r", "Topic:t", "-a", "Pub"],
    "deleteAcl": ["-s", "User:alice"],
    "listAcl": [],
}


def test_table_is_aligned_numbers_right_text_left() -> None:
    rows = [
        {"broker": "broker-a", "queue": 0, "lag": 12345},
        {"broker": "b", "queue": 10, "lag": 0},
    ]
    assert mqadmin.format_table(rows).splitlines() == [
        "broker    queue    lag",
        "broker-a      0  12345",
        "b            10      0",
    ]


def test_table_lists_and_empty() -> None:
    assert mqadmin.format_table([]) == "(none)"
    text = mqadmin.format_table([{"keys": ["k1", "k2"], "body": "x"}])
    assert text.splitlines() == ["keys   body", "k1,k2  x"]
    assert all(line == line.rstrip() for line in text.splitlines())


def test_unknown_command_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        mqadmin.main(["-n", "127.0.0.1:1", "noSuchCommand"])
    assert exc.value.code == 2
    assert "usage: mqadmin" in capsys.readouterr().err


def test_no_command_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        mqadmin.main(["-n", "127.0.0.1:1"])
    assert exc.value.code == 2


@pytest.mark.parametrize("command", [c for c, flags in COMMANDS.items() if flags])
def test_missing_required_flag_exits_2(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        mqadmin.main(["-n", "127.0.0.1:1", command])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert f"usage: mqadmin {command}" in err and "required" in err


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_command_has_help(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        mqadmin.main([command, "--help"])
    assert exc.value.code == 0
    assert f"usage: mqadmin {command}" in capsys.readouterr().out


def test_no_namesrv_exits_2(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("NAMESRV_ADDR", raising=False)
    with pytest.raises(SystemExit) as exc:
        mqadmin.main(["topicList"])
    assert exc.value.code == 2
    assert "NAMESRV_ADDR" in capsys.readouterr().err


def test_bad_flag_values_exit_2() -> None:
    for argv in (
        ["resetOffsetByTime", "-g", "G", "-t", "T", "-s", "yesterday"],
        ["updateTopic", "-t", "T", "-p", "7"],
        ["consumeMessage", "-t", "T", "-q", "x"],
    ):
        with pytest.raises(SystemExit) as exc:
            mqadmin.main(["-n", "127.0.0.1:1", *argv])
        assert exc.value.code == 2, argv


def test_namesrv_from_env_and_flags_after_the_command(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NAMESRV_ADDR", "a:1;b:2")
    parser = mqadmin.build_parser()
    assert parser.parse_args(["topicList"]).namesrv == "a:1;b:2"
    args = parser.parse_args(["topicList", "-n", "c:3", "--json"])
    assert args.namesrv == "c:3" and args.json is True


def test_timestamp_parsing() -> None:
    assert mqadmin.parse_timestamp("1700000000000") == 1700000000000
    assert mqadmin.parse_timestamp("now") > 1700000000000
    with pytest.raises(argparse.ArgumentTypeError):
        mqadmin.parse_timestamp("-5")


def test_failed_operation_exits_1_with_one_stderr_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def fail(self: object, topic: str) -> object:
        raise MQClientError("TOPIC_NOT_EXIST", "NOT_FOUND", "TOPIC_NOT_EXIST no topic\n'T'")

    monkeypatch.setattr(MQAdmin, "topic_status", fail)
    assert mqadmin.main(["-n", "127.0.0.1:1", "topicStatus", "-t", "T"]) == 1
    out = capsys.readouterr()
    assert out.out == ""
    assert out.err == "mqadmin topicStatus: TOPIC_NOT_EXIST (NOT_FOUND): no topic 'T'\n"


def test_json_output(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    rows = [QueueProgress("broker-a", 0, 5, 3, 2), QueueProgress("broker-a", 1, 4, -1, 4)]
    monkeypatch.setattr(MQAdmin, "consumer_progress", lambda self, g, t: rows)
    assert mqadmin.main(["-n", "x:1", "--json", "consumerProgress", "-g", "G", "-t", "T"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["total_lag"] == 6
    assert doc["rows"][1] == {
        "broker": "broker-a",
        "queue": 1,
        "broker_offset": 4,
        "consumer_offset": -1,
        "lag": 4,
    }
    assert mqadmin.main(["-n", "x:1", "consumerProgress", "-g", "G", "-t", "T"]) == 0
    text = capsys.readouterr().out.splitlines()
    assert text[0].split() == ["broker", "queue", "broker_offset", "consumer_offset", "lag"]
    assert text[-1] == "total_lag: 6"
