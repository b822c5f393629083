"""bench.peers: the pure parts (install commands, member command lines and configs, percentile
and result math, the closed-loop driver, the etcd stubs' wire format, teardown of a cluster's
processes) and, marked integration, one short run against each real peer cluster.

No figure is asserted: speed is shown by ``python -m bench.peers run``, never by a test."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bench import peers

RESULT_SHAPE = {
    "ops_per_s": float,
    "mb_per_s": float,
    "p50_ms": float,
    "p99_ms": float,
    "p999_ms": float,
    "ops": int,
    "errors": int,
    "conditions": str,
}


# --- install ------------------------------------------------------------------------------


def test_install_commands_as_root_without_systemd() -> None:
    cmds = peers.install_commands(missing=["etcd", "nats-server"], root=True, systemd=False)
    assert cmds == [
        ["apt-get", "update"],
        [
            "env",
            "DEBIAN_FRONTEND=noninteractive",
            "apt-get",
            "install",
            "-y",
            "--no-install-recommends",
            "etcd-server",
            "nats-server",
        ],
    ]


def test_install_commands_use_sudo_and_stop_the_units_just_installed() -> None:
    cmds = peers.install_commands(missing=["nats-server"], root=False, systemd=True)
    assert all(c[0] == "sudo" for c in cmds)
    assert cmds[1][-1] == "nats-server" and "etcd-server" not in cmds[1]
    assert cmds[2] == ["sudo", "systemctl", "disable", "--now", "nats-server.service"]


def test_install_commands_empty_when_nothing_is_missing() -> None:
    assert peers.install_commands(missing=[], root=True, systemd=True) == []


def test_install_commands_reject_an_unknown_binary() -> None:
    with pytest.raises(ValueError, match="no package"):
        peers.install_commands(missing=["zookeeper"], root=True, systemd=False)


def test_unavailable_peer_says_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(peers, "find_binary", lambda name: None)
    assert not peers.EtcdCluster.available()
    assert not peers.NatsCluster.available()
    assert "make bench-peers" in (peers.EtcdCluster.unavailable_reason() or "")
    with pytest.raises(peers.PeerError, match="not found"):
        peers.EtcdCluster().start()


def test_main_install_reports_one_line_and_exit_1(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def fail() -> None:
        raise peers.PeerError("apt-get exited 100: E: Unable to locate package\nmore")

    monkeypatch.setattr(peers, "install", fail)
    assert peers.main(["install"]) == 1
    err = capsys.readouterr().err
    assert err.strip().count("\n") == 0 and "Unable to locate" in err


def test_client_install_command_is_a_plain_pinned_pip_install() -> None:
    assert peers.client_install_commands(installed=True) == []
    (cmd,) = peers.client_install_commands(installed=False)
    assert cmd[:4] == [sys.executable, "-m", "pip", "install"] and "-e" not in cmd
    assert cmd[-1] == peers.NATS_PY_REQUIREMENT
    pyproject = (Path(__file__).resolve().parents[2] / "pyproject.toml").read_text()
    assert f'"{peers.NATS_PY_REQUIREMENT}"' in pyproject  # the same pin as the test extras


def test_install_runs_the_client_install_when_nats_py_is_missing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ran: list[list[str]] = []

    def run(cmd: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
        ran.append(cmd)
        return subprocess.CompletedProcess(cmd, 1, "", "ERROR: no network\n")

    monkeypatch.setattr(peers, "install_commands", lambda: [])
    monkeypatch.setattr(peers, "_nats_client_installed", lambda: False)
    monkeypatch.setattr(peers.subprocess, "run", run)
    with pytest.raises(peers.PeerError, match="no network"):
        peers.install()
    assert ran == peers.client_install_commands(installed=False)


def test_parse_version() -> None:
    assert peers.parse_version("etcd Version: 3.4.23\nGit SHA: x\nGo Version: go1.19.8") == (
        "3.4.23"
    )
    assert peers.parse_version("nats-server: v2.9.10\n") == "2.9.10"
    assert peers.parse_version("garbage") == "?"


# --- cluster command lines and configs ----------------------------------------------------


def test_etcd_member_command_builds_a_three_member_loopback_cluster(tmp_path: Path) -> None:
    cmd = peers.etcd_member_command(
        "/usr/bin/etcd", 1, tmp_path, [2001, 2002, 2003], [3001, 3002, 3003]
    )

    def opt(name: str) -> str:
        return cmd[cmd.index(name) + 1]

    assert cmd[0] == "/usr/bin/etcd"
    assert opt("--name") == "etcd1"
    assert opt("--data-dir") == str(tmp_path)
    assert opt("--listen-client-urls") == "http://127.0.0.1:2002"
    assert opt("--listen-peer-urls") == "http://127.0.0.1:3002"
    assert opt("--initial-cluster") == (
        "etcd0=http://127.0.0.1:3001,etcd1=http://127.0.0.1:3002,etcd2=http://127.0.0.1:3003"
    )
    assert opt("--initial-cluster-state") == "new"
    # Default durability: nothing that turns fsync off or delays it.
    assert not any("unsafe" in a or "fsync" in a for a in cmd)
    urls = [a for a in cmd if "://" in a]
    assert urls and all("127.0.0.1" in u for u in urls)


def test_nats_config_routes_to_the_other_servers_and_enables_jetstream(tmp_path: Path) -> None:
    conf = peers.nats_server_config(
        2, tmp_path / "n2", [4001, 4002, 4003], [6001, 6002, 6003], [8001, 8002, 8003]
    )
    assert 'server_name: "nats2"' in conf
    assert 'listen: "127.0.0.1:4003"' in conf
    assert 'http: "127.0.0.1:8003"' in conf
    assert f'store_dir: "{tmp_path / "n2"}"' in conf
    assert 'listen: "127.0.0.1:6003"' in conf
    assert '"nats-route://127.0.0.1:6001"' in conf and '"nats-route://127.0.0.1:6002"' in conf
    assert '6003"\n  ]' not in conf and conf.count("nats-route://") == 2
    assert "sync" not in conf  # the file store's defaults, stated in the conditions


@pytest.mark.skipif(peers.find_binary("nats-server") is None, reason="nats-server not installed")
def test_nats_config_is_accepted_by_nats_server(tmp_path: Path) -> None:
    conf = tmp_path / "n0.conf"
    conf.write_text(peers.nats_server_config(0, tmp_path / "n0", [1, 2, 3], [4, 5, 6], [7, 8, 9]))
    binary = peers.find_binary("nats-server")
    assert binary is not None
    done = subprocess.run(
        [binary, "-t", "-c", str(conf)], capture_output=True, text=True, timeout=30
    )
    assert done.returncode == 0, done.stderr


def test_free_ports_are_distinct() -> None:
    ports = peers.free_ports(9)
    assert len(set(ports)) == 9 and all(0 < p < 65536 for p in ports)


def test_parse_prometheus_takes_unlabelled_samples() -> None:
    text = (
        "# HELP etcd_disk_wal_fsync_duration_seconds x\n"
        'etcd_disk_wal_fsync_duration_seconds_bucket{le="0.001"} 5\n'
        "etcd_disk_wal_fsync_duration_seconds_count 1234\n"
        "etcd_disk_backend_commit_duration_seconds_count 5.6e+01\n"
    )
    assert peers.parse_prometheus(text) == {
        "etcd_disk_wal_fsync_duration_seconds_count": 1234.0,
        "etcd_disk_backend_commit_duration_seconds_count": 56.0,
    }


# --- statistics ---------------------------------------------------------------------------


def test_percentile_is_nearest_rank() -> None:
    values = [float(v) for v in range(1, 1001)]
    assert peers.percentile(values, 0.5) == 500.0
    assert peers.percentile(values, 0.99) == 990.0
    assert peers.percentile(values, 0.999) == 999.0
    assert peers.percentile(values, 1.0) == 1000.0
    assert peers.percentile(values, 0.0) == 1.0
    assert peers.percentile([7.0], 0.999) == 7.0
    assert peers.percentile([1.0, 2.0, 3.0], 0.5) == 2.0
    assert peers.percentile([], 0.99) == 0.0
    with pytest.raises(ValueError):
        peers.percentile(values, 99.0)


def test_summarize_shape_and_rates() -> None:
    lat = [float(v) for v in range(1000, 0, -1)]  # unsorted on purpose
    r = peers.summarize(lat, errors=3, seconds=2.0, size_bytes=1024, conditions="c")
    assert {k: type(v) for k, v in r.items()} == RESULT_SHAPE
    assert r["ops"] == 1000 and r["errors"] == 3
    assert r["ops_per_s"] == 500.0
    assert r["mb_per_s"] == pytest.approx(500 * 1024 / 1e6)
    assert (r["p50_ms"], r["p99_ms"], r["p999_ms"]) == (500.0, 990.0, 999.0)
    empty = peers.summarize([], errors=0, seconds=1.0, size_bytes=1024, conditions="c")
    assert empty["ops_per_s"] == 0.0 and empty["p99_ms"] == 0.0
    with pytest.raises(ValueError):
        peers.summarize(lat, errors=0, seconds=0.0, size_bytes=1, conditions="c")


def test_split_in_flight() -> None:
    assert peers.split_in_flight(256, 2) == [128, 128]
    assert peers.split_in_flight(5, 2) == [3, 2]
    assert peers.split_in_flight(1, 4) == [1]
    assert sum(peers.split_in_flight(257, 3)) == 257
    with pytest.raises(ValueError):
        peers.split_in_flight(0, 2)


# --- the closed-loop driver (no server: a fake send) --------------------------------------


def test_drive_counts_only_ops_completed_in_the_window() -> None:
    calls: list[tuple[int, int]] = []

    async def send(k: int, seq: int) -> None:
        calls.append((k, seq))
        await asyncio.sleep(0.001)
        if k == 0 and seq % 2 == 1:
            raise RuntimeError("odd")

    async def go() -> peers._Tally:
        now = time.monotonic()
        return await peers.drive(send, 4, start_at=now + 0.05, stop_at=now + 0.25)

    tally = asyncio.run(go())
    senders = {k for k, _ in calls}
    assert senders == {0, 1, 2, 3}
    # Every counted op (success or error) is one call; warm-up ops are not counted.
    assert 0 < len(tally.latencies_ms) + tally.errors < len(calls)
    assert tally.errors > 0 and tally.first_error == "RuntimeError: odd"
    assert all(x > 0 for x in tally.latencies_ms)


def test_drive_stops_at_once_when_the_window_is_over() -> None:
    async def send(k: int, seq: int) -> None:
        raise AssertionError("no op may start after stop_at")

    now = time.monotonic()
    tally = asyncio.run(peers.drive(send, 8, start_at=now - 2, stop_at=now - 1))
    assert len(tally.latencies_ms) == 0 and tally.errors == 0


# --- etcd stubs ---------------------------------------------------------------------------


def test_etcd_stubs_encode_puts_as_etcd_does(tmp_path: Path) -> None:
    path = peers.generate_etcd_stubs(tmp_path)
    pb = peers._load_module(peers.ETCD_PB2_MODULE, path)
    # etcdserverpb.PutRequest: key = 1, value = 2 (both bytes, length-delimited).
    assert pb.PutRequest(key=b"k", value=b"vv").SerializeToString() == b"\n\x01k\x12\x02vv"
    assert pb.DESCRIPTOR.package == "etcdserverpb"
    assert pb.DESCRIPTOR.services_by_name["KV"].methods_by_name["Put"].full_name == (
        "etcdserverpb.KV.Put"
    )
    resp = pb.PutResponse.FromString(b"\n\x04\x18\x07\x20\x02")  # header{revision 7, term 2}
    assert (resp.header.revision, resp.header.raft_term) == (7, 2)


# --- teardown of member processes (stand-in members: sleeping Python processes) -----------


class _SleepCluster(peers._Cluster):
    """Members that are plain sleeping processes; ``ready`` tells whether start succeeds."""

    binary = sys.executable
    kind = "fake"
    ignore_term = False
    ready = True

    def _prepare(self) -> None:
        assert self.root is not None
        self.members = [
            peers._Member(f"m{i}", self.root / f"m{i}", self.root / f"m{i}.log") for i in range(3)
        ]

    def _command(self, index: int) -> list[str]:
        code = "import signal, time\n"
        if self.ignore_term:
            code += "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        code += "print('up', flush=True)\ntime.sleep(60)\n"
        return [sys.executable, "-c", code]

    def _wait_ready(self, deadline: float) -> None:
        if not self.ready:
            raise peers.PeerError("not ready")


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_cluster_is_torn_down_on_an_exception_in_the_with_block(tmp_path: Path) -> None:
    with pytest.raises(KeyError), _SleepCluster(tmp_path) as c:
        pids, root = c.pids(), c.root
        assert len(pids) == 3 and root is not None and root.is_dir()
        raise KeyError("boom")
    assert all(_gone(p) for p in pids)
    assert root is not None and not root.exists()


def test_cluster_that_never_gets_ready_is_torn_down(tmp_path: Path) -> None:
    c = _SleepCluster(tmp_path)
    c.ready = False
    with pytest.raises(peers.PeerError, match="not ready"):
        c.start()
    assert c.root is None and list(tmp_path.iterdir()) == []
    assert all(m.proc is None for m in c.members)


def test_member_ignoring_sigterm_is_killed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(peers, "STOP_GRACE_S", 1.0)
    c = _SleepCluster(tmp_path)
    c.ignore_term = True
    c.start()
    pids = c.pids()
    # Wait until each member has installed its handler (it prints "up" after that).
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not all(
        m.log_path.exists() and "up" in m.log_path.read_text() for m in c.members
    ):
        time.sleep(0.05)
    c.stop()
    assert all(_gone(p) for p in pids)
    assert list(tmp_path.iterdir()) == []


# --- the real peers (integration: starts real clusters, about 10 s each) ------------------


def _check_result(r: dict[str, object]) -> None:
    assert {k: type(v) for k, v in r.items()} == RESULT_SHAPE
    assert isinstance(r["ops"], int) and r["ops"] > 0
    assert isinstance(r["errors"], int) and r["errors"] >= 0
    assert isinstance(r["conditions"], str) and "127.0.0.1" in r["conditions"]


@pytest.mark.integration
@pytest.mark.skipif(
    not peers.EtcdCluster.available(), reason="etcd not installed (make bench-peers)"
)
def test_etcd_cluster_runs_a_short_load_and_is_torn_down(tmp_path: Path) -> None:
    with peers.EtcdCluster(tmp_path) as c:
        pids, root = c.pids(), c.root
        assert len(pids) == 3
        r = peers.run_etcd(1024, 16, 1.0, processes=1, warmup_s=0.2, cluster=c)
    _check_result(r)
    assert "fsyncs" in str(r["conditions"])
    assert all(_gone(p) for p in pids) and root is not None and not root.exists()


@pytest.mark.integration
@pytest.mark.skipif(not peers.NatsCluster.available(), reason="nats-server / nats-py not installed")
def test_nats_cluster_runs_a_short_load_and_is_torn_down(tmp_path: Path) -> None:
    with peers.NatsCluster(tmp_path) as c:
        pids, root = c.pids(), c.root
        assert len(pids) == 3 and c.stream_leader is not None
        r = peers.run_nats(1024, 16, 1.0, processes=1, warmup_s=0.2, cluster=c)
    _check_result(r)
    assert all(_gone(p) for p in pids) and root is not None and not root.exists()


def test_sigterm_handler_raises_system_exit() -> None:
    with pytest.raises(SystemExit):
        peers._raise_on_sigterm(signal.SIGTERM, None)
