"""The network-namespace backend (``mqjepsen run --net netns``): every node runs in its own
network namespace, and partitions are iptables DROP rules inside the namespaces, the way
Jepsen drops packets between hosts. Needs root, iproute2's ``ip`` and ``iptables``.

Layout of one run (``ID``: 5 random hex digits; ``X``: a free third octet):

- a bridge ``rmqbr{ID}`` in the root namespace with ``10.77.X.1/24``: the harness, its
  clients and the NameServer (bound to every address) are reached at, and talk from, there;
- per node ``nK`` a namespace ``rmqns-{ID}-nK`` whose ``eth0`` (a veth, root side
  ``rmqv{ID}nK`` on the bridge) has ``10.77.X.{K+2}``; the node binds its peer and client
  ports to that address, and the peers and clients use it directly (no proxy).

Links keep the proxy backend's names. Cutting ``a->b`` adds, in ``b``'s namespace,
``-A INPUT -s ip(a) -j DROP``: every packet from ``a`` to ``b`` is dropped (both TCP
directions of any connection between them stall, since ``a``'s ACKs are dropped too; that is
Jepsen's model). Cutting ``client->a`` drops, in ``a``'s namespace, TCP packets from the bridge
address to ``a``'s client port (the NameServer traffic keeps flowing). Every change rewrites
the whole filter table of the namespaces concerned with ``iptables-restore``; heal empties it.

Everything a run creates carries its ``ID`` and is removed by :meth:`NetnsNet.stop`; a run
killed hard leaves them behind, and :func:`clean_leftovers` (``mqjepsen netns-clean``) removes
those whose run is no longer alive (``/run/raftmq-netns/{ID}.json`` holds the run's pid and
its cluster directory, whose NameServer and nodes it also stops, by their pid files).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import secrets
import shutil
import signal
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from jepsen_like.errors import JepsenError
from jepsen_like.proxy import LinkFaults
from mqcluster.cluster import ClusterError, LocalCluster, NodeInfo

logger = logging.getLogger(__name__)

NS_PREFIX = "rmqns-"
BRIDGE_PREFIX = "rmqbr"
VETH_PREFIX = "rmqv"
# Hex digits of a run's id (interface names must fit in 15 characters: rmqv + id + n6).
RUN_ID_LEN = 5
# Where a live run records its pid (so that netns-clean leaves live runs alone) and its
# cluster directory (so that netns-clean can stop what the run left running).
STATE_DIR = Path("/run/raftmq-netns")
# The private range: 10.77.X.0/24, one X per run, the bridge at .1 and node K at .K+2.
SUBNET_PREFIX = "10.77"
SUBNET_OCTETS = range(1, 255)
SUBNET_BITS = 24
BRIDGE_HOST = 1
FIRST_NODE_HOST = 2
MAX_NODES = 7
# Seconds any one `ip` / `iptables` command may take.
CMD_TIMEOUT_S = 10.0
# The interface name of each node inside its namespace.
NODE_IFACE = "eth0"
CLIENT = "client"
# Seconds a leftover process gets to stop on SIGTERM before SIGKILL (netns-clean).
STOP_GRACE_S = 5.0

_NAME_RE = re.compile(
    rf"^(?:{NS_PREFIX}(?P<ns>[0-9a-f]{{{RUN_ID_LEN}}})-"
    rf"|{BRIDGE_PREFIX}(?P<br>[0-9a-f]{{{RUN_ID_LEN}}})$"
    rf"|{VETH_PREFIX}(?P<veth>[0-9a-f]{{{RUN_ID_LEN}}}))"
)


class NetnsError(JepsenError):
    """A namespace or rule operation failed; one line."""


def _run(args: list[str], stdin: str | None = None) -> str:
    try:
        proc = subprocess.run(
            args,
            input=stdin,
            capture_output=True,
            text=True,
            timeout=CMD_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise NetnsError(f"{' '.join(args)}: {exc}") from None
    if proc.returncode != 0:
        raise NetnsError(f"{' '.join(args)}: {proc.stderr.strip() or proc.returncode}")
    return proc.stdout


def _ip(*args: str) -> str:
    return _run(["ip", *args])


def _in_ns(ns: str, *args: str, stdin: str | None = None) -> str:
    return _run(["ip", "netns", "exec", ns, *args], stdin=stdin)


def check_netns() -> str:
    """Why the backend cannot run here (one line), or "" when it can: root, ``ip``,
    ``iptables``, and iptables actually working inside a namespace (a probe one)."""
    if os.geteuid() != 0:
        return f"needs root (euid {os.geteuid()})"
    for tool, hint in (("ip", "iproute2"), ("iptables", "apt-get install iptables")):
        if shutil.which(tool) is None:
            return f"needs `{tool}` on PATH ({hint})"
    probe = f"{NS_PREFIX}{secrets.token_hex(RUN_ID_LEN)[:RUN_ID_LEN]}-probe"
    try:
        _ip("netns", "add", probe)
    except NetnsError as exc:
        return f"cannot create a network namespace: {exc}"
    try:
        _in_ns(probe, "iptables", "-w", "-S", "INPUT")
    except NetnsError as exc:
        return f"iptables does not work inside a namespace: {exc}"
    finally:
        with contextlib.suppress(NetnsError):
            _ip("netns", "del", probe)
    return ""


@dataclass(slots=True)
class NodeNet:
    node_id: str
    ns: str
    veth: str
    ip: str


@dataclass(slots=True)
class NetLink:
    """A directed link: ``src`` a node id or ``client``; ``port``: for a client link, the
    destination's client port (peer links drop everything from ``src``)."""

    name: str
    src: str
    dst: str
    port: int = 0
    faults: LinkFaults = field(default_factory=LinkFaults)
    cuts: int = 0


