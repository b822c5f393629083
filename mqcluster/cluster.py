"""``mqcluster``: a local broker group on 127.0.0.1 (our answer to RocketMQ's dledger/fast-try.sh).

    mqcluster up [--nodes 3] [--base-dir DIR]   write configs, start a NameServer and the nodes,
                                                wait for a leader (--no-namesrv: nodes only);
                                                secure by default: a local CA, TLS on every
                                                port, member certificates, ACLs, an admin
                                                user (--insecure: plaintext, no ACLs)
    mqcluster status                            one row per node: role, term, commit index, ports
                                                (client, peer, RocketMQ 5, metrics) and the
                                                /metrics addresses (docs/METRICS.md);
                                                a node that exited on its own: EXITED and the
                                                FATAL line (else the last line) of its log
    mqcluster kill nX [--signal KILL]           SIGKILL (or STOP/CONT/TERM) one node (or namesrv)
    mqcluster start nX                          start a node (or namesrv) again
    mqcluster down [--purge]                    stop every node and the NameServer (TERM, then
                                                KILL after a grace)
    mqcluster add [--learner]                   a new node (new id, free ports, its member
                                                certificate when secure), started empty: it
                                                joins as a learner, catches up and is promoted
                                                (--learner: stays a learner)
    mqcluster remove nX                         remove nX from the group (the leader hands
                                                over first when it is nX), then stop it

Several broker groups (mqcluster.groups; docs/CLUSTER.md "Several broker groups"): one CA, one
NameServer and one set of users for all of them.

    mqcluster up --groups N                     N groups (broker-a, broker-b, ...)
    mqcluster add-group [--group NAME]          a new group in the running cluster, given the
                                                first group's topics, users (secrets sealed,
                                                as stored) and ACL rules
    mqcluster remove-group NAME [--purge]       its topics made read-only, drained, nodes stopped
    mqcluster add-user NAME [--type Super]      a user on every group, its credentials kept in
                                                <base>/users/NAME.json (new groups get it)
    (kill, start, add, remove take --group NAME; default: the first group)

Several hosts (mqcluster.hostfiles; docs/DEPLOY.md):

    mqcluster hosts --layout FILE --out DIR     the CA, certificates, broker.conf and
                                                namesrv.conf and start command of every
                                                process of the layout, one dir per process

The files of a secure group (certificates, keys, the admin credentials) are in the base dir,
laid out as :mod:`mqcluster.localsecurity` says; docs/SECURITY.md "Secure by default".

Nodes and the NameServer run as background processes with their logs in the base dir. Only
processes this tool started (their PIDs are in ``nX.pid`` and ``namesrv.pid``, checked against
the command line) are ever signalled.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import shutil
import signal
import socket
import ssl
import sys
import time
from collections.abc import Collection, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from raftmq.dledger.v1 import dledger_pb2 as pb

from broker.config import SECRET_KEYS, render_config
from broker.state.errors import BrokerError
from dledger.server.client import ClientError, LogClient
from mqcli import CommandLine, GlobalOption, parse_assignments
from mqcluster import localsecurity
from mqerrors import codes as E
from mqrelease import too_new_message
from mqsecurity.channels import PLAINTEXT, ClientSecurity
from mqsecurity.credentials import Credentials, write_private_file
from mqsecurity.errors import SecurityError
from mqsecurity.tls import metrics_over_tls
from prockit.processes import exited, free_ports, spawn_logged
from prockit.properties import parse_bool

if TYPE_CHECKING:  # mqcluster.groups builds on this module; main imports it when it runs
    from mqcluster.groups import Groups

DEFAULT_BASE_DIR = "/tmp/raftmq-cluster"
STATE_FILE = "cluster.json"
# cluster.json's format ("version"; a file without it, written before it existed, is 1). A
# newer one is refused (ClusterFormatTooNewError): its keys may mean what this release cannot
# tell, and the next save would drop them.
STATE_VERSION = 1
# Ports of the local group (docs/CLUSTER.md): node i listens for clients on 10911 + 10 i
# (10911 is RocketMQ's broker port) and for its peers on 40911 + i.
CLIENT_PORT_BASE = 10911
CLIENT_PORT_STEP = 10
PEER_PORT_BASE = 40911
# RocketMQ 5 clients (grpcServerPort, docs/RMQ5.md): node i on 8081 + i (8081 is the RocketMQ 5
# proxy's default port).
GRPC_PORT_BASE = 8081
# The NameServer's port (RocketMQ's 9876) unless --auto-ports.
NAMESRV_PORT = 9876
# RocketMQ's remoting protocol for 4.x clients (remotingListenPort, docs/REMOTING.md): the
# NameServer's on 9877 (RocketMQ's 9876 is the gRPC port here), node i's on its client port + 1
# (a client port block of 10 leaves it free).
NAMESRV_REMOTING_PORT = 9877
REMOTING_PORT_OFFSET = 1
# Prometheus /metrics (metricsPort, docs/METRICS.md): node i on 5557 + i (rocketmq-exporter's
# port), the NameServer on 5556.
METRICS_PORT_BASE = 5557
NAMESRV_METRICS_PORT = 5556
# The peer socket (dLegerPeerSocketPort, docs/RAFT.md "Peer sockets"): node i's peer port + 100
# (41011 + 10 k + i: above every fixed block's peer ports).
SOCKET_PORT_OFFSET = 100
NAMESRV_ID = "namesrv"
# Seconds `up` and `start` wait for a leader; `down` waits after SIGTERM before SIGKILL.
LEADER_WAIT_S = 30.0
# `up` gives the last nodes at least this long to answer after the leader is elected, even
# when the election used up the rest of its wait: a node importing its modules takes ~1-2 s.
SERVING_WAIT_MIN_S = 10.0
# Seconds `up` waits for the NameServer to listen (it starts in well under a second).
NAMESRV_WAIT_S = 10.0
STOP_GRACE_S = 10.0
# Seconds `add` waits for the new node to join and catch up, `remove` for the change.
MEMBER_WAIT_S = 120.0
MAX_NODES = 7
# Fixed ports of group k of a cluster of several (mqcluster.groups): node i's client port is
# 10911 + 100 k + 10 i, its peer, RocketMQ 5 and metrics ports 40911/8081/5557 + 10 k + i
# (a block of 10 holds MAX_NODES); 10 blocks, so 10 groups at most in the fixed layout.
CLIENT_BLOCK_STEP = 100
PORT_BLOCK_STEP = 10
MAX_PORT_BLOCKS = 10
# Keys of cluster.json that belong to mqcluster.groups (the cluster's other groups).
EXTRA_STATE_KEYS = frozenset({"groups"})
# What prockit/fatal.py writes before a node ends itself (`FATAL component=... cause=...`).
FATAL_MARK = "FATAL component="
# Bytes read from the end of an exited node's log to find its last FATAL (or last) line: logs
# grow without bound, status must not read them whole.
LOG_TAIL_BYTES = 64 << 10
# Characters of that line shown by `status` (the cause on a FATAL line is at most 500).
EXIT_LINE_MAX_CHARS = 600
# The official RocketMQ 5 Python client's own venv (``make venv``: protos/rmq5_deps.py); its
# bundled apache.rocketmq.v2 stubs cannot share a process with the server's.
OFFICIAL_PYTHON = Path(__file__).resolve().parents[1] / "build/rmq5/pyclient/bin/python"


class ClusterError(BrokerError):
    """A cluster operation that cannot be done; one line for the CLI."""

    code = E.CLUSTER_ERROR


class ClusterFormatTooNewError(ClusterError):
    """cluster.json was written by a newer release of mqcluster (error FORMAT_TOO_NEW)."""

    code = E.FORMAT_TOO_NEW


@dataclass(frozen=True, slots=True)
class SharedParts:
    """What a group added to a cluster of several shares with the cluster's first group: its
    NameServers (their ``namesrvAddr``) and its security files (CA, admin, ACL key)."""

    namesrv_addr: str
    layout: localsecurity.SecureLayout


@dataclass(frozen=True, slots=True)
class NodeInfo:
    node_id: str
    client_port: int
    peer_port: int
    conf: str
    log: str
    pid_file: str
    # The RocketMQ 5 port (grpcServerPort, docs/RMQ5.md); 0 in a cluster.json written before it.
    grpc_port: int = 0
    # The /metrics port (metricsPort, docs/METRICS.md); 0: not served.
    metrics_port: int = 0
    # Whether it is served over HTTPS (tlsEnable, unless metricsTlsEnable=false).
    metrics_tls: bool = False
    # The RocketMQ remoting port (remotingListenPort, docs/REMOTING.md); 0: not served (and in a
    # cluster.json written before it).
    remoting_port: int = 0
    # The peer socket's port (dLegerPeerSocketPort, docs/RAFT.md "Peer sockets"); 0: not
    # offered (and in a cluster.json written before it).
    socket_port: int = 0

    @property
    def client_addr(self) -> str:
        return f"127.0.0.1:{self.client_port}"

    @property
    def metrics_url(self) -> str:
        return _metrics_url(self.metrics_port, self.metrics_tls)

    @property
    def grpc_addr(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"


@dataclass(frozen=True, slots=True)
class NameSrvInfo:
    port: int
    conf: str
    log: str
    pid_file: str
    metrics_port: int = 0
    metrics_tls: bool = False
    # Its RocketMQ remoting port, where 4.x clients point (their namesrvAddr); 0: not served.
    remoting_port: int = 0

    @property
    def addr(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def remoting_addr(self) -> str:
        return f"127.0.0.1:{self.remoting_port}" if self.remoting_port else ""

    @property
    def metrics_url(self) -> str:
        return _metrics_url(self.metrics_port, self.metrics_tls)


def _metrics_url(port: int, tls: bool) -> str:
    """The /metrics address of a process of the local group ("" when it serves none)."""
    if not port:
        return ""
    return f"{'https' if tls else 'http'}://127.0.0.1:{port}/metrics"


def metrics_tls(values: Mapping[str, object]) -> bool:
    """Whether a process with these broker.conf or NameServer keys serves /metrics over HTTPS:
    with tlsEnable, unless metricsTlsEnable=false (docs/METRICS.md). A value that does not
    parse stops the process at start: False then."""
    try:
        own = str(values.get("metricsTlsEnable", "")).strip()
        return metrics_over_tls(
            parse_bool(str(values.get("tlsEnable", "false"))), parse_bool(own) if own else None
        )
    except ValueError:
        return False


def log_client(
    addrs: list[str], group: str, security: ClientSecurity = PLAINTEXT, timeout_s: float = 5.0
) -> LogClient:
    """A client of the nodes' log service reaching them as ``security`` says: the one place
    the tools (mqcluster, mqjepsen, mqaudit --connect) make one."""
    return LogClient(addrs, group=group, timeout_s=timeout_s, security=security)


# A node's ports, by kind, in the order _write_node_conf takes them.
NODE_PORT_KINDS = ("client", "peer", "grpc", "metrics", "remoting", "socket")


def _node_ports(
    nodes: int, port_block: int | None, avoid: Collection[int]
) -> tuple[dict[str, list[int]], tuple[int, int, int]]:
    """Each node's ports by kind (client, peer, grpc, metrics, remoting, socket) and the
    NameServer's
    (port, metrics port, remoting port): drawn free, none of ``avoid``, when ``port_block`` is
    None; else the fixed ports of that block."""
    if port_block is None:
        kinds = NODE_PORT_KINDS
        free = _free_ports(len(kinds) * nodes + 3, avoid=avoid)
        by_kind = {k: free[i * nodes : (i + 1) * nodes] for i, k in enumerate(kinds)}
        return by_kind, (free[-3], free[-2], free[-1])
    block = PORT_BLOCK_STEP * port_block
    client = CLIENT_PORT_BASE + CLIENT_BLOCK_STEP * port_block
    by_kind = {
        "client": [client + CLIENT_PORT_STEP * i for i in range(nodes)],
        "peer": [PEER_PORT_BASE + block + i for i in range(nodes)],
        "grpc": [GRPC_PORT_BASE + block + i for i in range(nodes)],
        "metrics": [METRICS_PORT_BASE + block + i for i in range(nodes)],
        "remoting": [client + CLIENT_PORT_STEP * i + REMOTING_PORT_OFFSET for i in range(nodes)],
        "socket": [PEER_PORT_BASE + SOCKET_PORT_OFFSET + block + i for i in range(nodes)],
    }
    return by_kind, (NAMESRV_PORT, NAMESRV_METRICS_PORT, NAMESRV_REMOTING_PORT)


def _free_port() -> int:
    return free_ports(1)[0]


_free_ports = free_ports  # the name tests and tools import from here


def last_exit_line(log_path: str | os.PathLike[str]) -> str:
    """The last ``FATAL component=...`` line in the tail of a node's log, else its last
    non-empty line, else ""; cut to :data:`EXIT_LINE_MAX_CHARS`."""
    try:
        with open(log_path, "rb") as f:
            size = f.seek(0, os.SEEK_END)
            f.seek(max(0, size - LOG_TAIL_BYTES))
            tail = f.read(LOG_TAIL_BYTES)
    except OSError:
        return ""
    lines = [ln.strip() for ln in tail.decode("utf-8", "replace").splitlines() if ln.strip()]
    if size > LOG_TAIL_BYTES and lines:
        lines = lines[1:]  # the first line of the tail may be cut
    fatal = [ln for ln in lines if FATAL_MARK in ln]
    line = fatal[-1] if fatal else (lines[-1] if lines else "")
    if FATAL_MARK in line:
        line = line[line.index("FATAL") :]  # drop the logger's timestamp and name
    return line if len(line) <= EXIT_LINE_MAX_CHARS else line[: EXIT_LINE_MAX_CHARS - 3] + "..."


def _spawn(argv: list[str], log: str, pid_file: str, env: dict[str, str] | None = None) -> int:
    """Start a node or the NameServer in a session of its own, its output appended to
    ``log``; its pid goes to ``pid_file`` (what `status`, `kill` and `down` act on)."""
    pid = spawn_logged(argv, log, env=env).pid
    Path(pid_file).write_text(f"{pid}\n")
    return pid


def _read_pid(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def _wait_pid_gone(pid: int, conf: str, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not _pid_alive(pid, conf):
            return True
        time.sleep(0.02)
    return False


def _pid_alive(pid: int, conf: str) -> bool:
    """True if ``pid`` is a live (not zombie) process running the node with ``conf``."""
    if exited(pid):  # reaps it if it is our child and exited
        return False
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    # A child between execve's point of no return (Popen has returned) and the kernel setting
    # up its argument pages shows an empty cmdline for a moment: under load, long enough to be
    # mistaken for "exited at start". It is ours (the pid file says so) and alive.
    return cmdline == [b""] or conf.encode() in cmdline


class LocalCluster:
    """A local group described by ``{base_dir}/cluster.json``."""

    def __init__(self, base_dir: str | os.PathLike[str]) -> None:
        self.base = Path(base_dir).resolve()
        self.group = ""
        self.nodes: list[NodeInfo] = []
        # Ids removed from the group: never given to a new node (a removed id stays refused).
        self.removed: list[str] = []
        self.namesrv: NameSrvInfo | None = None
        # TLS, member certificates and ACLs (files in `localsecurity.SecureLayout(base)`).
        self.secure = False
        self.layout = localsecurity.SecureLayout(self.base)
        # Extra environment for one node's next starts, by node id (e.g. a test arming a
        # failpoint with RAFTMQ_FAILPOINTS in one node only). Not saved in cluster.json.
        self.node_env: dict[str, dict[str, str]] = {}
        # The broker.conf keys given at `configure` (mqcluster up --set): a node added later
        # gets them too (a segment size of its own would refuse every snapshot).
        self.settings: dict[str, str] = {}
        # A group of a cluster of several (mqcluster.groups): the NameServers of the cluster
        # it registers with when it runs none of its own, and the base dir whose CA, admin
        # credentials and ACL key it shares ("": its own). Saved in cluster.json.
        self.shared_namesrv = ""
        self.security_base = ""
        # Port block of the fixed (not --auto-ports) layout: group k of a cluster takes
        # block k, so that several groups' default ports never meet.
        self.port_block = 0
        # More keys of cluster.json, kept as read (mqcluster.groups: the cluster's groups).
        self.extra_state: dict[str, object] = {}
        state = self.base / STATE_FILE
        if state.exists():
            data = json.loads(state.read_text())
            version = data.get("version", 1)
            if isinstance(version, int) and version > STATE_VERSION:
                raise ClusterFormatTooNewError(
                    too_new_message("cluster state", state, version, STATE_VERSION)
                )
            self.group = data["group"]
            # A cluster.json from before metrics_tls: a secure group's processes serve HTTPS.
            tls = {"metrics_tls": bool(data.get("secure", False))}
            self.nodes = [NodeInfo(**{**tls, **n}) for n in data["nodes"]]
            self.removed = list(data.get("removed", []))
            if data.get("namesrv"):
                self.namesrv = NameSrvInfo(**{**tls, **data["namesrv"]})
            self.secure = bool(data.get("secure", False))
            self.settings = {str(k): str(v) for k, v in data.get("settings", {}).items()}
            self.shared_namesrv = str(data.get("shared_namesrv", ""))
            self.security_base = str(data.get("security_base", ""))
            self.port_block = int(data.get("port_block", 0))
            self.extra_state = {k: v for k, v in data.items() if k in EXTRA_STATE_KEYS}
            if self.security_base:
                self.layout = localsecurity.SecureLayout(Path(self.security_base))

    # ------------------------------------------------------------------ setup

    def configure(
        self,
        nodes: int = 3,
        *,
        group: str = "broker-a",
        auto_ports: bool = False,
        extra: dict[str, str] | None = None,
        namesrv: bool = False,
        namesrv_conf: dict[str, str] | None = None,
        secure: bool = False,
        shared: SharedParts | None = None,
        port_block: int = 0,
        avoid_ports: Collection[int] = (),
    ) -> None:
        """Write one broker.conf per node and the state file; with ``namesrv`` also a
        NameServer config (``namesrv_conf``: extra keys), and point every node at it. With
        ``secure`` (what `mqcluster up` does unless --insecure) also a local CA, certificates
        and the admin user's credentials (:mod:`mqcluster.localsecurity`), and the keys that turn
        TLS, member certificates and ACLs on in every config. With ``shared`` (a group added
        to a cluster, mqcluster.groups) no NameServer and no CA of its own: its nodes register
        with the cluster's NameServers and its certificates come from the cluster's CA.
        ``port_block``: which block of the fixed ports (not ``auto_ports``) it takes;
        ``avoid_ports``: ports ``auto_ports`` must not pick (other groups' configured ports,
        free until those groups start)."""
        if not 1 <= nodes <= MAX_NODES:
            raise ClusterError(f"--nodes must be in [1, {MAX_NODES}], got {nodes}")
        if (self.nodes and any(self.pid(n) for n in self.nodes)) or self.namesrv_pid() is not None:
            raise ClusterError(f"a cluster is running in {self.base}; run 'mqcluster down' first")
        self.base.mkdir(parents=True, exist_ok=True)
        if shared is not None and namesrv:
            raise ClusterError("a group of a shared cluster uses the cluster's NameServers")
        if not 0 <= port_block < MAX_PORT_BLOCKS:
            raise ClusterError(f"port block {port_block} is outside [0, {MAX_PORT_BLOCKS})")
        self.namesrv = None
        self.secure = secure
        self.group = group
        self.port_block = port_block
        if shared is not None:
            self.shared_namesrv = shared.namesrv_addr
            self.security_base = str(shared.layout.base) if secure else ""
            self.layout = shared.layout if secure else localsecurity.SecureLayout(self.base)
        ids = [f"n{i}" for i in range(nodes)]
        ports, (namesrv_port, namesrv_metrics_port, namesrv_remoting_port) = _node_ports(
            nodes, port_block if not auto_ports else None, avoid_ports
        )
        admin = None
        if secure:
            admin = self._secure_files(group, ids) if shared is None else self._member_files(ids)
        if namesrv:
            ns_conf = localsecurity.namesrv_keys(self.layout) if secure else {}
            self.namesrv = self._write_namesrv_conf(
                namesrv_port,
                {
                    "metricsPort": str(namesrv_metrics_port),
                    "remotingListenPort": str(namesrv_remoting_port),
                    **ns_conf,
                    **(namesrv_conf or {}),
                },
            )
        # Saved in cluster.json: without secrets (they stay in the 0600 node configs; a node
        # joining later takes the group's users from its log, not from initAuthenticationUser).
        self.settings = {k: v for k, v in (extra or {}).items() if k not in SECRET_KEYS}
        self._write_node_confs(ids, ports, extra or {}, admin)
        self._save_state()

    def _secure_files(self, group: str, ids: list[str]) -> Credentials:
        """The CA, certificates and admin credentials of a secure group; the credentials."""
        try:
            _, admin = localsecurity.create_secure_files(
                self.base, group, {i: localsecurity.LOCAL_HOSTS for i in ids}
            )
        except (SecurityError, OSError) as exc:
            raise ClusterError(f"cannot create the security files in {self.base}: {exc}") from None
        return admin

    def _member_files(self, ids: list[str]) -> Credentials:
        """Member certificates of this group's nodes from the cluster's CA (a group added to a
        cluster): the NameServers and tools already trust them. The admin credentials."""
        try:
            for node_id in ids:
                admin = localsecurity.add_member_files(self.layout, self.group, node_id)
        except (SecurityError, OSError) as exc:
            raise ClusterError(f"cannot issue the certificates of {self.group}: {exc}") from None
        return admin

    def _write_namesrv_conf(self, port: int, conf: dict[str, str]) -> NameSrvInfo:
        conf_path = self.base / f"{NAMESRV_ID}.conf"
        # The local group's NameServer serves this machine only (issue #18).
        values = {"listenPort": port, "listenHost": "127.0.0.1", **conf}
        conf_path.write_text("".join(f"{k}={v}\n" for k, v in values.items()))
        return NameSrvInfo(
            port,
            str(conf_path),
            str(self.base / f"{NAMESRV_ID}.log"),
            str(self.base / f"{NAMESRV_ID}.pid"),
            int(str(values.get("metricsPort", 0))),
            metrics_tls(values),
            int(str(values.get("remotingListenPort", 0))),
        )

    def _write_node_confs(
        self,
        ids: list[str],
        ports: dict[str, list[int]],
        extra: dict[str, str],
        admin: Credentials | None = None,
    ) -> None:
        """One broker.conf per node of ``self.group`` (``ports``: its client, peer, grpc and
        metrics ports, by node), pointing at the NameServer if any; with ``admin`` (a secure
        group) the security keys too, and the file is 0600 (it holds the admin user's initial
        secret)."""
        peers = ";".join(f"{i}-127.0.0.1:{p}" for i, p in zip(ids, ports["peer"], strict=True))
        client_addrs = ";".join(
            f"{i}-127.0.0.1:{p}" for i, p in zip(ids, ports["client"], strict=True)
        )
        self.nodes = []
        for node_id, *node_ports in zip(ids, *(ports[k] for k in NODE_PORT_KINDS), strict=True):
            keys = {"dLegerPeers": peers, "dLegerPeerClientAddrs": client_addrs, **extra}
            cport, pport, gport, mport, rport, sport = node_ports
            ports_of = (cport, pport, gport, mport, rport, sport)
            node = self._write_node_conf(node_id, ports_of, keys, admin)
            self.nodes.append(node)

    def _write_node_conf(
        self,
        node_id: str,
        ports: tuple[int, int, int, int, int, int],
        keys: dict[str, str],
        admin: Credentials | None,
    ) -> NodeInfo:
        """One node's broker.conf (``ports``: client, peer, RocketMQ 5, metrics, remoting,
        peer socket);
        ``keys`` has its dLegerPeers and any extra key."""
        cport, pport, gport, mport, rport, sport = ports
        conf = self.base / f"{node_id}.conf"
        values: dict[str, object] = {
            "brokerClusterName": "DefaultCluster",
            "brokerName": self.group,
            "enableDLegerCommitLog": "true",
            "dLegerGroup": self.group,
            "dLegerSelfId": node_id,
            "listenPort": cport,
            "grpcServerPort": gport,
            "metricsPort": mport,
            "remotingListenPort": rport,
            "dLegerPeerSocketPort": sport,
            "storePathRootDir": str(self.base / node_id),
        }
        if self.namesrv is not None:
            values["namesrvAddr"] = self.namesrv.addr
        elif self.shared_namesrv:
            values["namesrvAddr"] = self.shared_namesrv
        if admin is not None:
            values.update(localsecurity.broker_keys(self.layout, self.group, node_id, admin))
        values.update(keys)
        gport = int(str(values["grpcServerPort"]))  # extra may turn it off (0)
        mport = int(str(values["metricsPort"]))
        rport = int(str(values["remotingListenPort"]))
        sport = int(str(values["dLegerPeerSocketPort"]))
        if not sport:
            del values["dLegerPeerSocketPort"]  # 0 is the default (and unknown before 0.3.0)
        if not parse_bool(str(values.get("dLegerPeerSocketEnable", "true"))):
            sport = 0  # turned off: not offered
        text = render_config(values)
        if admin is not None:
            write_private_file(str(conf), text.encode())
        else:
            conf.write_text(text)
        return NodeInfo(
            node_id,
            cport,
            pport,
            str(conf),
            str(self.base / f"{node_id}.log"),
            str(self.base / f"{node_id}.pid"),
            gport,
            mport,
            metrics_tls(values),
            rport,
            sport,
        )

    # ------------------------------------------------------------------ membership

    def _next_id(self) -> str:
        used = {n.node_id for n in self.nodes} | set(self.removed)
        return next(f"n{i}" for i in range(len(used) + 1) if f"n{i}" not in used)

    def add_node(
        self,
        *,
        promote: bool = True,
        timeout_s: float = MEMBER_WAIT_S,
        extra: dict[str, str] | None = None,
    ) -> NodeInfo:
        """A new node started empty with the leader's address: it joins as a learner; with
        ``promote`` it is made a voter once caught up. The group must have a leader.
        ``extra``: more broker.conf keys for it."""
        if len(self.nodes) >= MAX_NODES:
            raise ClusterError(f"the group has {len(self.nodes)} nodes, the most is {MAX_NODES}")
        leader = self.node(self.wait_leader())
        info = self._write_new_node(leader, extra or {})
        node_id = info.node_id
        self.start(node_id)
        deadline = time.monotonic() + timeout_s
        with self.client() as client:
            while not any(m.id == node_id for m in self._members(client)):
                if self.pid(info) is None:
                    why = f"{node_id} ended: {last_exit_line(info.log)} (log {info.log})"
                    if any(m.id == node_id for m in self._members(client)):
                        raise ClusterError(f"{why}; it is a member: start or remove it")
                    self._forget_new_node(info)
                    raise ClusterError(f"{why}; it did not join: the group is unchanged")
                if time.monotonic() > deadline:
                    raise ClusterError(
                        f"{node_id} did not join within {timeout_s:.0f} s: {info.log}"
                    )
                time.sleep(0.1)
            if promote:
                self._change(client, "PROMOTE", node_id, deadline)
        return info

    def _forget_new_node(self, info: NodeInfo) -> None:
        """A new node that ended before it joined (its Join refused): out of the state file,
        its store and config deleted (its id was never a member); its log stays to read."""
        self.nodes = [n for n in self.nodes if n.node_id != info.node_id]
        self._save_state()
        shutil.rmtree(self.base / info.node_id, ignore_errors=True)
        Path(info.conf).unlink(missing_ok=True)
        Path(info.pid_file).unlink(missing_ok=True)

    def configured_ports(self) -> set[int]:
        """Every port this group's configs name (nodes and NameServer), running or not."""
        ports = {
            p
            for n in self.nodes
            for p in (
                n.client_port,
                n.peer_port,
                n.grpc_port,
                n.metrics_port,
                n.remoting_port,
                n.socket_port,
            )
            if p
        }
        if self.namesrv is not None:
            ns = self.namesrv
            ports |= {p for p in (ns.port, ns.metrics_port, ns.remoting_port) if p}
        return ports

    def _write_new_node(self, leader: NodeInfo, extra: dict[str, str]) -> NodeInfo:
        """The broker.conf of a node joining through ``leader``: the group's settings, then
        ``extra``, then its own ports and join address; it is added to the state file."""
        node_id = self._next_id()
        # Not a port of a member that is stopped now (free, but its own when it starts).
        ports = tuple(_free_ports(len(NODE_PORT_KINDS), avoid=self.configured_ports()))
        cport, pport, gport, mport, rport, sport = ports
        admin = None
        if self.secure:
            try:
                admin = localsecurity.add_member_files(self.layout, self.group, node_id)
            except (SecurityError, OSError) as exc:
                raise ClusterError(f"cannot issue {node_id}'s certificate: {exc}") from None
        keys = {
            **self.settings,
            **extra,
            "dLegerPeers": f"{node_id}-127.0.0.1:{pport}",
            "dLegerJoinAddr": f"127.0.0.1:{leader.peer_port}",
        }
        keys.pop("dLegerPeerClientAddrs", None)  # the original members': not this node's
        info = self._write_node_conf(
            node_id, (cport, pport, gport, mport, rport, sport), keys, admin
        )
        self.nodes.append(info)
        self._save_state()
        return info

    def remove_node(self, node_id: str, *, timeout_s: float = MEMBER_WAIT_S) -> None:
        """Remove ``node_id`` from the group (a leader hands over first), then stop it."""
        n = self.node(node_id)
        with self.client() as client:
            self._change(client, "REMOVE", node_id, time.monotonic() + timeout_s)
        pid = self.pid(n)
        if pid is not None:
            self._stop_all([(node_id, pid, n.conf)], STOP_GRACE_S)
        self.nodes = [x for x in self.nodes if x.node_id != node_id]
        self.removed.append(node_id)
        self._save_state()

    def _members(self, client: LogClient) -> list[pb.Member]:
        try:
            return list(client.list_members().members)
        except ClientError:
            return []

    @staticmethod
    def _change(client: LogClient, kind: str, node_id: str, deadline: float) -> None:
        try:
            client.change_member(kind, node_id, timeout_s=max(1.0, deadline - time.monotonic()))
        except ClientError as exc:
            raise ClusterError(f"{kind} {node_id}: {exc}") from None

    def _save_state(self) -> None:
        (self.base / STATE_FILE).write_text(
            json.dumps(
                {
                    "version": STATE_VERSION,
                    "group": self.group,
                    "nodes": [asdict(n) for n in self.nodes],
                    "namesrv": asdict(self.namesrv) if self.namesrv else None,
                    "secure": self.secure,
                    "removed": self.removed,
                    "settings": self.settings,
                    "shared_namesrv": self.shared_namesrv,
                    "security_base": self.security_base,
                    "port_block": self.port_block,
                    **self.extra_state,
                },
                indent=2,
            )
        )

    def node(self, node_id: str) -> NodeInfo:
        for n in self.nodes:
            if n.node_id == node_id:
                return n
        known = ", ".join(n.node_id for n in self.nodes) or "none (run 'mqcluster up')"
        raise ClusterError(f"unknown node {node_id!r}; nodes: {known}")

    @property
    def client_addrs(self) -> list[str]:
        return [n.client_addr for n in self.nodes]

    # ------------------------------------------------------------------ processes

    def pid(self, n: NodeInfo) -> int | None:
        pid = _read_pid(Path(n.pid_file))
        return pid if pid is not None and _pid_alive(pid, n.conf) else None

    def namesrv_pid(self) -> int | None:
        ns = self.namesrv
        if ns is None:
            return None
        pid = _read_pid(Path(ns.pid_file))
        return pid if pid is not None and _pid_alive(pid, ns.conf) else None

    def start_namesrv(self) -> int:
        ns = self.namesrv
        if ns is None:
            raise ClusterError("this cluster has no NameServer (it was set up with --no-namesrv)")
        if self.namesrv_pid() is not None:
            raise ClusterError(f"{NAMESRV_ID} is already running")
        return _spawn([sys.executable, "-m", "nameserver", "-c", ns.conf], ns.log, ns.pid_file)

    def wait_namesrv(self, timeout_s: float = NAMESRV_WAIT_S) -> None:
        """Wait until the NameServer accepts connections; fail if it exited (busy port...)."""
        ns = self.namesrv
        assert ns is not None
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.namesrv_pid() is None:
                raise ClusterError(f"{NAMESRV_ID} exited at start; see {ns.log}")
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                s.settimeout(0.2)
                if s.connect_ex(("127.0.0.1", ns.port)) == 0:
                    return
            time.sleep(0.05)
        raise ClusterError(f"{NAMESRV_ID} not listening on {ns.addr} within {timeout_s:.0f} s")

    def signal_namesrv(self, sig: signal.Signals = signal.SIGKILL) -> int:
        pid = self.namesrv_pid()
        if pid is None or self.namesrv is None:
            raise ClusterError(f"{NAMESRV_ID} is not running")
        os.kill(pid, sig)
        if sig is signal.SIGKILL:
            _wait_pid_gone(pid, self.namesrv.conf, 5.0)
        return pid

    def start(self, node_id: str) -> int:
        n = self.node(node_id)
        if self.pid(n) is not None:
            raise ClusterError(f"{node_id} is already running")
        env = {**os.environ, **self.node_env[node_id]} if self.node_env.get(node_id) else None
        return _spawn(self.node_argv(n), n.log, n.pid_file, env)

    def node_argv(self, n: NodeInfo) -> list[str]:
        """The command that runs node ``n`` (a subclass may wrap it, e.g. in a namespace)."""
        return [sys.executable, "-m", "broker", "-c", n.conf]

    def signal(self, node_id: str, sig: signal.Signals = signal.SIGKILL) -> int:
        n = self.node(node_id)
        pid = self.pid(n)
        if pid is None:
            raise ClusterError(f"{node_id} is not running")
        os.kill(pid, sig)
        # A node this tool killed is DOWN, not EXITED: forget its pid once it is gone.
        if sig is signal.SIGKILL and self._wait_gone(n, pid, 5.0):
            with contextlib.suppress(FileNotFoundError):
                Path(n.pid_file).unlink()
        return pid

    def _wait_gone(self, n: NodeInfo, pid: int, timeout_s: float) -> bool:
        return _wait_pid_gone(pid, n.conf, timeout_s)

    def up(self, wait_s: float = LEADER_WAIT_S) -> str:
        if self.namesrv is not None and self.namesrv_pid() is None:
            self.start_namesrv()
            self.wait_namesrv()
        deadline = time.monotonic() + wait_s
        for n in self.nodes:
            if self.pid(n) is None:
                self.start(n.node_id)
        leader = self.wait_leader(wait_s)
        # A leader needs only a majority: the last node to start may still be importing when
        # it is elected. "Up" means every node answers, so that what follows never meets a
        # refused connection on a node it was told is running.
        self.wait_serving(max(deadline - time.monotonic(), SERVING_WAIT_MIN_S))
        return leader

    def down(self, grace_s: float = STOP_GRACE_S) -> list[str]:
        """Stop every running node, then the NameServer (so that the nodes can unregister);
        returns the ids that needed SIGKILL."""
        killed = self._stop_all(
            [(n.node_id, p, n.conf) for n in self.nodes if (p := self.pid(n)) is not None],
            grace_s,
        )
        if self.namesrv is not None and (pid := self.namesrv_pid()) is not None:
            killed += self._stop_all([(NAMESRV_ID, pid, self.namesrv.conf)], grace_s)
        for pid_file in [n.pid_file for n in self.nodes] + (
            [self.namesrv.pid_file] if self.namesrv else []
        ):
            with contextlib.suppress(FileNotFoundError):
                Path(pid_file).unlink()
        return killed

    @staticmethod
    def _stop_all(running: list[tuple[str, int, str]], grace_s: float) -> list[str]:
        for _name, pid, _conf in running:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)  # a paused process cannot handle SIGTERM
                os.kill(pid, signal.SIGTERM)
        killed = []
        for name, pid, conf in running:
            if not _wait_pid_gone(pid, conf, grace_s):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                _wait_pid_gone(pid, conf, 5.0)
                killed.append(name)
        return killed

    def purge(self) -> None:
        shutil.rmtree(self.base, ignore_errors=True)

    # ------------------------------------------------------------------ state

    def client_security(self) -> ClientSecurity:
        """How tools reach this group: plaintext, or (secure) TLS trusting the group's CA with
        the admin client certificate, every call signed with the admin credentials."""
        if not self.secure:
            return PLAINTEXT
        try:
            return self.layout.client_security()
        except SecurityError as exc:
            raise ClusterError(f"cannot read this group's admin credentials: {exc}") from None

    def tool_argv(self) -> list[str]:
        """The security options (mqsecurity.options) a tool process needs for this group."""
        return self.layout.tool_argv() if self.secure else []

    def _metrics_https(self) -> bool:
        infos: list[NodeInfo | NameSrvInfo] = [*self.nodes]
        if self.namesrv is not None:
            infos.append(self.namesrv)
        return any(i.metrics_tls and i.metrics_port for i in infos)

    @property
    def metrics_ca(self) -> Path | None:
        """The CA file a scraper checks this group's HTTPS /metrics with (the group's own CA,
        or the nodes' tlsServerTrustCertPath); None when no process serves HTTPS."""
        if not self._metrics_https():
            return None
        if self.secure:
            return self.layout.ca_cert
        trust = self.settings.get("tlsServerTrustCertPath")
        return Path(trust) if trust else None

    def metrics_ssl_context(self) -> ssl.SSLContext | None:
        """What a scraper of this group's metrics_url passes to urlopen: an SSL context
        trusting :attr:`metrics_ca` (the system's store without one), None for plain HTTP."""
        if not self._metrics_https():
            return None
        ca = self.metrics_ca
        return ssl.create_default_context(cafile=str(ca) if ca is not None else None)

    def official_client_env(self, home: Path) -> dict[str, str]:
        """The environment of an official RocketMQ 5 client process (``examples/rmq5``, the
        bench's v2 case): a HOME of its own (the clients log under ~/logs) and, for a secure
        group, TLS trusting the group's CA and the admin user's AccessKey/SecretKey."""
        env = {"PATH": os.environ.get("PATH", ""), "HOME": str(home), "RMQ5_TLS": "0"}
        credentials = self.client_security().credentials
        if self.secure and credentials is not None:
            env |= {
                "RMQ5_TLS": "1",
                "GRPC_DEFAULT_SSL_ROOTS_FILE_PATH": str(self.layout.ca_cert),
                "RMQ5_ACCESS_KEY": credentials.access_key,
                "RMQ5_SECRET_KEY": credentials.secret_key,
            }
        return env

    def client(self) -> LogClient:
        return log_client(self.client_addrs, self.group, self.client_security())

    def wait_leader(self, timeout_s: float = LEADER_WAIT_S, exclude: str = "") -> str:
        """Wait until a node (other than ``exclude``) is leader; return its node id."""
        deadline = time.monotonic() + timeout_s
        with self.client() as client:
            while time.monotonic() < deadline:
                for n in self.nodes:
                    if n.node_id == exclude or self.pid(n) is None:
                        continue
                    try:
                        md = client.metadata(n.client_addr, timeout_s=0.5)
                    except ClientError:
                        continue
                    if md.role == "LEADER":
                        return n.node_id
                self._check_electable()
                time.sleep(0.05)
        raise ClusterError(f"no leader elected within {timeout_s:.0f} s; logs in {self.base}")

    def _check_electable(self) -> None:
        """ClusterError at once, with their logs' exit lines, when so many nodes ended on their
        own (a bad config, a broken install) that the rest cannot make a majority: waiting out
        the election deadline would only hide why."""
        gone = [(n, line) for n in self.nodes if (line := self.exited(n)) is not None]
        if len(self.nodes) - len(gone) > len(self.nodes) // 2:
            return
        by_line: dict[str, list[str]] = {}
        for n, line in gone:
            by_line.setdefault(line, []).append(n.node_id)
        lines = "; ".join(f"{', '.join(ids)}: {line}" for line, ids in by_line.items())
        raise ClusterError(
            f"no leader can be elected: {len(gone)} of {len(self.nodes)} nodes exited "
            f"({lines}); logs in {self.base}"
        )

    def wait_serving(self, timeout_s: float) -> None:
        """Wait until every node whose process runs answers Metadata on its client port.

        A node that exits meanwhile, or does not answer within ``timeout_s``, raises
        ClusterError with its log's exit line or its address."""
        deadline = time.monotonic() + timeout_s
        waiting = [n for n in self.nodes if self.pid(n) is not None]
        with self.client() as client:
            while waiting:
                for n in list(waiting):
                    if self.pid(n) is None:
                        raise ClusterError(
                            f"node {n.node_id} exited while starting: "
                            f"{self.exited(n) or 'stopped'}; log {n.log}"
                        )
                    try:
                        client.metadata(n.client_addr, timeout_s=0.5)
                    except ClientError:
                        continue
                    waiting.remove(n)
                if not waiting:
                    return
                if time.monotonic() >= deadline:
                    names = ", ".join(f"{n.node_id} ({n.client_addr})" for n in waiting)
                    raise ClusterError(
                        f"running but not answering after {timeout_s:.1f} s: {names}; "
                        f"logs in {self.base}"
                    )
                time.sleep(0.05)

    def exited(self, n: NodeInfo) -> str | None:
        """For a node that ended without `mqcluster down` (its pid file is still there, its
        process is gone): the FATAL line of its log, else its last line. None otherwise."""
        pid = _read_pid(Path(n.pid_file))
        if pid is None or _pid_alive(pid, n.conf):
            return None
        return last_exit_line(n.log) or "(empty log)"

    def status_rows(self) -> list[dict[str, object]]:
        """One row per node; a node that exited on its own has role ``EXITED`` and its FATAL
        (or last) log line under ``exit``."""
        rows: list[dict[str, object]] = []
        with self.client() as client:
            for n in self.nodes:
                pid = self.pid(n)
                exit_line = self.exited(n) if pid is None else None
                row: dict[str, object] = {
                    "node": n.node_id,
                    "pid": pid or "-",
                    "role": "?" if pid is not None else "DOWN" if exit_line is None else "EXITED",
                    "term": "-",
                    "leader": "-",
                    "commit": "-",
                    "last": "-",
                    "client": n.client_port,
                    "peer": n.peer_port,
                    "rmq5": n.grpc_port or "-",
                    "remoting": n.remoting_port or "-",
                    "metrics": n.metrics_port or "-",
                }
                if pid is not None:
                    try:
                        md = client.metadata(n.client_addr, timeout_s=1.0)
                        row.update(
                            role=md.role,
                            term=md.term,
                            leader=md.leader_id or "-",
                            commit=md.commit_index,
                            last=md.last_index,
                        )
                    except ClientError:
                        row["role"] = "UNREACHABLE"
                if exit_line is not None:
                    row["exit"] = exit_line
                rows.append(row)
        return rows


