"""mqadmin without a network: table formatting, usage errors (exit 2), --help for every
command, and a failed operation's exit code 1 with one stderr line."""

from __future__ import annotations

import argparse
import json
import os

import pytest

from client import mqadmin
from client.admin import MQAdmin, QueueProgress
from client.errors import MQClientError
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
    "copyUser": ["-f", "127.0.0.1:10911", "-t", "127.0.0.1:11011"],
    "copyAcl": ["-f", "127.0.0.1:10911", "-t", "127.0.0.1:11011"],
    "listMember": ["-b", "broker-a"],
    "addMember": ["-b", "broker-a", "-i", "n3", "-p", "127.0.0.1:40914"],
    "promoteMember": ["-a", "127.0.0.1:10911", "-i", "n3"],
    "removeMember": ["-b", "broker-a", "-i", "n3"],
    "replicaStatus": ["-b", "broker-a"],
    "setFeatureLevel": ["-b", "broker-a"],
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
