"""`mqcluster up` is secure by default: the files of a secure local group, their modes, the keys
in every config, and `--insecure` leaving today's layout unchanged. No process is started."""

from __future__ import annotations

import argparse
import json
import stat
from pathlib import Path

import pytest

from broker import config as broker_config
from mqcluster import cluster as cluster_mod
from mqcluster.cluster import LocalCluster
from mqcluster.localsecurity import NAMESRV_BIND_HOST_KEY
from mqsecurity import pki
from mqsecurity.channels import PLAINTEXT
from mqsecurity.credentials import load_credentials
from mqsecurity.options import add_security_arguments, security_from_args

# The keys of the security contract (issue #18) a secure group's broker.conf holds. The TLS
# and ACL servers add them to broker.config.KEYS; until those are merged here, the fixture
# below lets render_config accept them (it adds nothing once they are known).
CONTRACT_KEYS = (
    "tlsEnable",
    "tlsServerCertPath",
    "tlsServerKeyPath",
    "tlsServerTrustCertPath",
    "authenticationEnabled",
    "authorizationEnabled",
    "initAuthenticationUser",
    "aclEncryptionKeyPath",
)
INSECURE_FILES = {"cluster.json", "n0.conf", "n1.conf", "n2.conf", "namesrv.conf"}


@pytest.fixture
def contract_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in CONTRACT_KEYS:
        if name not in broker_config.KEYS:
            monkeypatch.setitem(
                broker_config.KEYS, name, broker_config._Key(str, "", "security contract key")
            )


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def _properties(path: Path) -> dict[str, str]:
    out = {}
    for line in path.read_text().splitlines():
        key, _, value = line.partition("=")
        out[key] = value
    return out


def test_secure_layout_and_modes(tmp_path: Path, contract_keys: None) -> None:
    c = LocalCluster(tmp_path)
    c.configure(3, auto_ports=True, namesrv=True, secure=True)
    tls = tmp_path / "tls"
    assert _mode(tls) == 0o700
    private = [tls / "ca.key", tmp_path / "admin.json", tmp_path / "acl.key"]
    private += [tls / f"broker-a-n{i}.key" for i in range(3)]
    private += [tls / "nameserver.key", tls / "client-admin.key"]
    private += [tmp_path / f"n{i}.conf" for i in range(3)]  # they hold the admin's secret
    for path in private:
        assert _mode(path) == 0o600, path
    for i in range(3):
        identity = pki.member_identity((tls / f"broker-a-n{i}.crt").read_bytes())
        assert identity is not None and (identity.group, identity.node_id) == ("broker-a", f"n{i}")
    assert pki.client_name((tls / "client-admin.crt").read_bytes()) == "admin"
    assert pki.member_identity((tls / "nameserver.crt").read_bytes()) is None
    assert len(bytes.fromhex((tmp_path / "acl.key").read_text().strip())) == 32
    admin = load_credentials(str(tmp_path / "admin.json"))
    assert admin.access_key == "admin" and len(admin.secret_key) >= 32

    n1 = _properties(tmp_path / "n1.conf")
    assert n1["tlsEnable"] == "true"
    assert n1["tlsServerCertPath"] == str(tls / "broker-a-n1.crt")
    assert n1["tlsServerKeyPath"] == str(tls / "broker-a-n1.key")
    assert n1["tlsServerTrustCertPath"] == str(tls / "ca.crt")
    assert n1["authenticationEnabled"] == n1["authorizationEnabled"] == "true"
    assert n1["aclEncryptionKeyPath"] == str(tmp_path / "acl.key")
    init_user = json.loads(n1["initAuthenticationUser"])
    assert init_user == {"username": "admin", "password": admin.secret_key}
    ns = _properties(tmp_path / "namesrv.conf")
    assert ns[NAMESRV_BIND_HOST_KEY] == "127.0.0.1"
    assert ns["tlsEnable"] == ns["brokerAuthenticationEnabled"] == "true"
    assert ns["tlsServerCertPath"] == str(tls / "nameserver.crt")
    assert "initAuthenticationUser" not in ns


def test_client_security_of_a_secure_group(tmp_path: Path, contract_keys: None) -> None:
    LocalCluster(tmp_path).configure(1, auto_ports=True, namesrv=True, secure=True)
    c = LocalCluster(tmp_path)  # read back from cluster.json
    assert c.secure
    security = c.client_security()
    assert security.tls is not None and security.tls.ca_path == str(tmp_path / "tls" / "ca.crt")
    assert security.tls.cert_path == str(tmp_path / "tls" / "client-admin.crt")
    assert security.credentials == load_credentials(str(tmp_path / "admin.json"))
    # What a tool process is handed parses back to the same, with no secret on its argv.
    parser = argparse.ArgumentParser()
    add_security_arguments(parser)
    argv = c.tool_argv()
    assert security.credentials is not None
    assert security.credentials.secret_key not in " ".join(argv)
    assert security_from_args(parser.parse_args(argv), environ={}) == security