def namesrv_line(cluster: LocalCluster) -> str:
    if cluster.namesrv is None:
        return "namesrv: none (--no-namesrv)"
    pid = cluster.namesrv_pid()
    state = f"pid {pid}" if pid is not None else "DOWN"
    return f"namesrv: {cluster.namesrv.addr} {state}; log {cluster.namesrv.log}"


def remoting_line(cluster: LocalCluster) -> str:
    """Where RocketMQ 4.x clients point (docs/REMOTING.md): the NameServer's remoting port, as
    their namesrvAddr; its routes name each group's leader."""
    ns = cluster.namesrv
    if ns is None:
        return "remoting (RocketMQ 4.x clients): needs a NameServer (started without --no-namesrv)"
    if not ns.remoting_port:
        return "remoting (RocketMQ 4.x clients): not served (remotingListenPort=0)"
    what = "TLS, docs/REMOTING.md" if cluster.secure else "docs/REMOTING.md"
    return f"remoting (RocketMQ 4.x clients, {what}): namesrvAddr {ns.remoting_addr}"


def rmq5_line(cluster: LocalCluster) -> str:
    """The endpoints a RocketMQ 5 client is given (docs/RMQ5.md): any ONE node's address. The
    Node.js client makes one gRPC target of its endpoints, and for a list that target is the
    comma-joined list, which its resolver refuses; over TLS every client checks the certificate
    against that target. The route it asks for then names every node, each as an Endpoints of
    its own, and a client whose node dies carries on through the others."""
    ports = [n.grpc_addr for n in cluster.nodes if n.grpc_port]
    if not ports:
        return "rmq5: not served (grpcServerPort=0)"
    what = "TLS and credentials, docs/RMQ5.md" if cluster.secure else "docs/RMQ5.md"
    return (
        f"rmq5 (RocketMQ 5 clients, grpcServerPort; {what}): "
        f"endpoints, any one per client (routes name every node): {' or '.join(ports)}"
    )


