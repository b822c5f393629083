"""A cluster deployed as an operator deploys it on separate machines: every NameServer and
broker node in a network namespace of its own with its own address (a test host), configured
only from what ``mqcluster hosts`` wrote (the CA and certificates, broker.conf / namesrv.conf,
the start command), TLS and users on, two broker groups, and the clients on a host of their
own reaching the cluster through the NameServers only.

Under a producer that never stops: produce and consume across both groups; a whole host (the
leader of broker-a) dies, its network gone; a third group is added (its files written by a
second ``mqcluster hosts`` run) and its queues are used; every process is restarted one at a
time (an upgrade drill). Every acknowledged send is read back at the end.

Needs root and ``ip`` (the namespaces); skipped with the reason otherwise. Short form by
default (CI); ``RAFTMQ_SOAK=1`` runs the long form (more sends between the steps).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import wait_for

from client import MQAdmin
from dledger.server.client import ClientError, LogClient
from jepsen_like import netns
from jepsen_like.netns import NetnsNet, check_netns
from mqcluster import hostfiles
from mqcluster.cluster import log_client
from mqsecurity.channels import ClientSecurity
from mqsecurity.credentials import load_credentials
from mqsecurity.tls import TlsFiles

_REASON = check_netns()
pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(bool(_REASON), reason=f"network namespaces unusable here: {_REASON}"),
]

SOAK = os.environ.get("RAFTMQ_SOAK") == "1"
# Acknowledged sends to wait for after each step (the long form: more traffic in each state).
SENDS_PER_STEP = 400 if SOAK else 40
TOPIC = "Hosts"
QUEUES = 4
# Bounds of each wait: traffic in a step, and a process start (a broker imports grpc and its
# stubs before it logs a line: ~2 s alone, far more on a loaded 2-core CI machine).
STEP_S = 60.0
START_S = 90.0
STOP_S = 15.0
CLIENT = Path(__file__).resolve().parents[1] / "multihost_client.py"
NAMESRVS = ("nsrv0", "nsrv1")
GROUPS = {"broker-a": ("a0", "a1", "a2"), "broker-b": ("b0", "b1", "b2")}
ADDED = {"broker-c": ("c0", "c1", "c2")}
# Namespaces of one run: 2 NameServers, 9 broker nodes, the client host.
MAX_HOSTS = 12


class Hosts:
    """The run's namespaces and the one process each runs, started from its directory's
    ``command`` file (and nothing else)."""

    def __init__(self, net: NetnsNet, out: Path) -> None:
        self.net = net
        self.out = out
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.dirs: dict[str, Path] = {}
        # One log client per group, kept: its TLS channels reconnect to a restarted node, and
        # a handshake per poll would cost a loaded machine more than the polling itself.
        self.clients: dict[str, LogClient] = {}
        self.env = {
            **os.environ,
            "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}",
        }

    def ip(self, host: str) -> str:
        return self.net.nodes[host].ip

    def start(self, host: str) -> None:
        d = self.dirs[host]
        argv = ["ip", "netns", "exec", self.net.nodes[host].ns, *hostfiles.read_command(d)]
        with (d / "stderr.log").open("ab") as err:
            self.procs[host] = subprocess.Popen(
                argv, stdout=subprocess.DEVNULL, stderr=err, env=self.env
            )

    def alive(self, host: str) -> bool:
        p = self.procs.get(host)
        return p is not None and p.poll() is None

    def stop(self, host: str, sig: signal.Signals = signal.SIGTERM) -> None:
        p = self.procs[host]
        if p.poll() is None:
            p.send_signal(sig)
            try:
                p.wait(timeout=STOP_S)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(timeout=STOP_S)

    def set_link(self, host: str, up: bool) -> None:
        netns._ip("link", "set", self.net.nodes[host].veth, "up" if up else "down")

    def client(self, group: str, names: tuple[str, ...]) -> LogClient:
        if group not in self.clients:
            addrs = [f"{self.ip(n)}:{hostfiles.CLIENT_PORT}" for n in names]
            self.clients[group] = log_client(addrs, group, _admin(self), timeout_s=1.0)
        return self.clients[group]

    def kill_all(self) -> None:
        """The end of the run (its checks are done): SIGKILL every process still running."""
        for client in self.clients.values():
            client.close()
        running = [p for p in self.procs.values() if p.poll() is None]
        for p in running:
            p.kill()
        for p in running:
            p.wait(timeout=STOP_S)


@pytest.fixture
def hosts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Hosts]:
    monkeypatch.setattr(netns, "MAX_NODES", MAX_HOSTS)
    net = NetnsNet(tmp_path)
    net.start()
    h = Hosts(net, tmp_path / "files")
    try:
        for name in [*NAMESRVS, *(n for g in GROUPS.values() for n in g), "cli"]:
            net.add_node(name)
        yield h
    finally:
        h.kill_all()
        net.stop()


def _write_files(h: Hosts, groups: dict[str, tuple[str, ...]]) -> list[str]:
    layout = {
        "namesrvs": [h.ip(n) for n in NAMESRVS],
        "groups": {g: [h.ip(n) for n in names] for g, names in groups.items()},
        "bindAddress": "0.0.0.0",
        "settings": {
            "mappedFileSizeCommitLog": str(4 << 20),
            "mappedFileSizeEntryIndex": "1048576",
        },
    }
    path = h.out.parent / "layout.json"
    path.write_text(json.dumps(layout))
    written = hostfiles.run(str(path), str(h.out))
    for i, n in enumerate(NAMESRVS):
        h.dirs[n] = h.out / f"namesrv-{i}"
    for g, names in groups.items():
        for i, n in enumerate(names):
            h.dirs[n] = h.out / f"{g}-n{i}"
    return written.made


def _admin(h: Hosts) -> ClientSecurity:
    ca = h.out / "ca"
    return ClientSecurity(
        tls=TlsFiles(
            str(ca / "client-admin.crt"), str(ca / "client-admin.key"), str(ca / "ca.crt")
        ),
        credentials=load_credentials(str(ca / "admin.json")),
    )


def _namesrv_addr(h: Hosts) -> str:
    return ";".join(f"{h.ip(n)}:{hostfiles.NAMESRV_PORT}" for n in NAMESRVS)


def _listening(addr: tuple[str, int]) -> bool:
    try:
        with socket.create_connection(addr, timeout=1):
            return True
    except OSError:
        return False


def _leader(h: Hosts, group: str, names: tuple[str, ...]) -> str | None:
    """The host of ``group``'s leader, as the members themselves say; None if none."""
    client = h.client(group, names)
    for host in names:
        if not h.alive(host):
            continue
        try:
            md = client.metadata(f"{h.ip(host)}:{hostfiles.CLIENT_PORT}", timeout_s=1.0)
        except ClientError:
            continue
        if md.role == "LEADER":
            return host
    return None


