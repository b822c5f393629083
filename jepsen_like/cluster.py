"""The group under test: a NameServer and 3 or 5 nodes from :class:`mqcluster.cluster.LocalCluster`,
with every directed peer link and every client-to-node link going through :class:`ProxyNet`.

Node ``a`` is told that peer ``b`` lives at the port of link ``a->b`` (so each node's own
``dLegerPeers`` differs only in the other nodes' ports), and every node advertises the port of
link ``client->a`` as its client address, so NameServer routes and ``NOT_LEADER`` redirects
send clients through the proxy too. The harness itself talks to the nodes directly.

With the network-namespace backend (:class:`NetnsNet`) each node instead binds to its own
namespace's address, peers and clients use those addresses directly, and links are cut with
iptables inside the namespaces (see :mod:`jepsen_like.netns`).

The group is secure unless the run is ``--insecure``: TLS on every port (the TCP proxies pass
it through untouched), member certificates, ACLs; every client of the harness and the
workloads connects with the group's admin credentials (``security``).
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import time
from pathlib import Path

from dledger.server.client import ClientError, LogClient
from dledger.storage.promise import promise_path
from jepsen_like.netns import NetnsLocalCluster, NetnsNet
from jepsen_like.proxy import ProxyNet
from mqcluster import localsecurity
from mqcluster.cluster import ClusterError, LocalCluster, NodeInfo, log_client
from mqsecurity.channels import PLAINTEXT, ClientSecurity
from prockit.processes import exited

logger = logging.getLogger(__name__)

CLIENT = "client"
# Log segments of the group under test: small, so that runs roll segments and disk faults
# scan little data (the integration tests use the same size).
SEGMENT_BYTES = 4 << 20
# Seconds a (re)started node gets to serve its client port or exit (a refused start exits
# as soon as it has read its store; a loaded 2-core machine needs several seconds for either).
START_WAIT_S = 30.0
# What a node's start error says when its store is damaged (then it is wiped and re-synced).
CORRUPT_MARK = "corrupt"
# Seconds between checks of a process that is starting or stopping.
POLL_S = 0.05
# Seconds of any other call of the harness's direct (unproxied) client.
DIRECT_RPC_TIMEOUT_S = 2.0
# Seconds for a Metadata call from the harness.
METADATA_TIMEOUT_S = 0.5
# Seconds the group gets to elect a leader.
LEADER_WAIT_S = 30.0
# Seconds a node gets to stop on SIGTERM before SIGKILL.
STOP_GRACE_S = 5.0
# A membership change waits for a new node to start, join and catch up, or for a removal (with
# a hand-over) to commit; a nemesis fault window is a few seconds, this bounds the rare slow one.
MEMBER_WAIT_S = 30.0


def link_name(src: str, dst: str) -> str:
    return f"{src}->{dst}"


class JepsenCluster:
    """Set up with :meth:`setup`, always finish with :meth:`teardown`."""

    def __init__(
        self,
        base: Path,
        nodes: int,
        net: ProxyNet | NetnsNet,
        extra: dict[str, str],
        secure: bool = True,
    ) -> None:
        self.base = base
        self.n_nodes = nodes
        self.net = net
        self.secure = secure
        # How every client reaches the group; set by setup() (the files exist from then on).
        self.security: ClientSecurity = PLAINTEXT
        self.extra = {"mappedFileSizeCommitLog": str(SEGMENT_BYTES), **extra}
        self.local = (
            NetnsLocalCluster(base, net) if isinstance(net, NetnsNet) else LocalCluster(base)
        )
        self.paused: set[str] = set()
        self.started_pids: list[int] = []
        self.proxy_client_addrs: dict[str, str] = {}
        self.events: list[str] = []

    # ------------------------------------------------------------------ setup

    @property
    def ids(self) -> list[str]:
        return [n.node_id for n in self.local.nodes]

    def node(self, node_id: str) -> NodeInfo:
        return self.local.node(node_id)

    def setup(self) -> None:
        # Nodes in network namespaces reach the NameServer at the bridge's address: it binds
        # every address then (a local group's NameServer binds 127.0.0.1 by default).
        namesrv_conf = {"listenHost": "0.0.0.0"} if isinstance(self.net, NetnsNet) else None
        self.local.configure(
            self.n_nodes,
            auto_ports=True,
            extra=self.extra,
            namesrv=True,
            namesrv_conf=namesrv_conf,
            secure=self.secure,
        )
        self.security = self.local.client_security()
        if isinstance(self.net, NetnsNet):
            self._setup_netns(self.net)
            return
        net = self.net
        nodes = self.local.nodes
        # The group's own ports are picked but not bound yet: no proxy listener may take one.
        taken = {p for n in nodes for p in (n.peer_port, n.client_port)}
        if self.local.namesrv is not None:
            taken.add(self.local.namesrv.port)
        for a in nodes:
            for b in nodes:
                if a is not b:
                    net.add_link(link_name(a.node_id, b.node_id), b.peer_port, avoid=taken)
            port = net.add_link(link_name(CLIENT, a.node_id), a.client_port, avoid=taken)
            self.proxy_client_addrs[a.node_id] = f"127.0.0.1:{port}"
        # Redirects name each member by the address its clients use: its proxy.
        client_addrs = ";".join(f"{b.node_id}-{self.proxy_client_addrs[b.node_id]}" for b in nodes)
        for a in nodes:
            peers = ";".join(
                f"{b.node_id}-127.0.0.1:"
                + str(
                    b.peer_port
                    if b is a
                    else net.links[link_name(a.node_id, b.node_id)].listen_port
                )
                for b in nodes
            )
            conf = Path(a.conf)
            lines = [
                f"dLegerPeers={peers}" if line.startswith("dLegerPeers=") else line
                for line in conf.read_text().splitlines()
                if not line.startswith("dLegerPeerClientAddrs=")
            ]
            lines.append(f"advertisedClientAddr={self.proxy_client_addrs[a.node_id]}")
            lines.append(f"dLegerPeerClientAddrs={client_addrs}")
            # The peer socket is reached at the peer's own host and the port it offers
            # (docs/RAFT.md "Peer sockets"), not through this view's proxy ports: it would go
            # around the proxies and no partition would cut it. Through proxies the Raft
            # messages take the gRPC stream; the network-namespace mode (real addresses, real
            # cuts) runs the socket.
            lines.append("dLegerPeerSocketEnable=false")
            conf.write_text("\n".join(lines) + "\n")

    def _setup_netns(self, net: NetnsNet) -> None:
        """Each node in its namespace, bound to its address there; peers and clients use
        those addresses; the NameServer (root namespace, every address) at the bridge's."""
        assert isinstance(self.local, NetnsLocalCluster) and self.local.namesrv is not None
        hosts = {n.node_id: net.add_node(n.node_id) for n in self.local.nodes}
        nodes = self.local.nodes
        for a in nodes:
            self.local.place(a.node_id, hosts[a.node_id])
            for b in nodes:
                if a is not b:
                    net.add_link(link_name(a.node_id, b.node_id), a.node_id, b.node_id)
            net.add_link(link_name(CLIENT, a.node_id), CLIENT, a.node_id, a.client_port)
            self.proxy_client_addrs[a.node_id] = f"{hosts[a.node_id]}:{a.client_port}"
        peers = ";".join(f"{b.node_id}-{hosts[b.node_id]}:{b.peer_port}" for b in nodes)
        replaced = {
            "dLegerPeers": peers,
            "dLegerPeerClientAddrs": ";".join(
                f"{b.node_id}-{self.proxy_client_addrs[b.node_id]}" for b in nodes
            ),
            "namesrvAddr": f"{net.host_ip}:{self.local.namesrv.port}",
        }
        for a in nodes:
            conf = Path(a.conf)
            lines = [
                line
                for line in conf.read_text().splitlines()
                if line.split("=", 1)[0] not in (*replaced, "brokerIP1")
            ]
            lines += [f"{k}={v}" for k, v in replaced.items()]
            lines.append(f"brokerIP1={hosts[a.node_id]}")
            conf.write_text("\n".join(lines) + "\n")
        if self.secure:
            self._secure_netns(net, hosts)

    def _secure_netns(self, net: NetnsNet, hosts: dict[str, str]) -> None:
        """Certificates naming the namespaces' addresses (each node's, the NameServer's at
        the bridge), and the NameServer on every address of the root namespace, where the
        nodes reach it, as in a plaintext netns run."""
        ns = self.local.namesrv
        assert ns is not None
        localsecurity.create_secure_files(
            self.local.base,
            self.local.group,
            {nid: (host, *localsecurity.LOCAL_HOSTS) for nid, host in hosts.items()},
            (net.host_ip, *localsecurity.LOCAL_HOSTS),
        )
        key = localsecurity.NAMESRV_BIND_HOST_KEY
        conf = Path(ns.conf)
        lines = [ln for ln in conf.read_text().splitlines() if not ln.startswith(f"{key}=")]
        conf.write_text("\n".join([*lines, f"{key}=0.0.0.0"]) + "\n")

    def up(self) -> str:
        self._track(self.local.start_namesrv())
        self.local.wait_namesrv()
        failed = self.start_many(self.ids)
        if failed:
            nid, reason = sorted(failed.items())[0]
            raise ClusterError(f"{nid} failed to start: {reason}")
        return self.local.wait_leader(LEADER_WAIT_S)

    def _track(self, pid: int) -> None:
        self.started_pids.append(pid)

    @property
    def namesrv_addr(self) -> str:
        assert self.local.namesrv is not None
        return self.local.namesrv.addr

    # ------------------------------------------------------------------ processes

    def running(self, node_id: str) -> bool:
        return self.local.pid(self.node(node_id)) is not None

    def kill(self, node_id: str, sig: signal.Signals = signal.SIGKILL) -> None:
        self.paused.discard(node_id)
        with contextlib.suppress(ClusterError):
            self.local.signal(node_id, signal.SIGCONT)
            self.local.signal(node_id, sig)

    def kill_and_wait(self, node_id: str) -> None:
        """SIGKILL and wait until the process is gone (its files may be touched then)."""
        self.kill(node_id)
        deadline = time.monotonic() + STOP_GRACE_S
        while self.running(node_id):
            if time.monotonic() >= deadline:
                raise ClusterError(f"{node_id} still runs {STOP_GRACE_S} s after SIGKILL")
            time.sleep(POLL_S)

    def stop(self, node_id: str) -> None:
        """SIGTERM and wait (a clean stop), SIGKILL after a grace."""
        n = self.node(node_id)
        pid = self.local.pid(n)
        if pid is None:
            return
        self.paused.discard(node_id)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)
            os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + STOP_GRACE_S
        while time.monotonic() < deadline and self.local.pid(n) is not None:
            time.sleep(POLL_S)
        if self.local.pid(n) is not None:
            self.kill(node_id)

    def pause(self, node_id: str) -> None:
        self.local.signal(node_id, signal.SIGSTOP)
        self.paused.add(node_id)

    def resume(self, node_id: str) -> None:
        if node_id in self.paused:
            with contextlib.suppress(ClusterError):
                self.local.signal(node_id, signal.SIGCONT)
            self.paused.discard(node_id)

    def start(self, node_id: str) -> str:
        """Start a node that is down; see :meth:`start_many`."""
        return self.start_many([node_id]).get(node_id, "")

    def start_many(self, node_ids: list[str]) -> dict[str, str]:
        """Start the nodes that are down, together. Returns the reason each node that refused
        to start gave: a corrupt store is then wiped and the node started empty, to catch up
        from its peers; any other failure leaves it down (and is reported in ``events``)."""
        launched: dict[str, tuple[int, int]] = {}
        for nid in node_ids:
            if nid in launched or self.running(nid):
                continue
            log_start = _size(Path(self.node(nid).log))
            pid = self.local.start(nid)
            self._track(pid)
            launched[nid] = (pid, log_start)
        deadline = time.monotonic() + START_WAIT_S
        pending = set(launched)
        with self.direct_client() as client:
            while pending and time.monotonic() < deadline:
                for nid in list(pending):
                    if exited(launched[nid][0]) or self._serving(client, nid):
                        pending.discard(nid)
                time.sleep(POLL_S)
        if pending:
            logger.warning(
                "nodes %s neither serve nor exited after %s s", sorted(pending), START_WAIT_S
            )
        reasons: dict[str, str] = {}
        for nid, (pid, log_start) in launched.items():
            if not exited(pid):
                continue
            reason = _last_error_line(Path(self.node(nid).log), log_start) or "exited at start"
            reasons[nid] = reason
            if CORRUPT_MARK not in reason.lower():
                # Not a damaged store (a bad config, a code bug): nothing to repair; stays down.
                logger.error("node=%s failed to start: %s", nid, reason)
                self.events.append(f"{nid} failed to start: {reason}")
                continue
            logger.warning("node=%s refused to start: %s; wiping it to re-sync", nid, reason)
            self.events.append(f"{nid} refused to start: {reason}; wiped and re-synced")
            self.wipe(nid)
            self._track(self.local.start(nid))
        return reasons

    def _serving(self, client: LogClient, node_id: str) -> bool:
        try:
            client.metadata(self.node(node_id).client_addr, timeout_s=METADATA_TIMEOUT_S)
        except ClientError:
            return False
        return True

    def add_member(self) -> str:
        """A new node (new id, its own certificate when secure) started empty: it joins as a
        learner through the leader's peer port, catches up and is promoted. It has no proxy
        links: the partitions of the run cut it only where it sends through a link of the
        leader whose address it was told (docs/JEPSEN.md)."""
        info = self.local.add_node(timeout_s=MEMBER_WAIT_S, extra=self.extra)
        pid = self.local.pid(info)
        if pid is not None:
            self._track(pid)
        return info.node_id

    def remove_member(self, node_id: str) -> None:
        """Remove ``node_id`` from the group (the leader hands over first), then stop it."""
        self.paused.discard(node_id)
        with contextlib.suppress(ClusterError):
            self.local.signal(node_id, signal.SIGCONT)
        self.local.remove_node(node_id, timeout_s=MEMBER_WAIT_S)

    def log_size(self, node_id: str) -> int:
        return _size(Path(self.node(node_id).log))

    def log_line(self, node_id: str, offset: int, needle: str) -> str:
        """The first line of the node's log after byte ``offset`` containing ``needle``."""
        try:
            with Path(self.node(node_id).log).open("rb") as fh:
                fh.seek(offset)
                text = fh.read().decode(errors="replace")
        except OSError:
            return ""
        return next((ln.strip()[:500] for ln in text.splitlines() if needle in ln), "")

    def wipe(self, node_id: str) -> None:
        shutil.rmtree(self.store_root(node_id), ignore_errors=True)

    def store_root(self, node_id: str) -> Path:
        return self.base / node_id

    def dledger_dir(self, node_id: str) -> Path:
        return self.store_root(node_id) / f"dledger-{node_id}"

    def promise_names(self, node_id: str) -> tuple[str, ...]:
        """The names, in the node's store directory, of its promise file and the temporary
        files of its rewrites (docs/FORMAT.md "Promise file"; the group under test keeps the
        default ``dLegerPromisePath``)."""
        root = self.store_root(node_id)
        stem = promise_path(root, node_id).name
        found = [p.name for p in root.iterdir() if p.name.startswith(stem)] if root.is_dir() else []
        return tuple(sorted({stem, *found}))

    def wait_not_repairing(self, node_ids: list[str], timeout_s: float) -> list[str]:
        """Wait until each node answers and is not repairing (docs/RAFT.md section 11); the
        ones that still were not when ``timeout_s`` ran out."""
        deadline = time.monotonic() + timeout_s
        pending = list(node_ids)
        with self.direct_client() as client:
            while pending:
                for nid in list(pending):
                    with contextlib.suppress(ClientError):
                        md = client.metadata(self.node(nid).client_addr, METADATA_TIMEOUT_S)
                        if not md.repairing:
                            pending.remove(nid)
                if not pending or time.monotonic() >= deadline:
                    break
                time.sleep(POLL_S)
        return pending

    def wait_promised(self, node_id: str, index: int, timeout_s: float) -> int:
        """Wait until the node has acknowledged (promised, docs/RAFT.md section 11) entries up
        to ``index``; the highest promised index it answered (0: it never answered)."""
        addr = self.node(node_id).client_addr
        deadline = time.monotonic() + timeout_s
        seen = 0
        with self.direct_client() as client:
            while time.monotonic() < deadline:
                with contextlib.suppress(ClientError):
                    seen = max(seen, client.metadata(addr, METADATA_TIMEOUT_S).promised_index)
                if seen >= index:
                    break
                time.sleep(POLL_S)
        return seen

    def teardown(self) -> None:
        for nid in list(self.paused):
            self.resume(nid)
        self.local.down(grace_s=STOP_GRACE_S)

    # ------------------------------------------------------------------ state

    def direct_client(self) -> LogClient:
        return log_client(
            self.local.client_addrs, self.local.group, self.security, DIRECT_RPC_TIMEOUT_S
        )

    def proxied_client(self, timeout_s: float) -> LogClient:
        # A member added during the run has no proxy: it is reached directly.
        addrs = [self.proxy_client_addrs.get(i, self.node(i).client_addr) for i in self.ids]
        return log_client(addrs, self.local.group, self.security, timeout_s)

    def leader(self, client: LogClient) -> str | None:
        for n in self.local.nodes:
            if n.node_id in self.paused or not self.running(n.node_id):
                continue
            try:
                md = client.metadata(n.client_addr, timeout_s=METADATA_TIMEOUT_S)
            except ClientError:
                continue
            if md.role == "LEADER":
                return n.node_id
        return None


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _last_error_line(log: Path, offset: int) -> str:
    """Why a start failed: the last line written since ``offset`` that names an error (a
    refused start ends with its reason), else the last line."""
    try:
        with log.open("rb") as fh:
            fh.seek(offset)
            text = fh.read().decode(errors="replace")
    except OSError:
        return ""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    errors = [ln for ln in lines if "rror" in ln or "orrupt" in ln]
    pick = errors or lines
    return pick[-1][:500] if pick else ""