class NetnsNet:
    """One run's namespaces, bridge and rules. ``start()``, ``add_node()`` per node,
    ``add_link()`` per link, fault calls, ``stop()`` (always)."""

    backend = "netns"

    def __init__(self, cluster_dir: Path | None = None) -> None:
        self.cluster_dir = cluster_dir
        self.run_id = secrets.token_hex(RUN_ID_LEN)[:RUN_ID_LEN]
        self.bridge = f"{BRIDGE_PREFIX}{self.run_id}"
        self.subnet = ""
        self.host_ip = ""
        self.nodes: dict[str, NodeNet] = {}
        self.links: dict[str, NetLink] = {}
        self._started = False

    @property
    def prefix(self) -> str:
        """The part of every namespace name of this run."""
        return f"{NS_PREFIX}{self.run_id}-"

    def describe(self) -> dict[str, object]:
        return {
            "backend": self.backend,
            "run_id": self.run_id,
            "bridge": self.bridge,
            "subnet": self.subnet,
            "namespaces": {n.node_id: n.ns for n in self.nodes.values()},
            "addresses": {n.node_id: n.ip for n in self.nodes.values()},
        }

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        STATE_DIR.mkdir(parents=True, exist_ok=True)
        _state_file(self.run_id).write_text(
            json.dumps({"pid": os.getpid(), "cluster_dir": str(self.cluster_dir or "")})
        )
        self._started = True
        try:
            octet = _free_octet()
            self.subnet = f"{SUBNET_PREFIX}.{octet}.0/{SUBNET_BITS}"
            self.host_ip = f"{SUBNET_PREFIX}.{octet}.{BRIDGE_HOST}"
            _ip("link", "add", self.bridge, "type", "bridge")
            _ip("addr", "add", f"{self.host_ip}/{SUBNET_BITS}", "dev", self.bridge)
            _ip("link", "set", self.bridge, "up")
        except BaseException:
            self.stop()
            raise
        logger.info("netns: bridge %s %s (run id %s)", self.bridge, self.subnet, self.run_id)

    def add_node(self, node_id: str) -> str:
        """Create the node's namespace and veth; returns its address."""
        if len(self.nodes) >= MAX_NODES:
            raise NetnsError(f"at most {MAX_NODES} nodes")
        host = FIRST_NODE_HOST + len(self.nodes)
        ip = self.host_ip.rsplit(".", 1)[0] + f".{host}"
        node = NodeNet(
            node_id, f"{self.prefix}{node_id}", f"{VETH_PREFIX}{self.run_id}{node_id}", ip
        )
        self.nodes[node_id] = node
        peer = f"{node.veth}p"
        _ip("netns", "add", node.ns)
        _ip("link", "add", node.veth, "type", "veth", "peer", "name", peer)
        _ip("link", "set", peer, "netns", node.ns)
        _ip("link", "set", node.veth, "master", self.bridge, "up")
        _in_ns(node.ns, "ip", "link", "set", peer, "name", NODE_IFACE)
        _in_ns(node.ns, "ip", "addr", "add", f"{ip}/{SUBNET_BITS}", "dev", NODE_IFACE)
        _in_ns(node.ns, "ip", "link", "set", NODE_IFACE, "up")
        _in_ns(node.ns, "ip", "link", "set", "lo", "up")
        logger.info("netns: %s in %s at %s", node_id, node.ns, ip)
        return ip

    def add_link(self, name: str, src: str, dst: str, port: int = 0) -> None:
        assert name not in self.links, name
        assert dst in self.nodes and (src == CLIENT or src in self.nodes), name
        self.links[name] = NetLink(name, src, dst, port)

    def stop(self) -> None:
        """Remove every namespace, veth and the bridge of this run (idempotent). Processes
        still inside a namespace (a node the teardown could not stop) are SIGKILLed first."""
        if not self._started:
            return
        try:
            names = sorted(ns for ns in _list_netns() if ns.startswith(self.prefix))
        except NetnsError:
            names = [n.ns for n in self.nodes.values()]
        errors = _remove(names, [self.bridge] + [n.veth for n in self.nodes.values()])
        with contextlib.suppress(OSError):
            _state_file(self.run_id).unlink()
        self._started = False
        if errors:
            logger.error("netns cleanup of run %s: %s", self.run_id, "; ".join(errors))
            raise NetnsError(f"cleanup incomplete (run `mqjepsen netns-clean`): {errors[0]}")
        logger.info("netns: removed run %s", self.run_id)

    # ------------------------------------------------------------------ faults

    def set_faults(self, names: list[str] | tuple[str, ...], faults: LinkFaults | None) -> None:
        """Cut (or, with None, heal) every named link. Latency and bandwidth are not modelled
        by this backend (no ``tc netem`` here): asking for them is an error."""
        wanted = list(names)
        unknown = [n for n in wanted if n not in self.links]
        if unknown:
            raise KeyError(f"unknown links {unknown}")
        f = LinkFaults() if faults is None else faults
        if f.latency_ms or f.jitter_ms or f.bandwidth_bytes_per_s:
            raise NetnsError("the netns backend cuts links only (no latency or bandwidth)")
        touched: set[str] = set()
        for name in wanted:
            link = self.links[name]
            if f.cut and not link.faults.cut:
                link.cuts += 1
            link.faults = LinkFaults(cut=f.cut)
            touched.add(link.dst)
        self._apply(sorted(touched))

    def cut(self, names: list[str]) -> None:
        self.set_faults(names, LinkFaults(cut=True))

    def heal_all(self) -> None:
        for link in self.links.values():
            link.faults = LinkFaults()
        self._apply(sorted(self.nodes))

    def faulty(self) -> dict[str, LinkFaults]:
        return {n: lk.faults for n, lk in self.links.items() if not lk.faults.healthy()}

    def stats(self) -> dict[str, dict[str, int]]:
        return {n: {"cuts": lk.cuts} for n, lk in self.links.items()}

    def rules(self, node_id: str) -> list[str]:
        """The INPUT rules ``node_id``'s namespace should have now."""
        out = []
        for link in self.links.values():
            if link.dst != node_id or not link.faults.cut:
                continue
            if link.src == CLIENT:
                out.append(f"-A INPUT -s {self.host_ip}/32 -p tcp --dport {link.port} -j DROP")
            else:
                out.append(f"-A INPUT -s {self.nodes[link.src].ip}/32 -j DROP")
        return out

    def _apply(self, node_ids: list[str]) -> None:
        for nid in node_ids:
            rules = self.rules(nid)
            table = "\n".join(["*filter", ":INPUT ACCEPT [0:0]", *rules, "COMMIT", ""])
            _in_ns(self.nodes[nid].ns, "iptables-restore", "-w", stdin=table)
            logger.log(logging.INFO if rules else logging.DEBUG, "netns: %s drops %s", nid, rules)