def test_a_second_up_keeps_the_ca_the_admin_and_the_acl_key(
    tmp_path: Path, contract_keys: None
) -> None:
    LocalCluster(tmp_path).configure(3, auto_ports=True, namesrv=True, secure=True)
    kept = {p: (tmp_path / p).read_bytes() for p in ("admin.json", "acl.key", "tls/ca.crt")}
    leaf = (tmp_path / "tls" / "broker-a-n0.crt").read_bytes()
    LocalCluster(tmp_path).configure(3, auto_ports=True, namesrv=True, secure=True)
    for p, data in kept.items():
        assert (tmp_path / p).read_bytes() == data, p
    assert (tmp_path / "tls" / "broker-a-n0.crt").read_bytes() != leaf  # fresh leaves


def test_insecure_layout_is_unchanged(tmp_path: Path) -> None:
    c = LocalCluster(tmp_path)
    c.configure(3, auto_ports=True, namesrv=True)
    assert {p.name for p in tmp_path.iterdir()} == INSECURE_FILES
    for i in range(3):
        assert not set(CONTRACT_KEYS) & set(_properties(tmp_path / f"n{i}.conf"))
    # Plaintext, but still this machine only (issue #18: the local NameServer binds 127.0.0.1).
    assert _properties(tmp_path / "namesrv.conf").keys() == {
        "listenPort",
        "listenHost",
        "metricsPort",  # /metrics, on listenHost too (docs/METRICS.md)
        "remotingListenPort",  # RocketMQ 4.x clients, on listenHost too (docs/REMOTING.md)
    }
    assert _properties(tmp_path / "namesrv.conf")["listenHost"] == "127.0.0.1"
    assert not LocalCluster(tmp_path).secure
    assert c.client_security() is PLAINTEXT and c.tool_argv() == []


@pytest.mark.parametrize("insecure", [False, True])
def test_mqcluster_up_is_secure_unless_insecure(
    insecure: bool,
    tmp_path: Path,
    contract_keys: None,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setattr(LocalCluster, "up", lambda self, wait_s=30.0: "n0")
    monkeypatch.setattr(LocalCluster, "status_rows", lambda self: [])
    argv = ["--base-dir", str(tmp_path), "up", "--auto-ports"]
    assert cluster_mod.main(argv + (["--insecure"] if insecure else [])) == 0
    out = capsys.readouterr().out
    if insecure:
        assert {p.name for p in tmp_path.iterdir()} == INSECURE_FILES
        assert "security: none (--insecure)" in out
    else:
        assert (tmp_path / "admin.json").exists() and (tmp_path / "tls" / "ca.crt").exists()
        assert f"RAFTMQ_CREDENTIALS={tmp_path / 'admin.json'}" in out
        assert f"RAFTMQ_TLS_CA={tmp_path / 'tls' / 'ca.crt'}" in out
        assert load_credentials(str(tmp_path / "admin.json")).secret_key not in out
    # How to watch it in a browser, with the options that reach it (the secret stays a file).
    dashboard = next(line for line in out.splitlines() if line.startswith("dashboard: "))
    assert dashboard.startswith("dashboard: mqdashboard -n 127.0.0.1:")
    assert ("--credentials" in dashboard) is not insecure
    assert "open http://127.0.0.1:8080/" in out


def test_the_rmq5_line_offers_one_endpoint_per_client(tmp_path: Path) -> None:
    """One address per client, plaintext or TLS: the Node.js client cannot take a list (its
    gRPC target would be the comma-joined list: "Name resolution failed")."""
    from mqcluster.cluster import rmq5_line

    secure = LocalCluster(tmp_path / "s")
    secure.configure(2, auto_ports=True, secure=True)
    line = rmq5_line(secure)
    assert "TLS" in line and ";" not in line.split("per client")[1]
    assert all(n.grpc_addr in line for n in secure.nodes)
    plain = LocalCluster(tmp_path / "p")
    plain.configure(2, auto_ports=True)
    line = rmq5_line(plain)
    assert "TLS" not in line and not {";", ","} & set(line.split("every node): ")[1])
    assert line.endswith(" or ".join(n.grpc_addr for n in plain.nodes))
    # Without --auto-ports: RocketMQ 5's proxy port, 8081, for the first node, then the next.
    default = LocalCluster(tmp_path / "d")
    default.configure(3)
    line = rmq5_line(default)
    assert line.endswith(": 127.0.0.1:8081 or 127.0.0.1:8082 or 127.0.0.1:8083"), line
    assert [broker_config.load_config(n.conf).grpcServerPort for n in default.nodes] == [
        8081,
        8082,
        8083,
    ]