def _commit(h: Hosts, group: str, names: tuple[str, ...], host: str) -> int:
    addr = f"{h.ip(host)}:{hostfiles.CLIENT_PORT}"
    try:
        return int(h.client(group, names).metadata(addr, timeout_s=1.0).commit_index)
    except ClientError:
        return -1


class Acks:
    """The producer host's acknowledged sends, read from its output file."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def read(self) -> dict[str, str]:
        if not self.path.exists():
            return {}
        lines = self.path.read_text().splitlines()
        return dict(ln.split(" ", 1) for ln in lines if ln.count(" ") == 1)

    def wait_more(self, count: int, what: str, group: str = "") -> None:
        """Until ``count`` more sends (to ``group``, when given) are acknowledged."""
        start = Counter(self.read().values())
        target = start[group] if group else sum(start.values())

        def grown() -> bool:
            now = Counter(self.read().values())
            return (now[group] if group else sum(now.values())) >= target + count

        wait_for(grown, STEP_S, what)


def _start_groups(h: Hosts, groups: dict[str, tuple[str, ...]]) -> None:
    """Start every node of ``groups`` at once; wait until each group has a leader."""
    for names in groups.values():
        for n in names:
            h.start(n)
    for group, names in groups.items():

        def elected(group: str = group, names: tuple[str, ...] = names) -> bool:
            return _leader(h, group, names) is not None

        wait_for(elected, START_S, f"a leader of {group}")


def _step(t0: float, what: str) -> None:
    """Where the run is (shown with a failure's captured output)."""
    print(f"step {what}: {time.monotonic() - t0:.1f} s", flush=True)


def _restart(h: Hosts, host: str, group: str, names: tuple[str, ...]) -> None:
    """Stop ``host`` (SIGTERM), start it from its command file, and wait until it has caught
    up with what its group had committed before (a NameServer: until it listens)."""
    if not group:
        h.stop(host)
        h.start(host)
        addr = (h.ip(host), hostfiles.NAMESRV_PORT)
        wait_for(lambda: _listening(addr), START_S, f"{host} listening again")
        return
    leader = _leader(h, group, names)
    before = _commit(h, group, names, leader) if leader else 0
    h.stop(host)
    h.start(host)
    wait_for(lambda: _commit(h, group, names, host) >= before, START_S, f"{host} caught up again")
    wait_for(lambda: _leader(h, group, names) is not None, START_S, f"a leader of {group}")


def test_two_groups_on_separate_hosts_survive_a_host_loss_a_new_group_and_an_upgrade_drill(
    hosts: Hosts,
) -> None:
    h = hosts
    t0 = time.monotonic()
    made = _write_files(h, GROUPS)
    assert len(made) == 2 + 6
    for n in NAMESRVS:
        h.start(n)
    _start_groups(h, GROUPS)
    for n in NAMESRVS:
        wait_for(lambda n=n: _listening((h.ip(n), hostfiles.NAMESRV_PORT)), START_S, n)
    _step(t0, "started")
    admin = MQAdmin(_namesrv_addr(h), _admin(h))
    assert admin.create_topic(TOPIC, QUEUES) == sorted(GROUPS)

    acks = Acks(h.out.parent / "acked.txt")
    stop = h.out.parent / "stop"
    client_env = {
        **h.env,
        "RAFTMQ_TLS_CA": str(h.out / "ca" / "ca.crt"),
        "RAFTMQ_CREDENTIALS": str(h.out / "ca" / "admin.json"),
    }
    client_ns = h.net.nodes["cli"].ns
    producer = subprocess.Popen(
        [
            "ip",
            "netns",
            "exec",
            client_ns,
            sys.executable,
            str(CLIENT),
            "produce",
            _namesrv_addr(h),
            TOPIC,
            str(acks.path),
            str(stop),
        ],
        env=client_env,
        stderr=(h.out.parent / "producer.err").open("wb"),
    )
    try:
        for group in GROUPS:
            acks.wait_more(SENDS_PER_STEP // 2, f"sends acknowledged by {group}", group)

        _step(t0, "both groups acked")
        # A whole host dies: its process SIGKILLed and its network gone.
        lost = _leader(h, "broker-a", GROUPS["broker-a"])
        assert lost is not None
        h.stop(lost, signal.SIGKILL)
        h.set_link(lost, up=False)
        acks.wait_more(SENDS_PER_STEP, "broker-a sending again without its host", "broker-a")
        h.set_link(lost, up=True)
        h.start(lost)

        _step(t0, "host loss")
        # A third group: its hosts, its files from a second run of the tool, the topic
        # extended to it (updateTopic over the cluster), its queues used.
        for names in ADDED.values():
            for n in names:
                h.net.add_node(n)
        made = _write_files(h, {**GROUPS, **ADDED})
        assert sorted(made) == ["broker-c-n0", "broker-c-n1", "broker-c-n2"]
        _start_groups(h, ADDED)
        assert admin.create_topic(TOPIC, QUEUES) == sorted({**GROUPS, **ADDED})
        acks.wait_more(SENDS_PER_STEP // 2, "sends on the added group", "broker-c")

        _step(t0, "third group")
        # The upgrade drill: every process restarted, one at a time, under load.
        for n in NAMESRVS:
            _restart(h, n, "", ())
        for group, names in {**GROUPS, **ADDED}.items():
            for n in names:
                _restart(h, n, group, names)
        _step(t0, "drill")
        acks.wait_more(SENDS_PER_STEP, "sends after the drill")
    finally:
        stop.touch()
        try:
            producer.wait(timeout=STEP_S)
        except subprocess.TimeoutExpired:
            producer.kill()
            producer.wait(timeout=STOP_S)
    assert producer.returncode == 0, (h.out.parent / "producer.err").read_text()[-2000:]

    acked = acks.read()
    read_file = h.out.parent / "read.txt"
    subprocess.run(
        [
            "ip",
            "netns",
            "exec",
            client_ns,
            sys.executable,
            str(CLIENT),
            "consume",
            _namesrv_addr(h),
            TOPIC,
            str(read_file),
        ],
        env=client_env,
        check=True,
        timeout=STEP_S * 2,
    )
    read = set(read_file.read_text().split())
    lost_ids = set(acked) - read
    assert not lost_ids, f"{len(lost_ids)} of {len(acked)} acknowledged sends not read back"
    per_group = Counter(acked.values())
    assert set(per_group) == {"broker-a", "broker-b", "broker-c"}, per_group