def dashboard_line(cluster: LocalCluster) -> str:
    """How to watch this group in a browser: ``mqcluster`` starts no dashboard (it would
    outlive ``up``, holding a port), it says how to start one (docs/DASHBOARD.md)."""
    if cluster.namesrv is None:
        return "dashboard: needs a NameServer (started without --no-namesrv)"
    argv = " ".join(shlex.quote(a) for a in ["-n", cluster.namesrv.addr, *cluster.tool_argv()])
    return (
        f"dashboard: mqdashboard {argv}\n"
        "  then open http://127.0.0.1:8080/ (--port to change it; docs/DASHBOARD.md)"
    )


def metrics_line(cluster: LocalCluster) -> str:
    """Where Prometheus (or curl) finds each process's /metrics (docs/METRICS.md)."""
    urls = [n.metrics_url for n in cluster.nodes if n.metrics_port]
    if cluster.namesrv is not None and cluster.namesrv.metrics_port:
        urls.append(cluster.namesrv.metrics_url)
    if not urls:
        return "metrics: not served (metricsPort=0)"
    line = (
        "metrics (Prometheus text format, read-only, unauthenticated, docs/METRICS.md): "
        + " ".join(urls)
    )
    ca = cluster.metrics_ca
    if ca is not None:  # HTTPS with the group's certificates
        line += f"\n  over TLS: curl --cacert {shlex.quote(str(ca))} {urls[0]}"
    return line


