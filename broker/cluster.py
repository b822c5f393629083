"""``mqcluster``: a local broker group on 127.0.0.1 (our answer to RocketMQ's dledger/fast-try.sh).

    mqcluster up [--nodes 3] [--base-dir DIR]   write configs, start nodes, wait for a leader
    mqcluster status                            one row per node: role, term, commit index, ports
    mqcluster kill nX [--signal KILL]           SIGKILL (or STOP/CONT/TERM) one node
    mqcluster start nX                          start a node again with its config and data
    mqcluster down [--purge]                    stop every node (TERM, then KILL after a grace)

Nodes run as background processes with their logs in the base dir. Only processes this tool
started (their PIDs are in ``nX.pid``, checked against the command line) are ever signalled.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from broker.config import render_config
from dledger.server.client import ClientError, LogClient

DEFAULT_BASE_DIR = "/tmp/raftmq-cluster"
STATE_FILE = "cluster.json"
# Ports of the local group, as in DESIGN.md: client 10911, 10921, ...; peers 40911, 40912, ...
CLIENT_PORT_BASE = 10911
CLIENT_PORT_STEP = 10
PEER_PORT_BASE = 40911
# Seconds `up` and `start` wait for a leader; `down` waits after SIGTERM before SIGKILL.
LEADER_WAIT_S = 30.0
STOP_GRACE_S = 10.0
MAX_NODES = 7


class ClusterError(Exception):
    """A cluster operation that cannot be done; one line for the CLI."""


@dataclass(frozen=True, slots=True)
class NodeInfo:
    node_id: str
    client_port: int
    peer_port: int
    conf: str
    log: str
    pid_file: str

    @property
    def client_addr(self) -> str:
        return f"127.0.0.1:{self.client_port}"


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _read_pid(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def _pid_alive(pid: int, conf: str) -> bool:
    """True if ``pid`` is a live (not zombie) process running the node with ``conf``."""
    with contextlib.suppress(ChildProcessError):
        done, _ = os.waitpid(pid, os.WNOHANG)  # reap it if it is our child and exited
        if done == pid:
            return False
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    state = stat.rsplit(")", 1)[1].split()[0]
    return state != "Z" and conf.encode() in cmdline


class LocalCluster:
    """A local group described by ``{base_dir}/cluster.json``."""

    def __init__(self, base_dir: str | os.PathLike[str]) -> None:
        self.base = Path(base_dir).resolve()
        self.group = ""
        self.nodes: list[NodeInfo] = []
        state = self.base / STATE_FILE
        if state.exists():
            data = json.loads(state.read_text())
            self.group = data["group"]
            self.nodes = [NodeInfo(**n) for n in data["nodes"]]

    # ------------------------------------------------------------------ setup

    def configure(
        self,
        nodes: int = 3,
        *,
        group: str = "broker-a",
        auto_ports: bool = False,
        extra: dict[str, str] | None = None,
    ) -> None:
        """Write one broker.conf per node and the state file."""
        if not 1 <= nodes <= MAX_NODES:
            raise ClusterError(f"--nodes must be in [1, {MAX_NODES}], got {nodes}")
        if self.nodes and any(self.pid(n) for n in self.nodes):
            raise ClusterError(f"a cluster is running in {self.base}; run 'mqcluster down' first")
        self.base.mkdir(parents=True, exist_ok=True)
        ids = [f"n{i}" for i in range(nodes)]
        if auto_ports:
            client_ports = [_free_port() for _ in ids]
            peer_ports = [_free_port() for _ in ids]
        else:
            client_ports = [CLIENT_PORT_BASE + CLIENT_PORT_STEP * i for i in range(nodes)]
            peer_ports = [PEER_PORT_BASE + i for i in range(nodes)]
        peers = ";".join(f"{i}-127.0.0.1:{p}" for i, p in zip(ids, peer_ports, strict=True))
        self.group = group
        self.nodes = []
        for node_id, cport, pport in zip(ids, client_ports, peer_ports, strict=True):
            conf = self.base / f"{node_id}.conf"
            values: dict[str, object] = {
                "brokerClusterName": "DefaultCluster",
                "brokerName": group,
                "enableDLegerCommitLog": "true",
                "dLegerGroup": group,
                "dLegerPeers": peers,
                "dLegerSelfId": node_id,
                "listenPort": cport,
                "storePathRootDir": str(self.base / node_id),
            }
            values.update(extra or {})
            conf.write_text(render_config(values))
            self.nodes.append(
                NodeInfo(
                    node_id,
                    cport,
                    pport,
                    str(conf),
                    str(self.base / f"{node_id}.log"),
                    str(self.base / f"{node_id}.pid"),
                )
            )
        (self.base / STATE_FILE).write_text(
            json.dumps({"group": group, "nodes": [asdict(n) for n in self.nodes]}, indent=2)
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

    def start(self, node_id: str) -> int:
        n = self.node(node_id)
        if self.pid(n) is not None:
            raise ClusterError(f"{node_id} is already running")
        with open(n.log, "ab") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "broker", "-c", n.conf],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        Path(n.pid_file).write_text(f"{proc.pid}\n")
        return proc.pid

    def signal(self, node_id: str, sig: signal.Signals = signal.SIGKILL) -> int:
        n = self.node(node_id)
        pid = self.pid(n)
        if pid is None:
            raise ClusterError(f"{node_id} is not running")
        os.kill(pid, sig)
        if sig is signal.SIGKILL:
            self._wait_gone(n, pid, 5.0)
        return pid

    def _wait_gone(self, n: NodeInfo, pid: int, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not _pid_alive(pid, n.conf):
                return True
            time.sleep(0.02)
        return False

    def up(self, wait_s: float = LEADER_WAIT_S) -> str:
        for n in self.nodes:
            if self.pid(n) is None:
                self.start(n.node_id)
        return self.wait_leader(wait_s)

    def down(self, grace_s: float = STOP_GRACE_S) -> list[str]:
        """Stop every running node; returns the ids that needed SIGKILL."""
        running = [(n, p) for n in self.nodes if (p := self.pid(n)) is not None]
        for _n, pid in running:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)  # a paused node cannot handle SIGTERM
                os.kill(pid, signal.SIGTERM)
        killed = []
        for n, pid in running:
            if not self._wait_gone(n, pid, grace_s):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                self._wait_gone(n, pid, 5.0)
                killed.append(n.node_id)
        for n in self.nodes:
            with contextlib.suppress(FileNotFoundError):
                Path(n.pid_file).unlink()
        return killed

    def purge(self) -> None:
        shutil.rmtree(self.base, ignore_errors=True)

    # ------------------------------------------------------------------ state

    def client(self) -> LogClient:
        return LogClient(self.client_addrs, group=self.group)

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
                time.sleep(0.05)
        raise ClusterError(f"no leader elected within {timeout_s:.0f} s; logs in {self.base}")

    def status_rows(self) -> list[dict[str, object]]:
        rows: list[dict[str, object]] = []
        with self.client() as client:
            for n in self.nodes:
                pid = self.pid(n)
                row: dict[str, object] = {
                    "node": n.node_id,
                    "pid": pid or "-",
                    "role": "DOWN" if pid is None else "?",
                    "term": "-",
                    "leader": "-",
                    "commit": "-",
                    "last": "-",
                    "client": n.client_port,
                    "peer": n.peer_port,
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
                rows.append(row)
        return rows


def format_table(rows: list[dict[str, object]]) -> str:
    if not rows:
        return "(no nodes)"
    cols = list(rows[0])
    widths = {c: max(len(c), *(len(str(r[c])) for r in rows)) for c in cols}
    lines = ["  ".join(c.upper().ljust(widths[c]) for c in cols)]
    lines += ["  ".join(str(r[c]).ljust(widths[c]) for c in cols) for r in rows]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="mqcluster", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--base-dir", default=DEFAULT_BASE_DIR, help="where configs, data, logs go")
    sub = parser.add_subparsers(dest="cmd", required=True)
    up = sub.add_parser("up", help="write configs, start the nodes, wait for a leader")
    up.add_argument("--nodes", type=int, default=3)
    up.add_argument("--group", default="broker-a")
    up.add_argument("--auto-ports", action="store_true", help="pick free ports")
    up.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="extra broker.conf key"
    )
    sub.add_parser("status", help="show every node")
    kill = sub.add_parser("kill", help="signal one node (default SIGKILL)")
    kill.add_argument("node")
    kill.add_argument("--signal", default="KILL", choices=["KILL", "TERM", "STOP", "CONT"])
    start = sub.add_parser("start", help="start one node again")
    start.add_argument("node")
    down = sub.add_parser("down", help="stop every node")
    down.add_argument("--purge", action="store_true", help="also delete the base dir")
    ns = parser.parse_args(argv)
    cluster = LocalCluster(ns.base_dir)
    try:
        if ns.cmd == "up":
            extra: dict[str, str] = {}
            for item in ns.set:
                key, sep, value = item.partition("=")
                if not sep:
                    parser.error(f"--set {item!r}: expected KEY=VALUE")
                extra[key] = value
            cluster.configure(ns.nodes, group=ns.group, auto_ports=ns.auto_ports, extra=extra)
            try:
                leader = cluster.up()
            except ClusterError:
                cluster.down()
                raise
            print(f"group {cluster.group}: leader {leader}; logs and data in {cluster.base}")
            print(format_table(cluster.status_rows()))
        elif ns.cmd == "status":
            if not cluster.nodes:
                raise ClusterError(f"no cluster in {cluster.base}; run 'mqcluster up'")
            rows = cluster.status_rows()
            print(format_table(rows))
            return 0 if any(r["role"] == "LEADER" for r in rows) else 1
        elif ns.cmd == "kill":
            pid = cluster.signal(ns.node, signal.Signals[f"SIG{ns.signal}"])
            print(f"sent SIG{ns.signal} to {ns.node} (pid {pid})")
        elif ns.cmd == "start":
            pid = cluster.start(ns.node)
            print(f"started {ns.node} (pid {pid})")
        elif ns.cmd == "down":
            killed = cluster.down()
            if killed:
                print(f"needed SIGKILL: {', '.join(killed)}")
            if ns.purge:
                cluster.purge()
            print("stopped")
    except ClusterError as exc:
        print(f"mqcluster: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