# ---------------------------------------------------------------------- nodes in namespaces


@dataclass(frozen=True, slots=True)
class NetnsNodeInfo(NodeInfo):
    """A node bound to its namespace's address instead of 127.0.0.1."""

    host: str = "127.0.0.1"

    @property
    def client_addr(self) -> str:
        return f"{self.host}:{self.client_port}"


class NetnsLocalCluster(LocalCluster):
    """:class:`LocalCluster` whose nodes start inside their namespaces. ``ip netns exec``
    execs the command (no fork), so the recorded pid is the broker's python itself and
    SIGKILL / SIGSTOP reach it."""

    def __init__(self, base_dir: Path, net: NetnsNet) -> None:
        super().__init__(base_dir)
        self.net = net

    def place(self, node_id: str, host: str) -> None:
        """Record that ``node_id`` listens on ``host`` (after :meth:`configure`)."""
        self.nodes = [
            NetnsNodeInfo(
                n.node_id, n.client_port, n.peer_port, n.conf, n.log, n.pid_file, host=host
            )
            if n.node_id == node_id
            else n
            for n in self.nodes
        ]

    def node_argv(self, n: NodeInfo) -> list[str]:
        return ["ip", "netns", "exec", self.net.nodes[n.node_id].ns, *super().node_argv(n)]


# ---------------------------------------------------------------------- leftovers


def _list_netns() -> list[str]:
    return [line.split()[0] for line in _ip("netns", "list").splitlines() if line.strip()]


