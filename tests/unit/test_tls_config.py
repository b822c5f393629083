"""TLS keys of broker.conf, the NameServer config and NodeConfig (one clear line per mistake,
naming the key), and who a peer stream's certificate says it is (dledger.server.members)."""

from __future__ import annotations

import os
from pathlib import Path

import grpc
import pytest

from broker.config import ConfigError, node_config, parse_config
from dledger.core import ConfigError as CoreConfigError
from dledger.server.members import Refused, stream_sender
from dledger.server.node import NodeConfig
from mqsecurity import pki, refusals
from mqsecurity.tls import TlsFiles
from nameserver.config import ConfigError as NsConfigError
from nameserver.config import NameServerConfig
from nameserver.config import parse_config as parse_ns_config

BASE = "brokerName=broker-a\ndLegerPeers=n0-127.0.0.1:40911;n1-127.0.0.1:40912\ndLegerSelfId=n1\n"
PEERS = {"n0", "n1", "n2"}


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, TlsFiles]:
    d = str(tmp_path_factory.mktemp("tls"))
    ca = pki.create_authority(d)
    return {
        "n0": pki.issue_member(ca, d, "broker-a", "n0", ["127.0.0.1"]),
        "n1": pki.issue_member(ca, d, "broker-a", "n1", ["127.0.0.1"]),
        "b0": pki.issue_member(ca, d, "broker-b", "n0", ["127.0.0.1"]),
        "admin": pki.issue_client(ca, d, "admin"),
        "ns": pki.issue_server(ca, d, "nameserver", ["127.0.0.1"]),
    }


def _tls(files: TlsFiles, **over: str) -> str:
    keys = {
        "tlsEnable": "true",
        "tlsServerCertPath": files.cert_path,
        "tlsServerKeyPath": files.key_path,
        "tlsServerTrustCertPath": files.ca_path,
        **over,
    }
    return "".join(f"{k}={v}\n" for k, v in keys.items() if v is not None)


def test_a_tls_broker_config_becomes_a_tls_node(certs: dict[str, TlsFiles]) -> None:
    cfg = parse_config(BASE + _tls(certs["n1"]) + "tlsPlaintextListenPort=10999\n")
    node = node_config(cfg)
    assert node.tls == certs["n1"] and node.plaintext_client_port == 10999
    assert cfg.client_security.tls == certs["n1"]
    plain = parse_config(BASE)
    assert node_config(plain).tls is None and plain.client_security.tls is None


@pytest.mark.parametrize(
    ("over", "needle"),
    [
        ({"tlsServerCertPath": None}, "key 'tlsServerCertPath' is required with tlsEnable"),
        ({"tlsServerTrustCertPath": None}, "key 'tlsServerTrustCertPath' is required"),
        ({"tlsServerKeyPath": "/nonexistent/k.pem"}, "tlsServerKeyPath: cannot stat"),
        ({"tlsServerCertPath": "/dev/null"}, "tlsServerCertPath: /dev/null holds no PEM"),
        ({"tlsServerTrustCertPath": "/nonexistent"}, "tlsServerTrustCertPath: cannot read"),
    ],
)
def test_broker_tls_mistakes_name_their_key(
    certs: dict[str, TlsFiles], over: dict[str, str | None], needle: str
) -> None:
    with pytest.raises(ConfigError, match=needle):
        parse_config(BASE + _tls(certs["n1"], **over))  # type: ignore[arg-type]


def test_broker_certificate_must_be_this_nodes_and_match_its_key(
    certs: dict[str, TlsFiles],
) -> None:
    with pytest.raises(ConfigError, match="names raftmq://member/broker-a/n0, not this node"):
        parse_config(BASE + _tls(certs["n0"]))
    with pytest.raises(ConfigError, match="names no raftmq member"):
        parse_config(BASE + _tls(certs["admin"]))
    with pytest.raises(ConfigError, match="is not the key of tlsServerCertPath"):
        parse_config(BASE + _tls(certs["n1"], tlsServerKeyPath=str(certs["n0"].key_path)))
    with pytest.raises(ConfigError, match="tlsPlaintextListenPort' needs tlsEnable"):
        parse_config(BASE + "tlsPlaintextListenPort=10999\n")
    with pytest.raises(ConfigError, match="10911 is already used"):
        parse_config(BASE + _tls(certs["n1"]) + "tlsPlaintextListenPort=10911\n")


def test_a_key_readable_by_others_is_refused(certs: dict[str, TlsFiles], tmp_path: Path) -> None:
    key = tmp_path / "open.key"
    key.write_bytes(Path(str(certs["n1"].key_path)).read_bytes())
    os.chmod(key, 0o644)
    with pytest.raises(ConfigError, match=r"tlsServerKeyPath: key .* accessible by group"):
        parse_config(BASE + _tls(certs["n1"], tlsServerKeyPath=str(key)))


