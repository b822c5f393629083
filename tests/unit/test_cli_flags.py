"""Command lines as RocketMQ users type them: a tool's global options after the subcommand
too (mqcluster, mqadmin, through ``mqcli.CommandLine``), and mqadmin taking RocketMQ's flag
letters for every command it has. Parse only; tests/integration/test_client_mqadmin.py runs
a few of them against a live group."""

from __future__ import annotations

import argparse

import pytest

from client import mqadmin
from mqcli import CommandLine, GlobalOption
from mqcluster import cluster


def test_mqcluster_base_dir_before_or_after_the_subcommand() -> None:
    parser = cluster.build_parser()
    for argv in (
        ["up", "--base-dir", "/tmp/a"],
        ["--base-dir", "/tmp/a", "up"],
        ["up", "--nodes", "5", "--base-dir", "/tmp/a"],
    ):
        assert parser.parse_args(argv).base_dir == "/tmp/a", argv
    assert parser.parse_args(["status"]).base_dir == cluster.DEFAULT_BASE_DIR
    for cmd in (["status"], ["kill", "n0"], ["start", "n1"], ["down", "--purge"]):
        assert parser.parse_args([*cmd, "--base-dir", "/x"]).base_dir == "/x", cmd


def test_mqcluster_runs_with_base_dir_after_the_subcommand(
    tmp_path: object, capsys: pytest.CaptureFixture[str]
) -> None:
    base = f"{tmp_path}/none"
    assert cluster.main(["status", "--base-dir", base]) == 1
    assert f"no cluster in {base}" in capsys.readouterr().err


def test_after_the_subcommand_wins_and_no_default_overrides() -> None:
    cli = CommandLine(
        argparse.ArgumentParser(prog="t"),
        [GlobalOption.of("-d", "--dir", default="D"), GlobalOption.of("-v", action="store_true")],
        dest="cmd",
        required=True,
    )
    cli.add("run")
    assert vars(cli.parse_args(["-d", "x", "run"])) == {"dir": "x", "v": False, "cmd": "run"}
    assert vars(cli.parse_args(["run", "-v"])) == {"dir": "D", "v": True, "cmd": "run"}
    assert cli.parse_args(["-d", "x", "run", "-d", "y"]).dir == "y"
    with pytest.raises(ValueError, match="cannot be required"):
        GlobalOption.of("--base", required=True)


@pytest.mark.parametrize("command", ["topicList", "clusterList", "nodeStatus"])
def test_mqadmin_global_options_after_any_command(command: str) -> None:
    args = mqadmin.build_parser().parse_args([command, "-n", "h:1", "--json", "-v"])
    assert (args.namesrv, args.json, args.verbose) == ("h:1", True, True)


# RocketMQ's letters, command by command: argv after the command -> the values they set.
ROCKETMQ_FLAGS: dict[str, tuple[list[str], dict[str, object]]] = {
    "updateTopic": (
        ["-t", "T", "-c", "C", "-r", "2", "-w", "3", "-p", "4"],
        {"topic": "T", "cluster": "C", "read_queues": 2, "write_queues": 3, "perm": 4},
    ),
    "deleteTopic": (["-t", "T"], {"topic": "T"}),
    "topicRoute": (["-t", "T"], {"topic": "T"}),
    "topicStatus": (["-t", "T"], {"topic": "T"}),
    "nodeStatus": (["-c", "C", "-b", "h:10911"], {"cluster": "C", "broker_addr": "h:10911"}),
    "consumerProgress": (["-g", "G", "-t", "T"], {"group": "G", "topic": "T"}),
    "queryMsgByKey": (["-t", "T", "-k", "K"], {"topic": "T", "key": "K"}),
    "queryMsgById": (["-t", "T", "-i", "ID"], {"topic": "T", "id": "ID"}),
    "resetOffsetByTime": (
        ["-g", "G", "-t", "T", "-s", "1700000000000"],
        {"group": "G", "topic": "T", "timestamp": 1700000000000},
    ),
    "sendMessage": (
        ["-t", "T", "-p", "B", "-k", "K1,K2", "-c", "TagA", "-b", "broker-a", "-i", "3"],
        {
            "topic": "T",
            "body": "B",
            "keys": "K1,K2",
            "tags": "TagA",
            "broker": "broker-a",
            "queue": 3,
        },
    ),
    "consumeMessage": (
        ["-t", "T", "-b", "broker-a", "-i", "1", "-o", "5", "-g", "G", "-c", "7"],
        {"topic": "T", "broker": "broker-a", "queue": 1, "offset": 5, "group": "G", "count": 7},
    ),
}


@pytest.mark.parametrize("command", sorted(ROCKETMQ_FLAGS))
def test_mqadmin_takes_rocketmqs_letters(command: str) -> None:
    argv, expected = ROCKETMQ_FLAGS[command]
    args = mqadmin.build_parser().parse_args(["-n", "h:1", command, *argv])
    assert {k: getattr(args, k) for k in expected} == expected


def test_mqadmin_long_forms_still_parse() -> None:
    args = mqadmin.build_parser().parse_args(
        ["sendMessage", "-t", "T", "-p", "B", "--keys", "K", "--tags", "X", "--queue", "2"]
    )
    assert (args.keys, args.tags, args.queue, args.broker) == ("K", "X", 2, "")
    old = mqadmin.build_parser().parse_args(["consumeMessage", "-t", "T", "-q", "4"])
    assert old.queue == 4


def test_queue_filter_picks_the_named_queue_or_refuses() -> None:
    from client.errors import MQClientError
    from client.message import Message, MessageQueue

    queues = [MessageQueue("T", b, q) for b in ("a", "b") for q in range(4)]
    msg = Message("T", b"x")
    assert mqadmin.QueueFilter("b", 2).select(queues, msg, None) == MessageQueue("T", "b", 2)
    assert mqadmin.QueueFilter("b", None).select(queues, msg, None).broker_name == "b"
    assert mqadmin.QueueFilter("", 3).select(queues, msg, None).queue_id == 3
    with pytest.raises(MQClientError) as exc:
        mqadmin.QueueFilter("c", 0).select(queues, msg, None)
    assert exc.value.code == "QUEUE_NOT_FOUND"
