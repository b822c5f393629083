"""The ACL keys of broker.conf, and a node refusing to start without a usable key file."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from broker.config import ConfigError, parse_config
from broker.state.auth.secrets import generate_key_file

BASE = "dLegerPeers=n0-127.0.0.1:40911\ndLegerSelfId=n0\n"
PASSWORD = "hunter2-hunter2"


def test_defaults_are_off() -> None:
    cfg = parse_config(BASE)
    assert not cfg.authenticationEnabled and not cfg.authorizationEnabled
    assert cfg.initAuthenticationUser is None and cfg.aclEncryptionKeyPath == ""
    assert cfg.authenticationMaxClockSkewMs == 900_000


def test_keys_parse() -> None:
    init = json.dumps({"username": "admin", "password": PASSWORD})
    cfg = parse_config(
        BASE
        + "authenticationEnabled=true\nauthorizationEnabled=true\naclEncryptionKeyPath=/k\n"
        + f"initAuthenticationUser={init}\nauthenticationMaxClockSkewMs=60000\n"
    )
    assert cfg.initAuthenticationUser is not None
    assert cfg.initAuthenticationUser.access_key == "admin"
    assert cfg.authenticationMaxClockSkewMs == 60_000


@pytest.mark.parametrize(
    "extra",
    [
        "authenticationEnabled=true\n",
        "authorizationEnabled=true\n",
        'initAuthenticationUser={"username": "a", "password": "long-enough"}\n',
    ],
)
def test_a_key_file_is_required(extra: str) -> None:
    with pytest.raises(ConfigError, match="aclEncryptionKeyPath' is required"):
        parse_config(BASE + extra)


@pytest.mark.parametrize(
    "value",
    [
        "{not json " + PASSWORD,
        json.dumps({"username": "a", "password": "short"}),
        json.dumps({"username": "a b", "password": PASSWORD}),
        json.dumps({"username": "a", "password": PASSWORD, "extra": 1}),
    ],
)
def test_a_bad_init_user_is_refused_without_quoting_the_password(value: str) -> None:
    with pytest.raises(ConfigError, match="initAuthenticationUser") as info:
        parse_config(BASE + "aclEncryptionKeyPath=/k\ninitAuthenticationUser=" + value + "\n")
    assert PASSWORD not in str(info.value) and "short" not in str(info.value)


def _start(conf: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "broker", "-c", str(conf)],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_node_refuses_to_start_without_a_usable_key(tmp_path: Path) -> None:
    key = tmp_path / "acl.key"
    conf = tmp_path / "n0.conf"
    conf.write_text(
        BASE + f"storePathRootDir={tmp_path}\nauthenticationEnabled=true\n"
        f"aclEncryptionKeyPath={key}\n"
    )
    done = _start(conf)
    assert done.returncode == 2
    assert done.stderr.startswith("mqbroker: cannot open aclEncryptionKeyPath")
    generate_key_file(str(key))
    os.chmod(key, 0o640)
    done = _start(conf)
    assert done.returncode == 2 and "chmod 600" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


def test_the_nodes_own_calls_sign_as_the_inner_user() -> None:
    """A member's calls to the group's client ports (a follower's status call to its leader)
    are signed: innerClientAuthenticationCredentials, else initAuthenticationUser; unsigned
    only on a group that checks no signatures."""
    from broker.config import node_config

    init = json.dumps({"username": "admin", "password": PASSWORD})
    secure = BASE + "authenticationEnabled=true\naclEncryptionKeyPath=/k\n"
    cfg = parse_config(secure + f"initAuthenticationUser={init}\n")
    assert node_config(cfg).client_security.credentials == cfg.initAuthenticationUser
    inner = json.dumps({"accessKey": "inner", "secretKey": "inner-secret-1"})
    cfg = parse_config(secure + f"innerClientAuthenticationCredentials={inner}\n")
    creds = node_config(cfg).client_security.credentials
    assert creds is not None and creds.access_key == "inner"
    assert node_config(parse_config(BASE)).client_security.credentials is None
    with pytest.raises(ConfigError) as info:
        parse_config(secure + 'innerClientAuthenticationCredentials={"accessKey": "x"}\n')
    assert "innerClientAuthenticationCredentials" in str(info.value)
