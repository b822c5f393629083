"""``mqcert`` (mqsecurity/certtool.py, docs/DEPLOY.md): one CA per cluster, member, server and
client certificates with the identities the nodes check, rotation by issuing again, refusals
that write no certificate or key."""

from __future__ import annotations

import ipaddress
import stat
from pathlib import Path

import pytest
from cryptography import x509

from mqsecurity import pki
from mqsecurity.certtool import MAX_HOSTS, main


def _cert(path: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(path.read_bytes())


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def _alt(path: Path) -> x509.SubjectAlternativeName:
    return _cert(path).extensions.get_extension_for_class(x509.SubjectAlternativeName).value


def _files(d: Path) -> set[str]:
    return {p.name for p in d.rglob("*") if p.is_file()}


@pytest.fixture
def ca_dir(tmp_path: Path) -> Path:
    d = tmp_path / "ca"
    assert main(["ca", "--dir", str(d)]) == 0
    return d


def test_a_cluster_ca_issues_member_server_and_client_certificates(
    ca_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _mode(ca_dir / "ca.key") == 0o600
    ca = _cert(ca_dir / "ca.crt")
    host_b = tmp_path / "host-b"
    argv = ["member", "--dir", str(ca_dir), "--out", str(host_b), "--group", "broker-b"]
    assert main([*argv, "--id", "n1", "--host", "10.0.0.12", "--host", "b.example"]) == 0
    member = host_b / "broker-b-n1.crt"
    assert pki.member_identity(member.read_bytes()) == pki.MemberIdentity("broker-b", "n1")
    alt = _alt(member)
    assert alt.get_values_for_type(x509.IPAddress) == [ipaddress.ip_address("10.0.0.12")]
    assert alt.get_values_for_type(x509.DNSName) == ["b.example"]
    assert _mode(host_b / "broker-b-n1.key") == 0o600
    assert main(["server", "--dir", str(ca_dir), "--host", "10.0.0.20"]) == 0
    server = ca_dir / "nameserver.crt"
    assert pki.member_identity(server.read_bytes()) is None  # can never pass for a member
    assert main(["client", "--dir", str(ca_dir), "--name", "admin"]) == 0
    assert pki.client_name((ca_dir / "client-admin.crt").read_bytes()) == "admin"
    for leaf in (member, server, ca_dir / "client-admin.crt"):
        _cert(leaf).verify_directly_issued_by(ca)  # signed by the one CA of the cluster
    capsys.readouterr()
    assert main(["show", str(member)]) == 0
    shown = capsys.readouterr().out
    assert "kind: member" in shown and "raftmq://member/broker-b/n1" in shown
    assert "10.0.0.12" in shown and "b.example" in shown


def test_a_second_ca_is_refused_and_the_first_kept(
    ca_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before = (ca_dir / "ca.key").read_bytes()
    assert main(["ca", "--dir", str(ca_dir)]) == 2
    assert "one CA per cluster" in capsys.readouterr().err
    assert (ca_dir / "ca.key").read_bytes() == before


def test_issuing_again_rotates_the_key_and_keeps_the_identity(ca_dir: Path) -> None:
    argv = ["member", "--dir", str(ca_dir), "--group", "g", "--id", "n0", "--host", "10.0.0.1"]
    assert main(argv) == 0
    first = _cert(ca_dir / "g-n0.crt")
    first_key = (ca_dir / "g-n0.key").read_bytes()
    assert main(argv) == 0
    second = _cert(ca_dir / "g-n0.crt")
    assert second.serial_number != first.serial_number
    assert (ca_dir / "g-n0.key").read_bytes() != first_key
    assert pki.member_identity((ca_dir / "g-n0.crt").read_bytes()) == pki.MemberIdentity("g", "n0")


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["member", "--group", "bad/group", "--id", "n0", "--host", "h"], "cannot be named"),
        (["member", "--group", "g", "--id", "n 0", "--host", "h"], "cannot be named"),
        (["member", "--group", "g", "--id", "n0", "--host", "a,b"], "not an address"),
        (["member", "--group", "g", "--id", "n0", *["--host", "h"] * (MAX_HOSTS + 1)], "hosts"),
        (["server", "--host", ""], "not an address"),
        (["client", "--name", "x" * 200], "cannot be named"),
    ],
)
def test_bad_requests_write_no_certificate(
    ca_dir: Path, argv: list[str], says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    before = _files(ca_dir)
    assert main([argv[0], "--dir", str(ca_dir), *argv[1:]]) == 2
    assert says in capsys.readouterr().err
    assert _files(ca_dir) == before


def test_no_ca_no_certificate(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["client", "--dir", str(tmp_path / "none"), "--name", "admin"]
    assert main(argv) == 2
    assert "mqcert:" in capsys.readouterr().err
    assert not (tmp_path / "none").exists()
