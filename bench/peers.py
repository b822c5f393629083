"""The peers of the side-by-side benchmark (issue #10): a 3-member etcd and a 3-server NATS
JetStream (stream with 3 replicas, file storage), both on 127.0.0.1.

- ``install_commands()`` / ``python -m bench.peers install``: Debian's ``etcd-server`` and
  ``nats-server`` packages, and the ``nats-py`` client from PyPI when it is missing (what
  ``make bench-peers`` runs).
- ``EtcdCluster`` / ``NatsCluster``: context managers that start a fresh 3-member cluster on free
  ports in a temp dir (one data dir per member), wait until it serves, and always stop it
  (SIGTERM, then SIGKILL, each member by PID) and remove the temp dir.
- ``run_etcd`` / ``run_nats``: the load, in Python like our own: ``in_flight`` closed-loop
  senders (each sends one put/publish and waits for its acknowledgement before the next), spread
  over ``processes`` load-generator processes, ``size_bytes`` values, a warm-up, then
  ``seconds`` measured. Clients talk to the current leader (etcd) / the stream leader's server
  (NATS), as our producers talk to the group's leader.

Durability, as each peer is configured here (defaults, nothing tuned):

- etcd 3.4: a put is acknowledged once it is committed, i.e. appended to the WAL and fsynced on
  a majority of members (each member fsyncs its WAL once per batch of Raft entries it persists:
  group commit). The figure reported with each run counts those fsyncs.
- NATS JetStream 2.9: a publish is acknowledged once the stream's Raft group (R3) has the
  message on a majority of servers in their file stores, written but not fsynced; the file
  store fsyncs from a background timer (2 min by default; 2.9 has no option for it: 2.10 added
  ``jetstream { sync_interval }``, with ``always`` for an fsync per write). strace of all three
  servers under load shows no fsync at all. So an acknowledged message survives the crash of a
  minority of processes, not a power loss of the host. See docs/PERFORMANCE.md.

``python -m bench.peers run --seconds 5`` prints both peers' figures.
"""

from __future__ import annotations

import argparse
import array
import asyncio
import concurrent.futures
import contextlib
import importlib.util
import json
import logging
import math
import multiprocessing
import multiprocessing.process
import multiprocessing.queues
import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import types
import urllib.error
import urllib.request
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from multiprocessing.synchronize import Event as MpEvent
from pathlib import Path
from typing import Any

from bench import tune_gc
from bench.errors import BenchError
from prockit.processes import free_ports as free_ports_on
from prockit.processes import spawn_logged

log = logging.getLogger("bench.peers")

HOST = "127.0.0.1"
MEMBERS = 3
ETCD_BINARY = "etcd"
NATS_BINARY = "nats-server"
# Debian puts nats-server in /usr/sbin, which is not on a non-root user's PATH.
EXTRA_BIN_DIRS = ("/usr/sbin", "/usr/local/sbin", "/sbin")
APT_PACKAGES = {ETCD_BINARY: "etcd-server", NATS_BINARY: "nats-server"}
# systemd units the packages enable (and start, where services may start) on install.
APT_UNITS = {ETCD_BINARY: "etcd.service", NATS_BINARY: "nats-server.service"}
INSTALL_TIMEOUT_S = 900.0
# The NATS client the load uses, from PyPI when missing: the same pin as pyproject.toml's.
NATS_PY_REQUIREMENT = "nats-py==2.16.0"

# Cluster life cycle.
START_TIMEOUT_S = 60.0  # from spawning the members to a cluster that serves writes
STOP_GRACE_S = 10.0  # SIGTERM to exit, per member, before SIGKILL
KILL_WAIT_S = 5.0  # SIGKILL to exit, per member
POLL_INTERVAL_S = 0.1
HTTP_TIMEOUT_S = 2.0
LOG_TAIL_CHARS = 2000
ETCD_CLUSTER_TOKEN = "raftmq-bench"
NATS_CLUSTER_NAME = "raftmq-bench"
NATS_STREAM = "RAFTMQBENCH"
NATS_SUBJECT = "raftmq.bench"
# Upper bound on the stream's size (oldest messages go first past it); far above what one run
# writes (12,000 msg/s x 1 KiB x 60 s is 0.7 GiB), so it never discards during a run.
NATS_STREAM_MAX_BYTES = 8 << 30

# Load generation.
DEFAULT_PROCESSES = 2  # as many load-generator processes as the raftmq side uses (2 cores)
DEFAULT_WARMUP_S = 1.0  # load before the measured window (connections, leader, caches warm)
ETCD_CHANNELS_PER_PROCESS = 4  # gRPC channels (HTTP/2 connections) per process
NATS_CONNECTIONS_PER_PROCESS = 4  # NATS connections per process
OP_TIMEOUT_S = 10.0  # one put / publish, until its acknowledgement
ERROR_BACKOFF_S = 0.01  # after a failed op, so a dead peer does not become a busy loop
DRAIN_TIMEOUT_S = 15.0  # ops still in flight at the window's end, to finish
WORKER_READY_TIMEOUT_S = 60.0  # a load process: spawned, imported, connected
WORKER_EXIT_TIMEOUT_S = 10.0
WORKER_POLL_S = 0.5  # how often the harness checks that its load processes are alive
BYTES_PER_MB = 1_000_000  # MB/s is 10^6 bytes per second (as the raftmq side reports it)
ETCD_PUT_METHOD = "/etcdserverpb.KV/Put"
ETCD_PROTO_NAME = "raftmq_bench_etcd_kv.proto"
ETCD_PB2_MODULE = "raftmq_bench_etcd_kv_pb2"