def format_table(rows: list[dict[str, object]]) -> str:
    """The rows as columns; each ``exit`` entry (a node that exited) as a line of its own
    below the table: ``nX exited: FATAL component=... cause=...``."""
    if not rows:
        return "(no nodes)"
    cols = [c for c in rows[0] if c != "exit"]
    widths = {c: max(len(c), *(len(str(r[c])) for r in rows)) for c in cols}
    lines = ["  ".join(c.upper().ljust(widths[c]) for c in cols).rstrip()]
    lines += ["  ".join(str(r[c]).ljust(widths[c]) for c in cols).rstrip() for r in rows]
    lines += [f"{r['node']} exited: {r['exit']}" for r in rows if "exit" in r]
    return "\n".join(lines)


def build_parser() -> CommandLine:
    """mqcluster's command line; ``--base-dir`` before or after the subcommand."""
    cli = CommandLine(
        argparse.ArgumentParser(
            prog="mqcluster",
            description=__doc__,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        ),
        [
            GlobalOption.of(
                "--base-dir", default=DEFAULT_BASE_DIR, help="where configs, data, logs go"
            )
        ],
        dest="cmd",
        required=True,
    )
    up = cli.add("up", help="write configs, start the nodes, wait for a leader")
    up.add_argument("--nodes", type=int, default=3, help="nodes per group")
    up.add_argument("--group", default="broker-a", help="the (first) group's name")
    up.add_argument(
        "--groups", type=int, default=1, help="broker groups under the one NameServer (1)"
    )
    up.add_argument("--auto-ports", action="store_true", help="pick free ports")
    up.add_argument(
        "--no-namesrv", action="store_true", help="do not start a NameServer (nodes only)"
    )
    up.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="extra broker.conf key"
    )
    up.add_argument(
        "--insecure",
        action="store_true",
        help="plaintext ports, no certificates, no ACLs: anyone who reaches a port may do "
        "anything (the default is TLS, member certificates and ACLs with an admin user)",
    )
    cli.add("status", help="show every node of every group")
    kill = cli.add("kill", help="signal one node (default SIGKILL)")
    kill.add_argument("node")
    kill.add_argument("--signal", default="KILL", choices=["KILL", "TERM", "STOP", "CONT"])
    start = cli.add("start", help="start one node again")
    start.add_argument("node")
    down = cli.add("down", help="stop every node")
    down.add_argument("--purge", action="store_true", help="also delete the base dir")
    add = cli.add("add", help="add a new node: it joins as a learner, then is promoted")
    add.add_argument("--learner", action="store_true", help="leave it a learner")
    remove = cli.add("remove", help="remove a node from the group, then stop it")
    remove.add_argument("node")
    for p in (kill, start, add, remove):
        p.add_argument("--group", default="", help="the node's group (default: the first)")
    _group_commands(cli)
    hosts = cli.add(
        "hosts", help="write every file of a cluster on several hosts (mqcluster.hostfiles)"
    )
    hosts.add_argument("--layout", required=True, help="the layout (JSON): hosts of each process")
    hosts.add_argument("--out", required=True, help="where the files go (one dir per process)")
    return cli


