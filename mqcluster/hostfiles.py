"""``mqcluster hosts``: every file a cluster on several hosts needs, from one layout file.

    mqcluster hosts --layout cluster.json --out DIR

The layout (JSON) names the hosts of each process; node ids are ``n0``, ``n1``... in order::

    {"cluster": "DefaultCluster",                      (optional)
     "namesrvs": ["10.0.0.1", "10.0.0.2"],
     "groups": {"broker-a": ["10.0.0.11", "10.0.0.12", "10.0.0.13"],
                "broker-b": ["10.0.0.21", "10.0.0.22", "10.0.0.23"]},
     "bindAddress": "0.0.0.0",                         (optional; default: each brokerIP1)
     "settings": {"fileReservedTime": "48"}}           (optional, more broker.conf keys)

It writes, under DIR:

- ``ca/``: the cluster's CA (``ca.key`` never leaves the admin machine) and the admin's
  files: ``admin.json`` (the first Super user's credentials), its client certificate;
- ``acl.key``: the key sealing users' secrets (the same on every broker);
- one directory per process, to copy to its host as it is: ``namesrv-<i>/`` (namesrv.conf)
  and ``<group>-<id>/`` (broker.conf, 0600: it holds the admin's first secret); each with
  ``tls/`` (ca.crt and its own certificate and key, from the cluster's CA, the same code as
  ``mqcert``) and ``command``: the one line that starts it (``mqnamesrv -c ...`` /
  ``mqbroker -c ...``, with ``--log-file`` in the directory). Paths inside are DIR's; a
  directory copied elsewhere keeps working when DIR's path is the same there (or edit them).

Run again with more groups in the layout (a group added to the cluster): the CA, the admin and
the ACL key are kept, the existing processes' directories are left as they are, and only the
new ones are written. Ports are RocketMQ's (each process has a host of its own): brokers 10911
(client), 40911 (peer), 41011 (peer socket), 8081 (RocketMQ 5), 10912 (RocketMQ 4.x remoting),
5557 (metrics);
NameServers 9876, 9877 (remoting: 4.x clients' namesrvAddr), metrics 5556. The remoting ports
serve TLS and, on a broker, the same users and ACLs as every other port (docs/REMOTING.md); a
layout's ``settings`` may turn a broker's off (``"remotingListenPort": "0"``).
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
import secrets
import shlex
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from broker.config import ConfigError, parse_config, render_config
from mqcluster.cluster import ClusterError
from mqsecurity import pki
from mqsecurity.credentials import (
    Credentials,
    load_credentials,
    save_credentials,
    write_private_file,
)

CLIENT_PORT = 10911
PEER_PORT = 40911
# The peer socket (dLegerPeerSocketPort, docs/RAFT.md "Peer sockets"): the peer port + 100, as
# mqcluster's local layout gives it (cluster.SOCKET_PORT_OFFSET).
PEER_SOCKET_PORT = PEER_PORT + 100
GRPC_PORT = 8081
METRICS_PORT = 5557
# RocketMQ 4.x clients (docs/REMOTING.md): RocketMQ's brokers take 10911 for it, the client
# port here, so the next port, as mqcluster's local layout does; the NameServer's next to its
# gRPC 9876 (RocketMQ's remoting port there), as mqcluster's NAMESRV_REMOTING_PORT.
REMOTING_PORT = CLIENT_PORT + 1
NAMESRV_PORT = 9876
NAMESRV_REMOTING_PORT = NAMESRV_PORT + 1
NAMESRV_METRICS_PORT = 5556
# Bounds of a layout: a group has at most 7 members (mqcluster.cluster.MAX_NODES), a cluster
# at most 64 groups and 7 NameServers here (far above what one admin machine plans at once).
MAX_GROUP_NODES = 7
MAX_GROUPS = 64
MAX_NAMESRVS = 7
MAX_LAYOUT_BYTES = 1 << 20
MAX_SETTINGS = 64
ADMIN_USER = "admin"
ADMIN_SECRET_BYTES = 24
ACL_KEY_BYTES = 32
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}")
# Keys the tool writes itself: a layout's settings may not set them.
_OWN_KEYS = frozenset(
    {
        "brokerClusterName",
        "brokerName",
        "dLegerGroup",
        "dLegerSelfId",
        "dLegerPeers",
        "dLegerPeerClientAddrs",
        "brokerIP1",
        "namesrvAddr",
        "initAuthenticationUser",
        "aclEncryptionKeyPath",
    }
)


@dataclass(frozen=True, slots=True)
class Layout:
    cluster: str
    namesrvs: tuple[str, ...]
    groups: Mapping[str, tuple[str, ...]]
    bind_address: str
    settings: Mapping[str, str]

    @property
    def namesrv_addr(self) -> str:
        return ";".join(f"{h}:{NAMESRV_PORT}" for h in self.namesrvs)

    @property
    def remoting_namesrv_addr(self) -> str:
        """What a RocketMQ 4.x client is given as its ``namesrvAddr``."""
        return ";".join(f"{h}:{NAMESRV_REMOTING_PORT}" for h in self.namesrvs)


def _ipv4(value: object, where: str) -> str:
    try:
        address = ipaddress.ip_address(str(value))
    except ValueError:
        raise ClusterError(f"layout: {where}: {value!r} is not an IP address") from None
    if address.version != 4 or address.is_unspecified:
        raise ClusterError(f"layout: {where}: {value!r} is not a routable IPv4 address")
    return str(address)


def parse_layout(text: str) -> Layout:
    """The layout file's content, checked (one line naming the problem otherwise)."""
    if len(text) > MAX_LAYOUT_BYTES:
        raise ClusterError(f"layout: larger than {MAX_LAYOUT_BYTES} bytes")
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise ClusterError(f"layout: not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ClusterError("layout: a JSON object is expected")
    unknown = set(data) - {"cluster", "namesrvs", "groups", "bindAddress", "settings"}
    if unknown:
        raise ClusterError(f"layout: unknown keys {sorted(unknown)}")
    cluster = str(data.get("cluster", "DefaultCluster"))
    if not _NAME.fullmatch(cluster):
        raise ClusterError(f"layout: cluster {cluster!r}: 1-64 letters, digits, '-', '_'")
    namesrvs = data.get("namesrvs")
    if not isinstance(namesrvs, list) or not 1 <= len(namesrvs) <= MAX_NAMESRVS:
        raise ClusterError(f"layout: namesrvs: a list of 1 to {MAX_NAMESRVS} addresses")
    groups = data.get("groups")
    if not isinstance(groups, dict) or not 1 <= len(groups) <= MAX_GROUPS:
        raise ClusterError(f"layout: groups: an object of 1 to {MAX_GROUPS} groups")
    parsed: dict[str, tuple[str, ...]] = {}
    for name, hosts in groups.items():
        if not _NAME.fullmatch(name) or name.startswith("namesrv"):
            raise ClusterError(f"layout: group {name!r}: 1-64 letters, digits, '-', '_'")
        if not isinstance(hosts, list) or not 1 <= len(hosts) <= MAX_GROUP_NODES:
            raise ClusterError(f"layout: group {name}: a list of 1 to {MAX_GROUP_NODES} hosts")
        parsed[name] = tuple(_ipv4(h, f"group {name}") for h in hosts)
    bind = str(data.get("bindAddress", ""))
    if bind:
        try:
            ipaddress.ip_address(bind)
        except ValueError:
            raise ClusterError(f"layout: bindAddress {bind!r} is not an IP address") from None
    settings = data.get("settings", {})
    if not isinstance(settings, dict) or len(settings) > MAX_SETTINGS:
        raise ClusterError(f"layout: settings: an object of at most {MAX_SETTINGS} keys")
    own = sorted(set(settings) & _OWN_KEYS)
    if own:
        raise ClusterError(f"layout: settings: {own} are written by the tool")
    return Layout(
        cluster,
        tuple(_ipv4(h, "namesrvs") for h in namesrvs),
        parsed,
        bind,
        {str(k): str(v) for k, v in settings.items()},
    )


@dataclass(frozen=True, slots=True)
class Written:
    """What one run wrote: the process directories made now, and those kept; the NameServer
    addresses the clients are given (raftmq's and RocketMQ 5's tools, and 4.x clients')."""

    made: list[str]
    kept: list[str]
    namesrv_addr: str = ""
    remoting_namesrv_addr: str = ""


class HostFiles:
    """The files of ``layout`` under ``out`` (see the module's docstring)."""

    def __init__(self, layout: Layout, out: Path) -> None:
        self.layout = layout
        self.out = out.resolve()
        self.ca_dir = self.out / "ca"

    def write(self) -> Written:
        ca, admin = self._cluster_secrets()
        made: list[str] = []
        kept: list[str] = []
        for i, host in enumerate(self.layout.namesrvs):
            name = f"namesrv-{i}"
            (kept if (self.out / name).exists() else made).append(name)
            if name in made:
                self._namesrv(ca, name, host)
        for group, hosts in self.layout.groups.items():
            for i in range(len(hosts)):
                name = f"{group}-n{i}"
                if (self.out / name).exists():
                    kept.append(name)
                    continue
                self._broker(ca, admin, group, i)
                made.append(name)
        return Written(made, kept, self.layout.namesrv_addr, self.layout.remoting_namesrv_addr)

    def _cluster_secrets(self) -> tuple[pki.Authority, Credentials]:
        admin_file = self.ca_dir / "admin.json"
        if (self.ca_dir / "ca.key").exists():
            return pki.load_authority(str(self.ca_dir)), load_credentials(str(admin_file))
        self.out.mkdir(parents=True, exist_ok=True)
        ca = pki.create_authority(str(self.ca_dir), f"raftmq {self.layout.cluster} CA")
        os.chmod(self.ca_dir, 0o700)
        admin = Credentials(ADMIN_USER, secrets.token_urlsafe(ADMIN_SECRET_BYTES))
        save_credentials(str(admin_file), admin)
        pki.issue_client(ca, str(self.ca_dir), ADMIN_USER)
        key = secrets.token_hex(ACL_KEY_BYTES).encode() + b"\n"
        write_private_file(str(self.out / "acl.key"), key)
        return ca, admin

    def _process_dir(self, name: str) -> tuple[Path, Path]:
        d = self.out / name
        tls = d / "tls"
        tls.mkdir(parents=True, mode=0o700)
        (tls / "ca.crt").write_bytes((self.ca_dir / "ca.crt").read_bytes())
        return d, tls

    def _namesrv(self, ca: pki.Authority, name: str, host: str) -> None:
        d, tls = self._process_dir(name)
        files = pki.issue_server(ca, str(tls), "nameserver", [host])
        conf = {
            "listenPort": NAMESRV_PORT,
            "remotingListenPort": NAMESRV_REMOTING_PORT,
            "listenHost": self.layout.bind_address or host,
            "metricsPort": NAMESRV_METRICS_PORT,
            "tlsEnable": "true",
            "tlsServerCertPath": files.cert_path,
            "tlsServerKeyPath": files.key_path,
            "tlsServerTrustCertPath": str(tls / "ca.crt"),
            "brokerAuthenticationEnabled": "true",
        }
        (d / "namesrv.conf").write_text("".join(f"{k}={v}\n" for k, v in conf.items()))
        _write_command(d, ["mqnamesrv", "-c", str(d / "namesrv.conf")], "namesrv.log")

    def _broker(self, ca: pki.Authority, admin: Credentials, group: str, i: int) -> None:
        hosts = self.layout.groups[group]
        node_id = f"n{i}"
        d, tls = self._process_dir(f"{group}-{node_id}")
        files = pki.issue_member(ca, str(tls), group, node_id, [hosts[i]])
        init_user = json.dumps({"username": admin.access_key, "password": admin.secret_key})
        acl_key = d / "acl.key"
        write_private_file(str(acl_key), (self.out / "acl.key").read_bytes())
        values: dict[str, Any] = {
            "brokerClusterName": self.layout.cluster,
            "brokerName": group,
            "enableDLegerCommitLog": "true",
            "dLegerGroup": group,
            "dLegerSelfId": node_id,
            "dLegerPeers": ";".join(f"n{k}-{h}:{PEER_PORT}" for k, h in enumerate(hosts)),
            "dLegerPeerClientAddrs": ";".join(
                f"n{k}-{h}:{CLIENT_PORT}" for k, h in enumerate(hosts)
            ),
            "brokerIP1": hosts[i],
            "listenPort": CLIENT_PORT,
            "grpcServerPort": GRPC_PORT,
            "remotingListenPort": REMOTING_PORT,
            "metricsPort": METRICS_PORT,
            "dLegerPeerSocketPort": PEER_SOCKET_PORT,
            "namesrvAddr": self.layout.namesrv_addr,
            "storePathRootDir": str(d / "store"),
            "tlsEnable": "true",
            "tlsServerCertPath": files.cert_path,
            "tlsServerKeyPath": files.key_path,
            "tlsServerTrustCertPath": str(tls / "ca.crt"),
            "authenticationEnabled": "true",
            "authorizationEnabled": "true",
            "aclEncryptionKeyPath": str(acl_key),
            "initAuthenticationUser": init_user,
            **self.layout.settings,
        }
        if self.layout.bind_address:
            values["bindAddress"] = self.layout.bind_address
        text = render_config(values)
        try:  # a layout's settings the broker would refuse: refused now, nothing left
            parse_config(text, str(d / "broker.conf"))
        except ConfigError as exc:
            shutil.rmtree(d)
            raise ClusterError(f"layout: settings: {exc}") from None
        write_private_file(str(d / "broker.conf"), text.encode())
        _write_command(d, ["mqbroker", "-c", str(d / "broker.conf")], "broker.log")


def _write_command(d: Path, argv: list[str], log: str) -> None:
    line = shlex.join([*argv, "--log-file", str(d / log)])
    (d / "command").write_text(line + "\n")


def read_command(process_dir: Path) -> list[str]:
    """The argv a process directory's ``command`` file holds."""
    return shlex.split((process_dir / "command").read_text())


def run(layout_path: str, out: str) -> Written:
    try:
        text = Path(layout_path).read_text()
    except OSError as exc:
        raise ClusterError(f"layout {layout_path}: {exc.strerror}") from None
    return HostFiles(parse_layout(text), Path(out)).write()
