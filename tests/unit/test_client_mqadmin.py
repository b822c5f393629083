"""mqadmin without a network: table formatting, usage errors (exit 2), --help for every
command, and a failed operation's exit code 1 with one stderr line."""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import shlex
from collections.abc import Sequence

import pytest
from mqadmin_table import compat_rows
from raftmq.broker.v1 import broker_pb2 as pb

from client import mqadmin
from client.admin import MQAdmin, QueueProgress
from client.consumer import PullResult
from client.errors import MQClientError
from client.message import MessageExt, MessageQueue
from mqsecurity import pki
from mqsecurity.channels import PLAINTEXT, ClientSecurity
from mqsecurity.credentials import Credentials, save_credentials
from mqsecurity.options import (
    ENV_CREDENTIALS,
    ENV_TLS_CA,
    add_security_arguments,
    security_argv,
    security_from_args,
)
from mqsecurity.tls import TlsFiles

COMMANDS = {
    "updateTopic": ["-t", "T"],
    "deleteTopic": ["-t", "T"],
    "topicList": [],
    "topicRoute": ["-t", "T"],
    "topicStatus": ["-t", "T"],
    "clusterList": [],
    "nodeStatus": [],
    "getBrokerConfig": [],
    "brokerStatus": [],
    "updateTopicPerm": ["-t", "T", "-p", "4"],
    "queryMsgByOffset": ["-t", "T", "-b", "broker-a", "-i", "0", "-o", "0"],
    "printMsg": ["-t", "T"],
    "consumerConnection": ["-g", "G"],
    "statsAll": [],
    "getUser": ["-u", "alice"],
    "getAcl": ["-s", "User:alice"],
    "consumerProgress": [],
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
    "copyUser": ["-f", "127.0.0.1:10911", "-t", "127.0.0.1:11011"],
    "copyAcl": ["-f", "127.0.0.1:10911", "-t", "127.0.0.1:11011"],
    "listMember": ["-b", "broker-a"],
    "addMember": ["-b", "broker-a", "-i", "n3", "-p", "127.0.0.1:40914"],
    "promoteMember": ["-a", "127.0.0.1:10911", "-i", "n3"],
    "removeMember": ["-b", "broker-a", "-i", "n3"],
    "replicaStatus": ["-b", "broker-a"],
    "setFeatureLevel": ["-b", "broker-a"],
    "updateBrokerConfig": ["-k", "topicsPerUser", "-v", "10"],
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
    def fail(self: object, topic: str, only: object = ()) -> object:
        raise MQClientError("TOPIC_NOT_EXIST", "NOT_FOUND", "TOPIC_NOT_EXIST no topic\n'T'")

    monkeypatch.setattr(MQAdmin, "topic_status", fail)
    assert mqadmin.main(["-n", "127.0.0.1:1", "topicStatus", "-t", "T"]) == 1
    out = capsys.readouterr()
    assert out.out == ""
    assert out.err == "mqadmin topicStatus: TOPIC_NOT_EXIST (NOT_FOUND): no topic 'T'\n"


def test_json_output(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    rows = [QueueProgress("broker-a", 0, 5, 3, 2), QueueProgress("broker-a", 1, 4, -1, 4)]
    monkeypatch.setattr(MQAdmin, "consumer_progress", lambda self, g, t, only=(): rows)
    assert mqadmin.main(["-n", "x:1", "--json", "consumerProgress", "-g", "G", "-t", "T"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["total_lag"] == 6
    assert doc["rows"][1] == {
        "topic": "T",
        "broker": "broker-a",
        "queue": 1,
        "broker_offset": 4,
        "consumer_offset": -1,
        "lag": 4,
    }
    assert mqadmin.main(["-n", "x:1", "consumerProgress", "-g", "G", "-t", "T"]) == 0
    text = capsys.readouterr().out.splitlines()
    assert text[0].split() == [
        "topic",
        "broker",
        "queue",
        "broker_offset",
        "consumer_offset",
        "lag",
    ]
    assert text[-1] == "total_lag: 6"


# -- security options ----------------------------------------------------------------------


@pytest.fixture
def secure_files(tmp_path, monkeypatch: pytest.MonkeyPatch):
    """A CA, a client certificate and a 0600 credentials file; no security env set."""
    monkeypatch.delenv(ENV_CREDENTIALS, raising=False)
    monkeypatch.delenv(ENV_TLS_CA, raising=False)
    ca = pki.create_authority(str(tmp_path / "tls"))
    client_files = pki.issue_client(ca, str(tmp_path / "tls"), "admin")
    creds = tmp_path / "admin.json"
    save_credentials(str(creds), Credentials("admin", "a-long-secret"))
    return ca.cert_path, client_files, str(creds)


def _security_of(argv: list[str], monkeypatch: pytest.MonkeyPatch) -> ClientSecurity:
    """The security mqadmin's main hands to MQAdmin for ``argv``."""
    seen: list[ClientSecurity] = []

    def topic_list(self: MQAdmin) -> list[str]:
        seen.append(self.security)
        return []

    monkeypatch.setattr(MQAdmin, "topic_list", topic_list)
    assert mqadmin.main(["-n", "127.0.0.1:1", *argv]) == 0
    return seen[0]


def test_security_flags_before_or_after_the_command(
    secure_files, monkeypatch: pytest.MonkeyPatch
) -> None:
    ca, client_files, creds = secure_files
    flags = ["--tls-ca", ca, "--tls-cert", client_files.cert_path]
    flags += ["--tls-key", client_files.key_path, "--credentials", creds]
    for argv in ([*flags, "topicList"], ["topicList", *flags]):
        security = _security_of(argv, monkeypatch)
        assert security.tls == TlsFiles(client_files.cert_path, client_files.key_path, ca)
        assert security.credentials == Credentials("admin", "a-long-secret")
    security = _security_of(
        ["topicList", "--access-key", "bob", "--secret-key", "bobs-key1"], monkeypatch
    )
    assert security.tls is None and security.credentials == Credentials("bob", "bobs-key1")
    assert _security_of(["topicList"], monkeypatch) == PLAINTEXT


def test_security_from_the_environment(secure_files, monkeypatch: pytest.MonkeyPatch) -> None:
    ca, _, creds = secure_files
    monkeypatch.setenv(ENV_TLS_CA, ca)
    monkeypatch.setenv(ENV_CREDENTIALS, creds)
    security = _security_of(["topicList"], monkeypatch)
    assert security.tls == TlsFiles(ca_path=ca)
    assert security.credentials is not None and security.credentials.access_key == "admin"
    # A flag wins over the environment.
    security = _security_of(
        ["topicList", "--access-key", "bob", "--secret-key", "bobs-key1"], monkeypatch
    )
    assert security.credentials is not None and security.credentials.access_key == "bob"


@pytest.mark.parametrize(
    ("argv", "reason"),
    [
        (["--access-key", "bob"], "go together"),
        (["--secret-key", "bobs-key1"], "go together"),
        (["--tls-cert", "{cert}"], "go together"),
        (
            ["--credentials", "{creds}", "--access-key", "a", "--secret-key", "bobs-key1"],
            "not both",
        ),
        (["--credentials", "{loose}"], "chmod 600"),
        (["--credentials", "{missing}"], "cannot open"),
        (["--tls-ca", "{missing}"], "cannot read"),
        (["--tls-server-name", "x"], "needs TLS"),
        (["--access-key", "bad key!", "--secret-key", "bobs-key1"], "access key may hold"),
    ],
)
def test_bad_security_options_exit_2_saying_why(
    argv: list[str],
    reason: str,
    secure_files,
    tmp_path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    _, client_files, creds = secure_files
    loose = tmp_path / "loose.json"
    loose.write_text('{"accessKey": "admin", "secretKey": "a-long-secret"}')
    os.chmod(loose, 0o644)
    names = {
        "cert": client_files.cert_path,
        "creds": creds,
        "loose": str(loose),
        "missing": str(tmp_path / "nope"),
    }
    argv = [a.format(**names) for a in argv]
    with pytest.raises(SystemExit) as exc:
        mqadmin.main(["-n", "127.0.0.1:1", "topicList", *argv])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert reason in err
    assert "a-long-secret" not in err and "bobs-key1" not in err


def test_security_argv_reaches_the_same_group(secure_files) -> None:
    """What a tool passes to its load-generator processes parses back to the same security."""
    ca, client_files, creds = secure_files
    files = TlsFiles(client_files.cert_path, client_files.key_path, ca)
    parser = argparse.ArgumentParser()
    add_security_arguments(parser)
    argv = security_argv(files, creds, "localhost")
    assert "a-long-secret" not in " ".join(argv)
    security = security_from_args(parser.parse_args(argv), environ={})
    assert security == ClientSecurity(files, Credentials("admin", "a-long-secret"), "localhost")
    fallback = ClientSecurity(tls=TlsFiles(ca_path=ca))
    assert security_from_args(parser.parse_args([]), environ={}, fallback=fallback) is fallback


def test_rocketmq_date_format_is_local_time() -> None:
    # RocketMQ's yyyy-MM-dd#HH:mm:ss:SSS, read in the local time zone as its tools read it.
    local = datetime.datetime(2024, 2, 29, 13, 14, 15, 678000)
    want = int(local.timestamp() * 1000)
    assert mqadmin.parse_timestamp("2024-02-29#13:14:15:678") == want
    for bad in ("2024-02-30#13:14:15:678", "2024-02-29 13:14:15", "x" * 100, "TagA"):
        with pytest.raises(argparse.ArgumentTypeError):
            mqadmin.parse_timestamp(bad)


def _subcommands() -> dict[str, argparse.ArgumentParser]:
    parser = mqadmin.build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def test_docs_table_letters_are_the_parsers() -> None:
    """Every command of docs/CLIENT.md's RocketMQ table exists, and every RocketMQ letter
    listed for it is an option of it (a refused command takes them all unparsed)."""
    subs = _subcommands()
    for row in compat_rows():
        assert row.command in subs, row.command
        if row.command in mqadmin.REFUSED_COMMANDS:
            assert all(r.refused for r in row.runs), row.command
            continue
        options = subs[row.command]._option_string_actions
        missing = [letter for letter in row.letters if letter not in options]
        assert not missing, f"{row.command} does not take {missing}"


def test_docs_table_refused_runs_exit_2_offline(capsys: pytest.CaptureFixture[str]) -> None:
    """Refusals happen before any network call: each refused run of the table exits 2 with
    the reason (never argparse's unrecognized or missing arguments)."""
    fill = re.compile(r"\{(\w+)\}")
    for row in compat_rows():
        for run in row.runs:
            if not run.refused:
                continue
            argv = shlex.split(fill.sub("x", run.line))
            code: object
            try:
                code = mqadmin.main(["-n", "127.0.0.1:1", *argv])
            except SystemExit as exc:
                code = exc.code
            err = capsys.readouterr().err
            assert code == 2, (run.line, err)
            assert "raftmq" in err or "refused" in err, (run.line, err)
            assert "unrecognized" not in err and "required" not in err, (run.line, err)


def test_consume_message_s_is_a_time_not_a_tag_expression() -> None:
    args = mqadmin.build_parser().parse_args(
        ["consumeMessage", "-t", "T", "-s", "1700000000000", "-e", "2023-11-14#22:13:20:000"]
    )
    assert (args.begin, args.subexpr) == (1700000000000, "*")
    assert args.end == mqadmin.parse_timestamp("2023-11-14#22:13:20:000")
    with pytest.raises(SystemExit):
        mqadmin.build_parser().parse_args(["consumeMessage", "-t", "T", "-s", "TagA"])


class _FakeQueueConsumer:
    """One queue whose message i was stored at 1000 + 10 * i ms (a PullConsumer's pull and
    search_offset, nothing else)."""

    def __init__(self, n: int) -> None:
        self.times = [1000 + 10 * i for i in range(n)]

    def search_offset(self, mq: object, timestamp_ms: int) -> int:
        return next((i for i, t in enumerate(self.times) if t >= timestamp_ms), len(self.times))

    def pull(self, mq: MessageQueue, offset: int, max_nums: int, expression: str) -> PullResult:
        if offset >= len(self.times):
            return PullResult("NO_NEW_MSG", [], offset, 0, len(self.times))
        stop = min(offset + max_nums, len(self.times))
        msgs = [_stored(mq, i, self.times[i]) for i in range(offset, stop)]
        return PullResult("FOUND", msgs, stop, 0, len(self.times))


def _stored(mq: MessageQueue, offset: int, store_ms: int) -> MessageExt:
    return MessageExt(
        mq.topic, b"", "", (), {}, f"id{offset}", "", mq.broker_name, mq.queue_id, offset, 0,
        store_ms, store_ms, 0,
    )  # fmt: skip


def test_pull_window_begins_at_a_time_and_ends_at_one() -> None:
    consumer = _FakeQueueConsumer(100)
    q = [MessageQueue("T", "b", 0)]

    def offsets(window: tuple[int | None, int | None, int | None], count: int) -> list[int]:
        got = mqadmin.pull_window(consumer, q, window, count)  # type: ignore[arg-type]
        return [m.queue_offset for m in got]

    assert offsets((None, 1205, None), 3) == [21, 22, 23]  # -s: the first at or after
    assert offsets((None, None, 1020), 10) == [0, 1, 2]  # -e: none stored after
    assert offsets((None, 1500, 1990), 1000) == list(range(50, 100))
    assert offsets((60, 1205, None), 2) == [60, 61]  # -o beyond the time wins
    assert offsets((None, 2000, None), 5) == []  # after the last message


def test_update_broker_config_help_names_the_live_keys_and_the_restart(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit):
        mqadmin.main(["updateBrokerConfig", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for key in ("diskSpaceWarningLevelRatio", "scrubBytesPerSec", "dedupWindowSeconds"):
        assert key in text
    assert "every other key needs a restart: edit broker.conf on every node" in text


@pytest.mark.parametrize(
    ("argv", "reason"),
    [
        (["clusterRT", "-a", "1001"], "outside 1..1000 (messages per group)"),
        (["clusterRT", "-a", "0"], "outside 1..1000"),
        (["clusterRT", "-s", str(64 * 1024 + 1)], "outside 1..65536 (bytes per message)"),
        (["clusterRT", "-i", "3601"], "outside 0..3600 (seconds between rounds)"),
        (["clusterRT", "--rounds", "101"], "outside 1..100 (rounds)"),
        (["clusterRT", "-p", "maybe"], "expected true or false"),
        (["consumerStatus", "-g", "g", "-s"], "not taken by raftmq: a broker cannot take"),
        (["producerConnection", "-g", "g"], "-t/--topic"),
    ],
)
def test_client_commands_bound_their_letters_offline(
    argv: list[str], reason: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """clusterRT's caps, consumerStatus's -s and producerConnection's required -t: usage
    errors (exit 2) before any call."""
    with pytest.raises(SystemExit) as exc:
        mqadmin.main(["-n", "127.0.0.1:1", *argv])
    assert exc.value.code == 2
    assert reason in capsys.readouterr().err


def _conn(
    client_id: str, protocol: str, age_ms: int, locks: Sequence[tuple[str, int]] = ()
) -> pb.ClientConnection:
    return pb.ClientConnection(
        client_id=client_id,
        protocol=protocol,
        last_heartbeat_age_ms=age_ms,
        subscriptions=[pb.Subscription(topic="T", expression="*")],
        locked_queues=[pb.QueueRef(topic=t, queue_id=q) for t, q in locks],
    )


def test_consumer_status_keeps_clients_apart_and_every_groups_locks(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """One host process runs a raftmq consumer and a RocketMQ 5 one under the same id
    (ip@pid): both are listed. An orderly consumer's locks on every broker group are shown,
    not only those of the group that heard from it last."""
    same = "10.0.0.7@4242"
    answers = {
        "broker-a": [_conn(same, "v1", 30, [("T", 0)]), _conn(same, "v2", 10)],
        "broker-b": [_conn(same, "v1", 5, [("T", 1)])],
    }
    monkeypatch.setattr(
        MQAdmin, "consumer_connections", lambda self, g, cluster="", broker_addr="": answers
    )
    rows = [QueueProgress("broker-a", 0, 5, 3, 2), QueueProgress("broker-b", 1, 4, 1, 3)]
    monkeypatch.setattr(MQAdmin, "consumer_progress", lambda self, g, t, only=(): rows)
    assert mqadmin.main(["-n", "x:1", "--json", "consumerStatus", "-g", "G"]) == 0
    doc = json.loads(capsys.readouterr().out)
    clients = [(c["client_id"], c["protocol"], c["locked_queues"]) for c in doc["clients"]]
    assert clients == [
        (same, "v1", ["broker-a/T/0", "broker-b/T/1"]),
        (same, "v2", []),
    ]
    assert doc["clients"][0]["heartbeat_age_ms"] == 5  # as the freshest broker group knows it
    assert [(q["broker"], q["locked_by"]) for q in doc["queues"]] == [
        ("broker-a", same),
        ("broker-b", same),
    ]