def _group_commands(cli: CommandLine) -> None:
    """add-group, remove-group, add-user."""
    add_group = cli.add("add-group", help="add a broker group to the running cluster")
    add_group.add_argument("--group", default="", help="its name (default: the next free)")
    add_group.add_argument("--nodes", type=int, default=3)
    remove_group = cli.add(
        "remove-group", help="make a group's topics read-only, drain it, then stop its nodes"
    )
    remove_group.add_argument("group")
    remove_group.add_argument("--purge", action="store_true", help="also delete its files")
    remove_group.add_argument(
        "--drain-timeout",
        type=float,
        default=None,
        metavar="S",
        help="seconds to wait for consumers to read what it holds before stopping it "
        "(default 300; 0: do not wait, unread messages are not delivered while it is down)",
    )
    add_user = cli.add("add-user", help="create a user on every group (and on later ones)")
    add_user.add_argument("name")
    add_user.add_argument("--type", default="Normal", choices=["Normal", "Super"])


def _cmd_up(groups: Groups, ns: argparse.Namespace, extra: dict[str, str]) -> None:
    groups.configure(
        ns.groups,
        ns.nodes,
        group=ns.group,
        auto_ports=ns.auto_ports,
        extra=extra,
        namesrv=not ns.no_namesrv,
        secure=not ns.insecure,
    )
    try:
        leaders = groups.up()
    except ClusterError:
        groups.down()
        raise
    cluster = groups.first
    for name, leader in leaders.items():
        print(f"group {name}: leader {leader}")
    print(f"logs and data in {cluster.base}")
    _print_status(groups)
    print(dashboard_line(cluster))
    if cluster.secure:
        print(localsecurity.credentials_notice(cluster.layout))
    else:
        print("security: none (--insecure): plaintext ports, no ACLs; keep it on this machine")