def test_nameserver_keys(certs: dict[str, TlsFiles]) -> None:
    assert NameServerConfig().listenHost == "0.0.0.0"
    ns = certs["ns"]
    cfg = parse_ns_config(
        f"listenHost=127.0.0.1\ntlsEnable=true\ntlsServerCertPath={ns.cert_path}\n"
        f"tlsServerKeyPath={ns.key_path}\ntlsServerTrustCertPath={ns.ca_path}\n"
        "brokerAuthenticationEnabled=true\n"
    )
    assert cfg.listenHost == "127.0.0.1" and cfg.tls_files is not None
    assert parse_ns_config("listenHost=localhost\n").listenHost == "localhost"
    for text, needle in (
        ("listenHost=a b\n", "'listenHost'.*not an IP address or a host name"),
        ("tlsEnable=true\n", "'tlsServerCertPath' is required with tlsEnable"),
        ("brokerAuthenticationEnabled=yes\n", "'tlsServerTrustCertPath' is required"),
        ("tlsEnable=perhaps\n", "'tlsEnable'.*not a boolean"),
        (
            f"tlsEnable=true\ntlsServerCertPath=/nonexistent\ntlsServerKeyPath={ns.key_path}\n",
            "tlsServerCertPath: cannot read /nonexistent",
        ),
    ):
        with pytest.raises(NsConfigError, match=needle):
            parse_ns_config(text)


def test_node_config_tls_checks(certs: dict[str, TlsFiles], tmp_path: Path) -> None:
    base = {
        "group": "broker-a",
        "self_id": "n1",
        "peers": {"n0": "127.0.0.1:1", "n1": "127.0.0.1:2"},
        "client_host": "127.0.0.1",
        "client_port": 3,
        "store_dir": str(tmp_path),
    }
    with pytest.raises(CoreConfigError, match="needs tls"):
        NodeConfig(**base, plaintext_client_port=4)  # type: ignore[arg-type]
    with pytest.raises(CoreConfigError, match="must differ"):
        NodeConfig(**base, tls=certs["n1"], plaintext_client_port=3)  # type: ignore[arg-type]
    with pytest.raises(CoreConfigError, match="CA of the members"):
        NodeConfig(**base, tls=TlsFiles(certs["n1"].cert_path, certs["n1"].key_path))  # type: ignore[arg-type]


def _pem(files: TlsFiles) -> bytes:
    return Path(str(files.cert_path)).read_bytes()


def _sender(pems: list[bytes], metadata: tuple[tuple[str, str], ...] = ()) -> str | Refused:
    return stream_sender({"x509_pem_cert": pems}, metadata, "broker-a", "n1", PEERS)


def test_a_peer_stream_is_its_certificates_member(certs: dict[str, TlsFiles]) -> None:
    assert _sender([_pem(certs["n0"])]) == "n0"
    md = (("x-raftmq-group", "broker-a"), ("x-raftmq-from", "n0"))
    assert _sender([_pem(certs["n0"])], md) == "n0"


@pytest.mark.parametrize(
    ("who", "metadata", "reason", "code", "text"),
    [
        (None, (), refusals.PEER_CERTIFICATE, "UNAUTHENTICATED", "NO_CERTIFICATE"),
        ("b0", (), refusals.PEER_CERTIFICATE, "PERMISSION_DENIED", "names group 'broker-b'"),
        ("admin", (), refusals.PEER_CERTIFICATE, "PERMISSION_DENIED", "names no member"),
        ("n1", (), refusals.PEER_CERTIFICATE, "PERMISSION_DENIED", "'n1', not a peer"),
        ("n0", (("x-raftmq-from", "n2"),), refusals.PEER_IDENTITY, "PERMISSION_DENIED", "n2"),
        (
            "n0",
            (("x-raftmq-group", "broker-b"),),
            refusals.PEER_IDENTITY,
            "PERMISSION_DENIED",
            "broker-b",
        ),
        ("n0", (("x-raftmq-from", "x" * 500),), refusals.PEER_IDENTITY, "PERMISSION_DENIED", "..."),
    ],
)
def test_peer_streams_are_refused_unless_the_certificate_names_a_peer(
    certs: dict[str, TlsFiles],
    who: str | None,
    metadata: tuple[tuple[str, str], ...],
    reason: str,
    code: str,
    text: str,
) -> None:
    refused = _sender([] if who is None else [_pem(certs[who])], metadata)
    assert isinstance(refused, Refused)
    assert refused.reason == reason
    assert refused.failure.status is getattr(grpc.StatusCode, code)
    assert text in refused.failure.detail and len(refused.failure.detail) < 300


def test_a_certificate_not_for_a_peer_id_is_refused(certs: dict[str, TlsFiles]) -> None:
    refused = stream_sender(
        {"x509_pem_cert": [_pem(certs["n0"])]}, (), "broker-a", "n1", {"n1", "n2"}
    )
    assert isinstance(refused, Refused) and refused.reason == refusals.PEER_CERTIFICATE
    two = stream_sender(
        {"x509_pem_cert": [_pem(certs["n0"]), _pem(certs["n0"])]}, (), "broker-a", "n1", PEERS
    )
    assert isinstance(two, Refused)


def test_the_plaintext_rmq5_port_needs_tls_and_its_own_port(certs: dict[str, TlsFiles]) -> None:
    v2 = "grpcServerPort=8081\n"
    cfg = parse_config(BASE + v2 + _tls(certs["n1"]) + "grpcServerPlaintextPort=18081\n")
    assert cfg.grpcServerPlaintextPort == 18081
    with pytest.raises(ConfigError, match="grpcServerPlaintextPort' needs tlsEnable"):
        parse_config(BASE + v2 + "grpcServerPlaintextPort=18081\n")
    with pytest.raises(ConfigError, match="grpcServerPlaintextPort' needs tlsEnable"):
        parse_config(BASE + _tls(certs["n1"]) + "grpcServerPlaintextPort=18081\n")
    for used in ("8081", "10911", "40912"):
        with pytest.raises(ConfigError, match=f"{used} is already used"):
            parse_config(BASE + v2 + _tls(certs["n1"]) + f"grpcServerPlaintextPort={used}\n")
