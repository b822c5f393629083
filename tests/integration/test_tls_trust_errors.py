"""The common TLS mistakes against a real secure group give a clear error (issue #35): mqadmin
talking to a TLS NameServer without its CA is told that the server most likely serves TLS and
which option gives the CA; with the system's CAs or another CA, that the server's certificate is
not trusted; with a wrong name, which option gives the name; TLS against a plaintext NameServer,
that it does not speak TLS. With the right CA the same command works."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import NameServerFactory

from dledger.server.client import ClientError, LogClient
from mqcluster.cluster import LocalCluster
from mqsecurity import pki
from mqsecurity.options import ENV_CREDENTIALS, ENV_TLS_CA

pytestmark = pytest.mark.integration

# What every trust message says to do: the tools' option and environment variable.
GIVE_CA = "--tls-ca FILE or RAFTMQ_TLS_CA=FILE for the tools"


def mqadmin(namesrv: str, *args: str) -> subprocess.CompletedProcess[str]:
    """``mqadmin clusterList -n namesrv ARGS`` with no security exported in the environment."""
    env = {k: v for k, v in os.environ.items() if k not in (ENV_CREDENTIALS, ENV_TLS_CA)}
    argv = [sys.executable, "-m", "client.mqadmin", "clusterList", "-n", namesrv, *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, env=env)


def refusal(namesrv: str, *args: str) -> str:
    """The one error line of a failed mqadmin run."""
    done = mqadmin(namesrv, *args)
    assert done.returncode != 0, done.stdout
    (line,) = [x for x in done.stderr.splitlines() if x.startswith("mqadmin clusterList: ")]
    return line


def test_tls_trust_mistakes_say_what_to_give(
    local_group: Callable[..., LocalCluster], name_servers: NameServerFactory, tmp_path: Path
) -> None:
    cluster = local_group(1, namesrv=True, secure=True)
    assert cluster.namesrv is not None
    addr, ca = cluster.namesrv.addr, str(cluster.layout.ca_cert)
    # The CA forgotten: plaintext to a TLS port.
    line = refusal(addr)
    assert line.startswith(
        f"mqadmin clusterList: TLS_REQUIRED (UNAVAILABLE): {addr} closed the connection as it "
        "opened: it most likely serves TLS only and this client spoke plaintext; give the CA "
        f"that signed the server's certificate: {GIVE_CA}"
    ), line
    # TLS with the system's CAs, or with another CA: the certificate is not trusted.
    other = pki.create_authority(str(tmp_path / "other-ca"), "another CA")
    for args in (["--tls"], ["--tls-ca", other.cert_path]):
        line = refusal(addr, *args)
        assert line.startswith(
            f"mqadmin clusterList: TLS_UNTRUSTED (UNAVAILABLE): the certificate of {addr} is "
            f"not trusted: no CA this client trusts signed it; give the CA that signed the "
            f"server's certificate: {GIVE_CA}"
        ), (args, line)
    # The right CA, a name the certificate does not carry.
    line = refusal(addr, "--tls-ca", ca, "--tls-server-name", "not-this-host.example")
    assert line.startswith(
        f"mqadmin clusterList: TLS_UNTRUSTED (UNAVAILABLE): the certificate of {addr} does not "
        "name the host dialled: dial a name it carries, or give that name with "
        "--tls-server-name NAME"
    ), line
    # The CA given: the command works.
    done = mqadmin(addr, "--tls-ca", ca)
    assert done.returncode == 0, done.stderr
    assert cluster.group in done.stdout
    # TLS to a plaintext NameServer.
    plain = name_servers()
    line = refusal(plain.addr, "--tls-ca", ca)
    assert line.startswith(
        f"mqadmin clusterList: TLS_NOT_SERVED (UNAVAILABLE): {plain.addr} does not speak TLS"
    ), line
    # The DLedger log client (mqjepsen, mqaudit --connect, mqcluster) says the same of a node.
    node_addr = cluster.nodes[0].client_addr
    log = LogClient([node_addr], group=cluster.group, timeout_s=10.0)
    with log, pytest.raises(ClientError) as err:
        log.metadata(node_addr)
    assert err.value.code == "TLS_REQUIRED", err.value
    assert f"{node_addr} closed the connection as it opened" in str(err.value), err.value