# The subset of etcd's api/etcdserverpb/rpc.proto (3.4) that a put needs: same package, same
# message names and field numbers, so the bytes on the wire are etcd's own.
ETCD_KV_PROTO = """\
syntax = "proto3";
package etcdserverpb;

message ResponseHeader {
  uint64 cluster_id = 1;
  uint64 member_id = 2;
  int64 revision = 3;
  uint64 raft_term = 4;
}

message PutRequest {
  bytes key = 1;
  bytes value = 2;
  int64 lease = 3;
  bool prev_kv = 4;
  bool ignore_value = 5;
  bool ignore_lease = 6;
}

message PutResponse {
  ResponseHeader header = 1;
}

service KV {
  rpc Put(PutRequest) returns (PutResponse) {}
}
"""

RESULT_KEYS = ("ops_per_s", "mb_per_s", "p50_ms", "p99_ms", "p999_ms", "ops", "errors")


class PeerError(BenchError, RuntimeError):
    """A peer could not be installed, started or driven."""


# --------------------------------------------------------------------------------------------
# Binaries and installation


def find_binary(name: str) -> str | None:
    """The path of ``name`` on PATH or in the sbin dirs, or None."""
    found = shutil.which(name)
    if found:
        return found
    for d in EXTRA_BIN_DIRS:
        candidate = Path(d) / name
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    return None


def _nats_client_installed() -> bool:
    return importlib.util.find_spec("nats") is not None


def install_commands(
    *, missing: Sequence[str] | None = None, root: bool | None = None, systemd: bool | None = None
) -> list[list[str]]:
    """The commands that install the peers' Debian packages (``make bench-peers``).

    ``missing``: binaries to install (default: those not found now; none -> no commands).
    ``root``: whether we are root (default: the effective uid); if not, commands go via sudo.
    ``systemd``: whether systemd runs here (default: ``/run/systemd/system`` exists); then the
    services the packages just enabled and started are stopped and disabled again, since the
    benchmark starts its own clusters and a system etcd on :2379 must not be left behind.
    """
    if missing is None:
        missing = [b for b in APT_PACKAGES if find_binary(b) is None]
    if root is None:
        root = os.geteuid() == 0
    if systemd is None:
        systemd = Path("/run/systemd/system").is_dir()
    if not missing:
        return []
    unknown = [b for b in missing if b not in APT_PACKAGES]
    if unknown:
        raise ValueError(f"no package known for {unknown}")
    sudo = [] if root else ["sudo"]
    packages = [APT_PACKAGES[b] for b in missing]
    cmds = [
        [*sudo, "apt-get", "update"],
        [
            *sudo,
            "env",
            "DEBIAN_FRONTEND=noninteractive",
            "apt-get",
            "install",
            "-y",
            "--no-install-recommends",
            *packages,
        ],
    ]
    if systemd:
        cmds.append([*sudo, "systemctl", "disable", "--now", *[APT_UNITS[b] for b in missing]])
    return cmds


def client_install_commands(*, installed: bool | None = None) -> list[list[str]]:
    """The command that installs the NATS client (``NATS_PY_REQUIREMENT``, the pin of
    pyproject.toml's test extras) into this interpreter's environment when it is missing
    (``installed``: default, whether ``nats`` imports here). A plain install, never editable."""
    if installed is None:
        installed = _nats_client_installed()
    if installed:
        return []
    return [[sys.executable, "-m", "pip", "install", "--quiet", NATS_PY_REQUIREMENT]]


def install() -> None:
    """Runs ``install_commands()`` and ``client_install_commands()``; raises PeerError with a
    one-line reason on failure."""
    cmds = install_commands() + client_install_commands()
    if not cmds:
        log.info("etcd, nats-server and the nats-py client are already installed")
    deadline = time.monotonic() + INSTALL_TIMEOUT_S
    for cmd in cmds:
        left = deadline - time.monotonic()
        if left <= 0:
            raise PeerError(f"install took over {INSTALL_TIMEOUT_S:.0f} s")
        log.info("running: %s", " ".join(cmd))
        try:
            done = subprocess.run(
                cmd, capture_output=True, text=True, timeout=left, stdin=subprocess.DEVNULL
            )
        except FileNotFoundError as exc:
            raise PeerError(f"{cmd[0]} not found: {exc}") from exc
        except subprocess.TimeoutExpired as exc:
            raise PeerError(f"{' '.join(cmd)} took over {INSTALL_TIMEOUT_S:.0f} s") from exc
        if done.returncode != 0:
            last = (done.stderr.strip() or done.stdout.strip() or "?").splitlines()[-1]
            raise PeerError(f"{' '.join(cmd)} exited {done.returncode}: {last}")
    for binary in APT_PACKAGES:
        if find_binary(binary) is None:
            raise PeerError(f"{binary} still not found after installing")
    importlib.invalidate_caches()
    if not _nats_client_installed():
        raise PeerError("the nats-py client still does not import after installing")