def cluster_rows(groups: Groups) -> list[dict[str, object]]:
    """``status_rows`` of every group, each row led by its group's name."""
    return [{"group": g.group, **row} for g in groups.all() for row in g.status_rows()]


def _print_status(groups: Groups) -> list[dict[str, object]]:
    rows = cluster_rows(groups)
    print(format_table(rows))
    print(namesrv_line(groups.first))
    print(remoting_line(groups.first))
    for g in groups.all():
        prefix = f"{g.group} " if len(groups.extra_names) else ""
        print(prefix + rmq5_line(g))
        print(prefix + metrics_line(g))
    return rows


def _cmd_node(groups: Groups, ns: argparse.Namespace) -> None:
    """kill, start, add, remove: one node of one group (--group; default the first)."""
    cluster = groups.group(ns.group) if ns.group else groups.first
    if ns.cmd == "kill":
        sig = signal.Signals[f"SIG{ns.signal}"]
        if ns.node == NAMESRV_ID:
            pid = groups.first.signal_namesrv(sig)
        else:
            pid = cluster.signal(ns.node, sig)
        print(f"sent SIG{ns.signal} to {ns.node} (pid {pid})")
    elif ns.cmd == "start":
        pid = groups.first.start_namesrv() if ns.node == NAMESRV_ID else cluster.start(ns.node)
        print(f"started {ns.node} (pid {pid})")
    elif ns.cmd == "add":
        info = cluster.add_node(promote=not ns.learner)
        role = "learner" if ns.learner else "voter"
        print(f"added {info.node_id} to {cluster.group} as a {role}: client {info.client_addr}")
        print(format_table(cluster.status_rows()))
    elif ns.cmd == "remove":
        cluster.remove_node(ns.node)
        print(f"removed {ns.node} from group {cluster.group} and stopped it")
        print(format_table(cluster.status_rows()))