def _list_links() -> list[str]:
    names = []
    for line in _ip("-o", "link", "show").splitlines():
        parts = line.split(":", 2)
        if len(parts) >= 2:
            names.append(parts[1].strip().split("@", 1)[0])
    return names


def _free_octet() -> int:
    """A third octet no address or route of the root namespace uses; a random one, so that
    runs starting at the same moment are unlikely to pick the same."""
    text = _ip("-o", "-4", "addr", "show") + "\n" + _ip("-4", "route", "show")
    taken = {int(m) for m in re.findall(rf"\b{re.escape(SUBNET_PREFIX)}\.(\d+)\.", text)}
    free = [o for o in SUBNET_OCTETS if o not in taken]
    if not free:
        raise NetnsError(f"no free {SUBNET_PREFIX}.X.0/{SUBNET_BITS} subnet")
    return secrets.choice(free)


def _remove(namespaces: list[str], links: list[str]) -> list[str]:
    """Kill what runs inside ``namespaces``, delete them, then the ``links`` that still
    exist; returns the errors (it tries everything)."""
    errors: list[str] = []
    for ns in namespaces:
        try:
            pids = [int(p) for p in _ip("netns", "pids", ns).split()]
        except (NetnsError, ValueError) as exc:
            pids = []
            errors.append(str(exc))
        for pid in pids:
            logger.warning("netns: SIGKILL pid %s left in %s", pid, ns)
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        try:
            _ip("netns", "del", ns)
        except NetnsError as exc:
            errors.append(str(exc))
    try:
        present = set(_list_links())
    except NetnsError as exc:
        return [*errors, str(exc)]
    for name in links:
        if name in present:
            try:
                _ip("link", "del", name)
            except NetnsError as exc:
                # a veth goes away with its namespace's end, possibly while we look
                if "Cannot find device" not in str(exc):
                    errors.append(str(exc))
    return errors


def _state_file(run_id: str) -> Path:
    return STATE_DIR / f"{run_id}.json"


def _run_state(run_id: str) -> tuple[int, str]:
    """The pid and cluster directory a run recorded (0, "" if unknown)."""
    try:
        data = json.loads(_state_file(run_id).read_text())
        return int(data["pid"]), str(data["cluster_dir"])
    except (OSError, ValueError, KeyError, TypeError):
        return 0, ""


def _run_alive(run_id: str) -> bool:
    pid, _ = _run_state(run_id)
    try:
        stat = Path(f"/proc/{pid}/stat").read_text() if pid else ""
    except OSError:
        return False
    return bool(stat) and stat.rsplit(")", 1)[1].split()[0] != "Z"


def leftovers() -> dict[str, list[str]]:
    """Run id -> the namespaces and links of that run that exist now."""
    found: dict[str, list[str]] = {}
    for name in _list_netns() + _list_links():
        m = _NAME_RE.match(name)
        if m:
            rid = m.group("ns") or m.group("br") or m.group("veth")
            found.setdefault(rid, []).append(name)
    return found


def clean_leftovers(force: bool = False) -> tuple[list[str], list[str]]:
    """Remove the namespaces, veths and bridges of runs that are not alive (all with
    ``force``). Returns (removed names, errors)."""
    removed: list[str] = []
    errors: list[str] = []
    for rid, names in sorted(leftovers().items()):
        if not force and _run_alive(rid):
            logger.info("netns: run %s is alive (pid file); left alone", rid)
            continue
        _, cluster_dir = _run_state(rid)
        if cluster_dir and (Path(cluster_dir) / "cluster.json").exists():
            # the NameServer (root namespace) and any node: only the pids the run recorded
            try:
                stopped = LocalCluster(cluster_dir).down(grace_s=STOP_GRACE_S)
            except (OSError, ValueError, KeyError, ClusterError) as exc:
                # ClusterError: a cluster.json this release cannot read (one of a newer one)
                errors.append(f"stopping the processes of {cluster_dir}: {exc}")
            else:
                logger.info("netns: run %s: stopped %s (SIGKILLed %s)", rid, cluster_dir, stopped)
        namespaces = [n for n in names if n.startswith(NS_PREFIX)]
        links = sorted(n for n in names if not n.startswith(NS_PREFIX))
        # bridges last: a veth is gone with its namespace
        links.sort(key=lambda n: n.startswith(BRIDGE_PREFIX))
        errs = _remove(namespaces, links)
        errors += errs
        removed += names
        with contextlib.suppress(OSError):
            _state_file(rid).unlink()
    # state files of dead runs that left no network objects
    with contextlib.suppress(OSError):
        for path in sorted(STATE_DIR.glob("*.json")):
            if not _run_alive(path.stem) or force:
                path.unlink()
    return removed, errors