def binary_version(binary: str) -> str:
    """``etcd 3.4.23`` / ``nats-server 2.9.10`` (``?`` if it cannot be told)."""
    path = find_binary(binary)
    if path is None:
        return f"{binary} ?"
    try:
        out = subprocess.run(
            [path, "--version"], capture_output=True, text=True, timeout=HTTP_TIMEOUT_S * 5
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        return f"{binary} ?"
    return f"{binary} {parse_version(out)}"


def parse_version(text: str) -> str:
    """The first ``X.Y.Z`` in ``text`` (``etcd Version: 3.4.23`` / ``nats-server: v2.9.10``)."""
    m = re.search(r"(\d+\.\d+\.\d+)", text)
    return m.group(1) if m else "?"


# --------------------------------------------------------------------------------------------
# Clusters


def free_ports(n: int) -> list[int]:
    """``n`` distinct free TCP ports on 127.0.0.1."""
    return free_ports_on(n, HOST)


def _http_get(url: str, data: bytes | None = None) -> tuple[int, str]:
    """(status, body) of a GET (or POST with ``data``) to 127.0.0.1; (0, error) if it failed."""
    assert url.startswith(f"http://{HOST}:"), url
    req = urllib.request.Request(url, data=data, method="POST" if data is not None else "GET")
    try:
        with urllib.request.urlopen(req, timeout=HTTP_TIMEOUT_S) as resp:
            return int(resp.status), resp.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as exc:
        return int(exc.code), exc.read().decode("utf-8", "replace")
    except (OSError, ValueError) as exc:
        return 0, str(exc)


@dataclass
class _Member:
    name: str
    data_dir: Path
    log_path: Path
    proc: subprocess.Popen[bytes] | None = None

    def log_tail(self) -> str:
        try:
            return self.log_path.read_text("utf-8", "replace")[-LOG_TAIL_CHARS:]
        except OSError:
            return ""


class _Cluster:
    """Start / stop of ``MEMBERS`` server processes in a temp dir; subclasses build commands."""

    binary = ""
    kind = ""

    def __init__(self, base_dir: str | Path | None = None) -> None:
        self._base_dir = base_dir
        self.root: Path | None = None
        self.members: list[_Member] = []

    @classmethod
    def available(cls) -> bool:
        """True if this peer can run here (binary found; for NATS also the nats-py client)."""
        return cls.unavailable_reason() is None

    @classmethod
    def unavailable_reason(cls) -> str | None:
        if find_binary(cls.binary) is None:
            return f"{cls.binary} not found (make bench-peers)"
        return None

    def __enter__(self) -> _Cluster:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        reason = self.unavailable_reason()
        if reason:
            raise PeerError(reason)
        self.root = Path(tempfile.mkdtemp(prefix=f"raftmq-peer-{self.kind}-", dir=self._base_dir))
        try:
            self._prepare()
            for i, m in enumerate(self.members):
                m.data_dir.mkdir(parents=True, exist_ok=True)
                # Same session as mqbench: a Ctrl-C stops the peers too.
                m.proc = spawn_logged(
                    self._command(i), m.log_path, env=self._env(), cwd=self.root, new_session=False
                )
                log.info("%s member %s started, pid %d", self.kind, m.name, m.proc.pid)
            self._wait_ready(time.monotonic() + START_TIMEOUT_S)
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        """Stops the members one at a time (SIGTERM, SIGKILL if still alive after STOP_GRACE_S),
        then removes the temp dir. One at a time: an etcd member stopped while its peers stop too
        waits seconds on a leader transfer that cannot happen; alone it exits in ~0.1 s."""
        for m in reversed(self.members):
            p = m.proc
            if p is None or p.poll() is not None:
                continue
            with contextlib.suppress(ProcessLookupError):
                p.send_signal(signal.SIGTERM)
            try:
                p.wait(STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                log.warning("%s pid %d ignored SIGTERM for %.0f s", self.kind, p.pid, STOP_GRACE_S)
                with contextlib.suppress(ProcessLookupError):
                    p.kill()
                try:
                    p.wait(KILL_WAIT_S)
                except subprocess.TimeoutExpired:
                    log.error("%s pid %d still alive after SIGKILL", self.kind, p.pid)
        for m in self.members:
            m.proc = None
        if self.root is not None:
            shutil.rmtree(self.root, ignore_errors=True)
            self.root = None

    def pids(self) -> list[int]:
        return [m.proc.pid for m in self.members if m.proc is not None]

    def _check_alive(self) -> None:
        for m in self.members:
            if m.proc is not None and m.proc.poll() is not None:
                raise PeerError(
                    f"{self.kind} member {m.name} exited with {m.proc.returncode} at start: "
                    f"{m.log_tail()}"
                )

    def _timeout(self, what: str) -> PeerError:
        tails = "\n".join(f"--- {m.name}:\n{m.log_tail()}" for m in self.members)
        return PeerError(f"{self.kind}: {what} within {START_TIMEOUT_S:.0f} s\n{tails}")

    def _prepare(self) -> None:
        raise NotImplementedError

    def _env(self) -> dict[str, str] | None:
        """The members' environment (None: this process's)."""
        return None

    def _command(self, index: int) -> list[str]:
        raise NotImplementedError

    def _wait_ready(self, deadline: float) -> None:
        raise NotImplementedError


def etcd_member_command(
    binary: str, index: int, data_dir: Path, client_ports: Sequence[int], peer_ports: Sequence[int]
) -> list[str]:
    """One etcd member's command line; defaults for everything that touches durability."""
    names = [f"etcd{i}" for i in range(len(client_ports))]
    initial = ",".join(f"{n}=http://{HOST}:{p}" for n, p in zip(names, peer_ports, strict=True))
    client = f"http://{HOST}:{client_ports[index]}"
    peer = f"http://{HOST}:{peer_ports[index]}"
    return [
        binary,
        "--name",
        names[index],
        "--data-dir",
        str(data_dir),
        "--listen-client-urls",
        client,
        "--advertise-client-urls",
        client,
        "--listen-peer-urls",
        peer,
        "--initial-advertise-peer-urls",
        peer,
        "--initial-cluster",
        initial,
        "--initial-cluster-state",
        "new",
        "--initial-cluster-token",
        ETCD_CLUSTER_TOKEN,
        "--logger",
        "zap",
        "--log-outputs",
        "stderr",
        "--log-level",
        "warn",
    ]


class EtcdCluster(_Cluster):
    """A fresh 3-member etcd on 127.0.0.1 (``--initial-cluster``, default fsync: WAL fsynced
    before a member acknowledges an entry), one data dir per member, torn down on exit."""

    binary = ETCD_BINARY
    kind = "etcd"

    def __init__(self, base_dir: str | Path | None = None) -> None:
        super().__init__(base_dir)
        self.client_ports: list[int] = []
        self.peer_ports: list[int] = []

    def __enter__(self) -> EtcdCluster:
        self.start()
        return self

    @property
    def endpoints(self) -> list[str]:
        """gRPC targets (``127.0.0.1:port``), one per member."""
        return [f"{HOST}:{p}" for p in self.client_ports]

    def _prepare(self) -> None:
        assert self.root is not None
        ports = free_ports(2 * MEMBERS)
        self.client_ports, self.peer_ports = ports[:MEMBERS], ports[MEMBERS:]
        self.members = [
            _Member(f"etcd{i}", self.root / f"etcd{i}", self.root / f"etcd{i}.log")
            for i in range(MEMBERS)
        ]

    def _command(self, index: int) -> list[str]:
        binary = find_binary(self.binary)
        assert binary is not None
        return etcd_member_command(
            binary, index, self.members[index].data_dir, self.client_ports, self.peer_ports
        )

    def _wait_ready(self, deadline: float) -> None:
        while time.monotonic() < deadline:
            self._check_alive()
            if all(self._healthy(p) for p in self.client_ports):
                log.info("etcd cluster ready on %s", ",".join(self.endpoints))
                return
            time.sleep(POLL_INTERVAL_S)
        raise self._timeout("no healthy cluster")

    @staticmethod
    def _healthy(port: int) -> bool:
        status, body = _http_get(f"http://{HOST}:{port}/health")
        return status == 200 and '"true"' in body

    def leader_endpoint(self) -> str:
        """The gRPC target of the current leader (by the members' Maintenance/Status)."""
        for port in self.client_ports:
            status, body = _http_get(f"http://{HOST}:{port}/v3/maintenance/status", b"{}")
            if status != 200:
                continue
            doc = json.loads(body)
            if str(doc.get("leader")) == str(doc.get("header", {}).get("member_id")):
                return f"{HOST}:{port}"
        raise PeerError("etcd: no member reports itself leader")

    def fsync_counts(self) -> dict[str, float]:
        """WAL fsyncs (count, seconds spent) and backend commits so far, summed over the
        members, from their /metrics."""
        total = {"wal_fsyncs": 0.0, "wal_fsync_s": 0.0, "backend_commits": 0.0}
        names = {
            "wal_fsyncs": "etcd_disk_wal_fsync_duration_seconds_count",
            "wal_fsync_s": "etcd_disk_wal_fsync_duration_seconds_sum",
            "backend_commits": "etcd_disk_backend_commit_duration_seconds_count",
        }
        for port in self.client_ports:
            status, body = _http_get(f"http://{HOST}:{port}/metrics")
            if status != 200:
                continue
            metrics = parse_prometheus(body)
            for key, metric in names.items():
                total[key] += metrics.get(metric, 0.0)
        return total


def parse_prometheus(text: str) -> dict[str, float]:
    """Unlabelled samples of a Prometheus text exposition (``name value`` lines)."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#") or "{" in line:
            continue
        parts = line.split()
        if len(parts) >= 2:
            with contextlib.suppress(ValueError):
                out[parts[0]] = float(parts[1])
    return out


def nats_server_config(
    index: int,
    store_dir: Path,
    client_ports: Sequence[int],
    cluster_ports: Sequence[int],
    http_ports: Sequence[int],
) -> str:
    """One NATS server's config: client, monitoring and route ports on 127.0.0.1, routes to the
    other members, JetStream with its own store dir (file store defaults: no per-message fsync)."""
    routes = "\n".join(
        f'    "nats-route://{HOST}:{p}"' for i, p in enumerate(cluster_ports) if i != index
    )
    return (
        f'server_name: "nats{index}"\n'
        f'listen: "{HOST}:{client_ports[index]}"\n'
        f'http: "{HOST}:{http_ports[index]}"\n'
        "jetstream {\n"
        f"  store_dir: {json.dumps(str(store_dir))}\n"
        "}\n"
        "cluster {\n"
        f'  name: "{NATS_CLUSTER_NAME}"\n'
        f'  listen: "{HOST}:{cluster_ports[index]}"\n'
        "  routes: [\n"
        f"{routes}\n"
        "  ]\n"
        "}\n"
    )


class NatsCluster(_Cluster):
    """A fresh 3-server NATS cluster with JetStream on 127.0.0.1 and one stream
    (``NATS_STREAM`` on ``NATS_SUBJECT``) of 3 replicas in file storage, torn down on exit."""

    binary = NATS_BINARY
    kind = "nats"

    def __init__(self, base_dir: str | Path | None = None) -> None:
        super().__init__(base_dir)
        self.client_ports: list[int] = []
        self.cluster_ports: list[int] = []
        self.http_ports: list[int] = []
        self.stream_leader: str | None = None

    def __enter__(self) -> NatsCluster:
        self.start()
        return self

    @classmethod
    def unavailable_reason(cls) -> str | None:
        reason = super().unavailable_reason()
        if reason is None and not _nats_client_installed():
            reason = "the nats-py client is not installed (pip install nats-py)"
        return reason

    @property
    def urls(self) -> list[str]:
        return [f"nats://{HOST}:{p}" for p in self.client_ports]

    def leader_url(self) -> str:
        """The client URL of the server that leads the stream (where publishes are stored)."""
        for i, m in enumerate(self.members):
            if m.name == self.stream_leader:
                return self.urls[i]
        return self.urls[0]

    def _prepare(self) -> None:
        assert self.root is not None
        ports = free_ports(3 * MEMBERS)
        self.client_ports = ports[:MEMBERS]
        self.cluster_ports = ports[MEMBERS : 2 * MEMBERS]
        self.http_ports = ports[2 * MEMBERS :]
        self.members = []
        for i in range(MEMBERS):
            m = _Member(f"nats{i}", self.root / f"nats{i}", self.root / f"nats{i}.log")
            conf = nats_server_config(
                i, m.data_dir, self.client_ports, self.cluster_ports, self.http_ports
            )
            (self.root / f"nats{i}.conf").write_text(conf)
            self.members.append(m)

    def _command(self, index: int) -> list[str]:
        binary = find_binary(self.binary)
        assert binary is not None and self.root is not None
        return [binary, "-c", str(self.root / f"nats{index}.conf")]

    def _wait_ready(self, deadline: float) -> None:
        while time.monotonic() < deadline:
            self._check_alive()
            if all(_http_get(f"http://{HOST}:{p}/healthz")[0] == 200 for p in self.http_ports):
                break
            time.sleep(POLL_INTERVAL_S)
        else:
            raise self._timeout("no healthy JetStream")
        # The JetStream meta group may still be electing: create the stream until it takes.
        left = max(1.0, deadline - time.monotonic())
        with concurrent.futures.ThreadPoolExecutor(1) as pool:  # works inside a running loop
            fut = pool.submit(asyncio.run, _nats_create_stream(self.urls, deadline))
            try:
                self.stream_leader = fut.result(timeout=left + HTTP_TIMEOUT_S)
            except concurrent.futures.TimeoutError as exc:
                raise self._timeout("stream not created") from exc
        if self.stream_leader is None:
            raise self._timeout("stream has no leader with all replicas current")
        log.info("NATS cluster ready, stream %s led by %s", NATS_STREAM, self.stream_leader)


async def _nats_create_stream(urls: list[str], deadline: float) -> str | None:
    """Creates the R3 file stream; the name of its leader once every replica is current."""
    import nats
    from nats.js.api import StorageType

    nc = await nats.connect(servers=urls, connect_timeout=HTTP_TIMEOUT_S, max_reconnect_attempts=-1)
    try:
        js = nc.jetstream(timeout=HTTP_TIMEOUT_S)
        last: Exception | None = None
        while time.monotonic() < deadline:
            try:
                try:
                    info = await js.stream_info(NATS_STREAM)
                except nats.js.errors.NotFoundError:
                    info = await js.add_stream(
                        name=NATS_STREAM,
                        subjects=[NATS_SUBJECT],
                        storage=StorageType.FILE,
                        num_replicas=MEMBERS,
                        max_bytes=NATS_STREAM_MAX_BYTES,
                    )
                c = info.cluster
                if (
                    c is not None
                    and c.leader
                    and len(c.replicas or []) == MEMBERS - 1
                    and all(r.current for r in c.replicas or [])
                ):
                    return c.leader
            except (TimeoutError, nats.errors.Error) as exc:
                last = exc
            await asyncio.sleep(POLL_INTERVAL_S * 2)
        log.warning("NATS stream not ready before the deadline: %r", last)
        return None
    finally:
        await nc.close()


# --------------------------------------------------------------------------------------------
# Statistics


def percentile(ordered: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (``q`` in [0, 1]) of already sorted values; 0.0 if empty."""
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"q must be in [0, 1], got {q}")
    if not ordered:
        return 0.0
    rank = max(1, math.ceil(q * len(ordered)))
    return float(ordered[rank - 1])


def split_in_flight(in_flight: int, processes: int) -> list[int]:
    """``in_flight`` senders over at most ``processes`` processes, as even as can be."""
    if in_flight <= 0 or processes <= 0:
        raise ValueError("in_flight and processes must be > 0")
    n = min(in_flight, processes)
    return [in_flight // n + (1 if i < in_flight % n else 0) for i in range(n)]


def summarize(
    latencies_ms: Sequence[float], errors: int, seconds: float, size_bytes: int, conditions: str
) -> dict[str, Any]:
    """The result dict of ``run_etcd`` / ``run_nats`` from the measured window's samples."""
    if seconds <= 0:
        raise ValueError("seconds must be > 0")
    ordered = sorted(latencies_ms)
    ops = len(ordered)
    ops_per_s = ops / seconds
    return {
        "ops_per_s": ops_per_s,
        "mb_per_s": ops_per_s * size_bytes / BYTES_PER_MB,
        "p50_ms": percentile(ordered, 0.50),
        "p99_ms": percentile(ordered, 0.99),
        "p999_ms": percentile(ordered, 0.999),
        "ops": ops,
        "errors": errors,
        "conditions": conditions,
    }


# --------------------------------------------------------------------------------------------
# Load generation (runs in spawned processes)


@dataclass
class _WorkerSpec:
    peer: str  # "etcd" or "nats"
    index: int
    target: str  # etcd: "127.0.0.1:port"; nats: "nats://127.0.0.1:port"
    senders: int
    size_bytes: int
    connections: int
    stub_dir: str = ""
    extra: dict[str, str] = field(default_factory=dict)


@dataclass
class _Tally:
    latencies_ms: array.array[float] = field(default_factory=lambda: array.array("d"))
    errors: int = 0
    first_error: str = ""

    def error(self, exc: BaseException) -> None:
        self.errors += 1
        if not self.first_error:
            self.first_error = f"{type(exc).__name__}: {exc}"[:500]


SendFn = Callable[[int, int], Awaitable[None]]


async def drive(send: SendFn, senders: int, start_at: float, stop_at: float) -> _Tally:
    """``senders`` closed-loop coroutines call ``send(sender, seq)`` from now until ``stop_at``
    (``time.monotonic()``); ops completed in [start_at, stop_at] are counted, each with its
    latency; ops still in flight at ``stop_at`` finish (DRAIN_TIMEOUT_S) but do not count."""
    tally = _Tally()

    async def sender(k: int) -> None:
        seq = 0
        while True:
            t0 = time.monotonic()
            if t0 >= stop_at:
                return
            failure: BaseException | None = None
            try:
                await send(k, seq)
            except Exception as exc:
                failure = exc
            t1 = time.monotonic()
            seq += 1
            if start_at <= t1 <= stop_at:
                if failure is None:
                    tally.latencies_ms.append((t1 - t0) * 1000.0)
                else:
                    tally.error(failure)
            if failure is not None:
                await asyncio.sleep(ERROR_BACKOFF_S)

    tasks = [asyncio.ensure_future(sender(k)) for k in range(senders)]
    left = max(0.0, stop_at - time.monotonic()) + DRAIN_TIMEOUT_S
    _done, pending = await asyncio.wait(tasks, timeout=left)
    for t in pending:
        t.cancel()
    if pending:
        log.warning("%d senders still busy %.0f s after the window", len(pending), DRAIN_TIMEOUT_S)
        await asyncio.gather(*pending, return_exceptions=True)
    return tally


def generate_etcd_stubs(out_dir: Path) -> Path:
    """Writes ETCD_KV_PROTO and compiles it with grpc_tools.protoc into ``out_dir``; returns
    the generated ``_pb2`` module's path."""
    from grpc_tools import protoc

    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / ETCD_PROTO_NAME).write_text(ETCD_KV_PROTO)
    rc = protoc.main(
        ["grpc_tools.protoc", f"-I{out_dir}", f"--python_out={out_dir}", ETCD_PROTO_NAME]
    )
    path = out_dir / f"{ETCD_PB2_MODULE}.py"
    if rc != 0 or not path.is_file():
        raise PeerError(f"protoc failed ({rc}) on {ETCD_PROTO_NAME}")
    return path


def _load_module(name: str, path: Path) -> types.ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise PeerError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


async def _etcd_session(
    spec: _WorkerSpec, ready: Callable[[], Awaitable[tuple[float, float]]]
) -> _Tally:
    import grpc

    pb = _load_module(ETCD_PB2_MODULE, Path(spec.stub_dir) / f"{ETCD_PB2_MODULE}.py")
    channels = [grpc.aio.insecure_channel(spec.target) for _ in range(spec.connections)]
    try:
        puts = [
            ch.unary_unary(
                ETCD_PUT_METHOD,
                request_serializer=pb.PutRequest.SerializeToString,
                response_deserializer=pb.PutResponse.FromString,
            )
            for ch in channels
        ]
        for ch in channels:
            await asyncio.wait_for(ch.channel_ready(), WORKER_READY_TIMEOUT_S)
        value = os.urandom(spec.size_bytes)
        prefix = f"raftmq-bench/{spec.index}/".encode()

        async def send(k: int, seq: int) -> None:
            req = pb.PutRequest(key=b"%s%d/%d" % (prefix, k, seq), value=value)
            await puts[k % len(puts)](req, timeout=OP_TIMEOUT_S)

        start_at, stop_at = await ready()
        return await drive(send, spec.senders, start_at, stop_at)
    finally:
        for ch in channels:
            await ch.close()


async def _nats_session(
    spec: _WorkerSpec, ready: Callable[[], Awaitable[tuple[float, float]]]
) -> _Tally:
    import nats

    conns = [
        await nats.connect(
            servers=[spec.target],
            connect_timeout=WORKER_READY_TIMEOUT_S,
            max_reconnect_attempts=1,
        )
        for _ in range(spec.connections)
    ]
    try:
        jss = [nc.jetstream(timeout=OP_TIMEOUT_S) for nc in conns]
        payload = os.urandom(spec.size_bytes)

        async def send(k: int, seq: int) -> None:
            await jss[k % len(jss)].publish(NATS_SUBJECT, payload, timeout=OP_TIMEOUT_S)

        start_at, stop_at = await ready()
        return await drive(send, spec.senders, start_at, stop_at)
    finally:
        for nc in conns:
            with contextlib.suppress(Exception):
                await nc.close()


def _session_of(peer: str) -> Callable[..., Coroutine[Any, Any, _Tally]]:
    """The load session of ``peer``: etcd, nats, or the floor (``bench.floor``)."""
    if peer == "floor":
        from bench.floor import floor_session  # bench.floor imports this module

        return floor_session
    return _etcd_session if peer == "etcd" else _nats_session


def _worker_entry(
    spec: _WorkerSpec,
    results: multiprocessing.queues.Queue[tuple[str, int, Any]],
    go: MpEvent,
    window: Any,
) -> None:
    """A load process: connect, report ready, wait for ``go``, drive, report the tally."""
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s: %(message)s")
    tune_gc()

    async def ready() -> tuple[float, float]:
        results.put(("ready", spec.index, None))
        started = await asyncio.to_thread(go.wait, WORKER_READY_TIMEOUT_S)
        if not started:
            raise PeerError("no go signal from the harness")
        return float(window[0]), float(window[1])

    session = _session_of(spec.peer)
    try:
        tally = asyncio.run(session(spec, ready))
    except BaseException as exc:
        results.put(("failed", spec.index, f"{type(exc).__name__}: {exc}"[:500]))
        return
    results.put(
        ("done", spec.index, (tally.latencies_ms.tobytes(), tally.errors, tally.first_error))
    )


@dataclass
class _LoadOutcome:
    latencies_ms: list[float]
    errors: int
    first_error: str
    load_avg_start: tuple[float, float, float]
    load_avg_end: tuple[float, float, float]
    peer_cpu_s: float
    loadgen_cpu_s: float
    processes: int
    samples: dict[str, dict[str, float]]


def _cpu_seconds(pids: Sequence[int]) -> float:
    """User + system CPU seconds of ``pids`` so far (from /proc; 0 for a gone pid)."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        total += (int(fields[11]) + int(fields[12])) / tick
    return total


def _run_load(
    specs: list[_WorkerSpec],
    warmup_s: float,
    seconds: float,
    peer_pids: Sequence[int],
    sample: Callable[[], dict[str, float]] | None = None,
) -> _LoadOutcome:
    """Spawns one process per spec, runs them in one common window, merges their samples."""
    ctx = multiprocessing.get_context("spawn")  # no fork of a process that may hold gRPC state
    results: multiprocessing.queues.Queue[tuple[str, int, Any]] = ctx.Queue()
    go = ctx.Event()
    window = ctx.Array("d", 2)
    procs = [
        ctx.Process(target=_worker_entry, args=(s, results, go, window), daemon=True) for s in specs
    ]
    for p in procs:
        p.start()
    try:
        waiting = {s.index for s in specs}
        deadline = time.monotonic() + WORKER_READY_TIMEOUT_S
        while waiting:
            kind, index, payload = _next(results, procs, deadline, "load processes to connect")
            if kind == "failed":
                raise PeerError(f"load process {index} failed: {payload}")
            waiting.discard(index)
        start_at = time.monotonic() + warmup_s
        stop_at = start_at + seconds
        window[0], window[1] = start_at, stop_at
        go.set()
        time.sleep(max(0.0, start_at - time.monotonic()))
        gen_pids = [p.pid for p in procs if p.pid is not None]
        load0, cpu0 = os.getloadavg(), _cpu_seconds(peer_pids)
        gen0 = _cpu_seconds(gen_pids)
        before = sample() if sample else {}
        time.sleep(max(0.0, stop_at - time.monotonic()))
        load1, cpu1 = os.getloadavg(), _cpu_seconds(peer_pids)
        gen1 = _cpu_seconds(gen_pids)
        after = sample() if sample else {}
        latencies: list[float] = []
        errors, first_error = 0, ""
        waiting = {s.index for s in specs}
        deadline = stop_at + DRAIN_TIMEOUT_S + WORKER_EXIT_TIMEOUT_S
        while waiting:
            kind, index, payload = _next(results, procs, deadline, "load processes to report")
            if kind == "failed":
                raise PeerError(f"load process {index} failed: {payload}")
            raw, errs, first = payload
            arr = array.array("d")
            arr.frombytes(raw)
            latencies.extend(arr)
            errors += errs
            first_error = first_error or first
            waiting.discard(index)
        return _LoadOutcome(
            latencies,
            errors,
            first_error,
            load0,
            load1,
            cpu1 - cpu0,
            gen1 - gen0,
            len(procs),
            {"before": before, "after": after},
        )
    finally:
        go.set()  # a process still waiting for it exits instead of timing out
        for p in procs:
            p.join(WORKER_EXIT_TIMEOUT_S)
            if p.is_alive():
                log.warning("load process pid %s did not exit; killing it", p.pid)
                p.kill()
                p.join(KILL_WAIT_S)
        results.close()


def _next(
    results: multiprocessing.queues.Queue[tuple[str, int, Any]],
    procs: Sequence[multiprocessing.process.BaseProcess],
    deadline: float,
    what: str,
) -> tuple[str, int, Any]:
    """The next message of a load process; fails early if one died without a word."""
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise PeerError(f"timed out waiting for {what}")
        try:
            return results.get(timeout=min(left, WORKER_POLL_S))
        except queue.Empty:
            dead = [p for p in procs if p.exitcode is not None and p.exitcode != 0]
            if dead:
                raise PeerError(
                    f"load process pid {dead[0].pid} exited with {dead[0].exitcode} while "
                    f"waiting for {what}"
                ) from None


def _check_args(size_bytes: int, in_flight: int, seconds: float, processes: int) -> None:
    if size_bytes <= 0 or in_flight <= 0 or seconds <= 0 or processes <= 0:
        raise ValueError("size_bytes, in_flight, seconds and processes must be > 0")


def _load_text(out: _LoadOutcome, seconds: float) -> str:
    """CPU of the load generators and the machine's load average, for the conditions."""
    a, b = out.load_avg_start, out.load_avg_end
    busy = out.loadgen_cpu_s / seconds / out.processes * 100.0
    ops = len(out.latencies_ms)
    per_op_us = out.loadgen_cpu_s / ops * 1e6 if ops else 0.0
    return (
        f"load generators {out.loadgen_cpu_s:.1f} CPU s ({busy:.0f}% of a core per process, "
        f"{per_op_us:.0f} us per op); "
        f"load average {a[0]:.1f} at the window's start, {b[0]:.1f} at its end"
    )


def run_etcd(
    size_bytes: int,
    in_flight: int,
    seconds: float,
    *,
    processes: int = DEFAULT_PROCESSES,
    warmup_s: float = DEFAULT_WARMUP_S,
    cluster: EtcdCluster | None = None,
) -> dict[str, Any]:
    """Puts of ``size_bytes`` values to a 3-member etcd, ``in_flight`` at a time, for
    ``seconds`` after ``warmup_s``; starts (and stops) a fresh cluster unless given one."""
    _check_args(size_bytes, in_flight, seconds, processes)
    if cluster is None:
        with EtcdCluster() as fresh:
            return run_etcd(
                size_bytes,
                in_flight,
                seconds,
                processes=processes,
                warmup_s=warmup_s,
                cluster=fresh,
            )
    leader = cluster.leader_endpoint()
    with tempfile.TemporaryDirectory(prefix="raftmq-peer-stubs-") as stub_dir:
        generate_etcd_stubs(Path(stub_dir))
        specs = [
            _WorkerSpec(
                "etcd", i, leader, n, size_bytes, ETCD_CHANNELS_PER_PROCESS, stub_dir=stub_dir
            )
            for i, n in enumerate(split_in_flight(in_flight, processes))
        ]
        out = _run_load(specs, warmup_s, seconds, cluster.pids(), cluster.fsync_counts)
    before, after = out.samples["before"], out.samples["after"]
    fsyncs = after.get("wal_fsyncs", 0.0) - before.get("wal_fsyncs", 0.0)
    commits = after.get("backend_commits", 0.0) - before.get("backend_commits", 0.0)
    fsync_s = after.get("wal_fsync_s", 0.0) - before.get("wal_fsync_s", 0.0)
    ops = len(out.latencies_ms)
    conditions = (
        f"{binary_version(ETCD_BINARY)}, {MEMBERS} members on {HOST}, default durability "
        f"(a put is acked once committed: WAL fsynced on a majority; group commit); "
        f"{size_bytes} B values, {in_flight} in flight over {len(specs)} Python processes "
        f"(grpc.aio, {ETCD_CHANNELS_PER_PROCESS} channels each, unary KV.Put to the leader), "
        f"{warmup_s:g} s warm-up, {seconds:g} s measured; "
        f"{fsyncs:.0f} WAL fsyncs over all members in the window "
        f"({ops / fsyncs * MEMBERS if fsyncs else 0:.1f} puts per fsync per member, "
        f"{fsync_s / fsyncs * 1000 if fsyncs else 0:.1f} ms per fsync on average), "
        f"{commits:.0f} backend commits; etcd CPU {out.peer_cpu_s:.1f} s; "
        f"{_load_text(out, seconds)}"
    )
    if out.errors:
        conditions += f"; first error: {out.first_error}"
    return summarize(out.latencies_ms, out.errors, seconds, size_bytes, conditions)


def run_nats(
    size_bytes: int,
    in_flight: int,
    seconds: float,
    *,
    processes: int = DEFAULT_PROCESSES,
    warmup_s: float = DEFAULT_WARMUP_S,
    cluster: NatsCluster | None = None,
) -> dict[str, Any]:
    """JetStream publishes of ``size_bytes`` to a stream of 3 replicas (file storage),
    ``in_flight`` at a time, each awaiting its ack, for ``seconds`` after ``warmup_s``; starts
    (and stops) a fresh cluster unless given one."""
    _check_args(size_bytes, in_flight, seconds, processes)
    if cluster is None:
        with NatsCluster() as fresh:
            return run_nats(
                size_bytes,
                in_flight,
                seconds,
                processes=processes,
                warmup_s=warmup_s,
                cluster=fresh,
            )
    target = cluster.leader_url()
    specs = [
        _WorkerSpec("nats", i, target, n, size_bytes, NATS_CONNECTIONS_PER_PROCESS)
        for i, n in enumerate(split_in_flight(in_flight, processes))
    ]
    out = _run_load(specs, warmup_s, seconds, cluster.pids())
    conditions = (
        f"{binary_version(NATS_BINARY)}, {MEMBERS} servers on {HOST}, JetStream stream R3 "
        f"file storage, defaults: a publish is acked once a majority of the replicas have it "
        f"in their file store, written but not fsynced (2.9 fsyncs from a background timer, "
        f"2 min by default; no fsync seen under load with strace); "
        f"{size_bytes} B messages, {in_flight} in flight over {len(specs)} Python processes "
        f"(nats-py js.publish, {NATS_CONNECTIONS_PER_PROCESS} connections each, to the stream "
        f"leader's server), {warmup_s:g} s warm-up, {seconds:g} s measured; "
        f"nats-server CPU {out.peer_cpu_s:.1f} s; {_load_text(out, seconds)}"
    )
    if out.errors:
        conditions += f"; first error: {out.first_error}"
    return summarize(out.latencies_ms, out.errors, seconds, size_bytes, conditions)


# --------------------------------------------------------------------------------------------
# Command line


def _format(name: str, r: dict[str, Any]) -> str:
    return (
        f"{name:<18} {r['ops_per_s']:>9.0f} ops/s {r['mb_per_s']:>7.2f} MB/s  "
        f"p50 {r['p50_ms']:7.2f} ms  p99 {r['p99_ms']:7.2f} ms  p99.9 {r['p999_ms']:7.2f} ms  "
        f"ops {r['ops']}  errors {r['errors']}\n    {r['conditions']}"
    )


def _raise_on_sigterm(signum: int, frame: types.FrameType | None) -> None:
    raise SystemExit(128 + signum)  # so the clusters' context managers tear them down


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.peers", description=__doc__)
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("install", help="install etcd-server and nats-server (apt)")
    sub.add_parser("commands", help="print the install commands")
    r = sub.add_parser("run", help="run both peers once and print their figures")
    r.add_argument("--seconds", type=float, default=5.0)
    r.add_argument("--size", type=int, default=1024)
    r.add_argument("--in-flight", dest="in_flight", type=int, default=256)
    r.add_argument("--processes", type=int, default=DEFAULT_PROCESSES)
    r.add_argument("--warmup", type=float, default=DEFAULT_WARMUP_S)
    r.add_argument("--peer", choices=("etcd", "nats", "all"), default="all")
    r.add_argument("--json", action="store_true", help="print one JSON object instead")
    a = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    signal.signal(signal.SIGTERM, _raise_on_sigterm)
    if a.cmd == "commands":
        for cmd in install_commands() + client_install_commands():
            print(" ".join(cmd))
        return 0
    if a.cmd == "install":
        try:
            install()
        except PeerError as exc:
            print(f"bench.peers install: {str(exc).splitlines()[0]}", file=sys.stderr)
            return 1
        return 0
    runs: list[tuple[str, type[_Cluster], Callable[..., dict[str, Any]]]] = [
        ("etcd", EtcdCluster, run_etcd),
        ("nats_jetstream_r3", NatsCluster, run_nats),
    ]
    out: dict[str, Any] = {}
    for name, cls, run in runs:
        if a.peer != "all" and not name.startswith(a.peer):
            continue
        reason = cls.unavailable_reason()
        if reason:
            out[name] = {"skipped": reason}
            continue
        try:
            out[name] = run(
                a.size, a.in_flight, a.seconds, processes=a.processes, warmup_s=a.warmup
            )
        except (PeerError, OSError, ValueError) as exc:
            print(f"bench.peers run: {name} failed: {exc}", file=sys.stderr)
            return 1
    if a.json:
        print(json.dumps(out, indent=2))
    else:
        for name, res in out.items():
            print(_format(name, res) if "ops_per_s" in res else f"{name}: {res['skipped']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