def _cmd_groups(groups: Groups, ns: argparse.Namespace) -> None:
    """add-group, remove-group, add-user."""
    if ns.cmd == "add-group":
        added = groups.add_group(ns.group, ns.nodes)
        print(f"added group {added.group}: leader {added.leader}")
        print(f"  topics extended to it: {', '.join(added.topics) or 'none'}")
        if groups.first.secure:
            print(f"  users copied: {', '.join(added.users) or 'none'} (and the admin)")
            print(f"  ACL rules of: {', '.join(added.acl_subjects) or 'none'}")
        _print_status(groups)
    elif ns.cmd == "remove-group":
        from mqcluster.groups import DRAIN_WAIT_S

        drain_s = DRAIN_WAIT_S if ns.drain_timeout is None else ns.drain_timeout
        frozen = groups.remove_group(ns.group, purge=ns.purge, drain_timeout_s=drain_s)
        print(f"topics made read-only on {ns.group}: {', '.join(frozen) or 'none'}")
        print(f"removed group {ns.group} (its nodes stopped{'' if ns.purge else ', files kept'})")
    elif ns.cmd == "add-user":
        path, done = groups.add_user(ns.name, ns.type)
        print(f"user {ns.name} ({ns.type}) created on {', '.join(done) or 'no running group'}")
        print(f"  credentials in {path} (0600): export RAFTMQ_CREDENTIALS={path}")


def main(argv: list[str] | None = None) -> int:
    cli = build_parser()
    parser = cli.parser
    ns = parser.parse_args(argv)
    from mqcluster.groups import Groups  # it imports this module

    try:
        groups = Groups(ns.base_dir)
    except ClusterError as exc:  # cluster.json of a newer mqcluster (FORMAT_TOO_NEW)
        print(f"mqcluster: {exc}", file=sys.stderr)
        return 1
    cluster = groups.first
    try:
        if ns.cmd == "up":
            try:
                extra = parse_assignments(ns.set)
            except ValueError as exc:
                parser.error(str(exc))
            _cmd_up(groups, ns, extra)
        elif ns.cmd == "status":
            if not cluster.nodes:
                raise ClusterError(f"no cluster in {cluster.base}; run 'mqcluster up'")
            rows = _print_status(groups)
            leaders = {r["group"] for r in rows if r["role"] == "LEADER"}
            return 0 if leaders == {g.group for g in groups.all()} else 1
        elif ns.cmd in ("kill", "start", "add", "remove"):
            _cmd_node(groups, ns)
        elif ns.cmd == "hosts":
            from mqcluster import hostfiles  # it imports this module

            written = hostfiles.run(ns.layout, ns.out)
            print(f"wrote {', '.join(written.made) or 'nothing new'} in {ns.out}")
            if written.kept:
                print(f"kept as they were: {', '.join(written.kept)}")
            print(f"NameServers: {written.namesrv_addr} (raftmq tools and clients, -n)")
            print(
                f"remoting (RocketMQ 4.x clients, TLS): namesrvAddr {written.remoting_namesrv_addr}"
            )
            print("copy each directory to its host and run its 'command' (docs/DEPLOY.md)")
        elif ns.cmd in ("add-group", "remove-group", "add-user"):
            _cmd_groups(groups, ns)
        elif ns.cmd == "down":
            killed = groups.down()
            if killed:
                print(f"needed SIGKILL: {', '.join(killed)}")
            if ns.purge:
                cluster.purge()
            print("stopped")
    except BrokerError as exc:  # ClusterError, or a ConfigError of a --set value
        print(f"mqcluster: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
