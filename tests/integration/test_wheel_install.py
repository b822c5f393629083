"""The distribution as an operator gets it (README "Install", docs/DEPLOY.md section 1): the
sdist and the wheel built from a copy of the tree with ``python -m build`` (in a builder venv of
its own, with build isolation: the build requirements and the pinned RocketMQ 5 protocol package
come from the package index and the npm registry, as on any machine), then a fresh venv (no
system site-packages) where ``pip install`` of the wheel alone resolves the runtime
dependencies from the wheel's own metadata. In that venv, from a directory outside the checkout
and with PYTHONPATH unset, the installed console scripts run a secure cluster (``mqcluster up``:
a NameServer and a 3-node group, TLS and an admin user), the installed ``mqadmin`` creates a
topic, a producer and a push consumer of the installed client (a script run by the venv's
python) send and receive, and ``mqcluster down`` stops everything; every process is checked
gone by its PID. Spark, pyarrow and pandas are not installed.

The sdist and the wheel are built once for the module; their contents are checked too (the
hook and the pins in the sdist, no upstream .proto anywhere; the v2 stubs in the wheel, Spark
only behind ``[audit]``). About 30-50 s on a quiet machine (3 minutes seen on a loaded one):
two builds (the sdist, then the wheel from it), two venvs, one install. Needs the package index
and the npm registry, as CI has."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import tarfile
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import _STARTED
from support import wait_for

from mqcluster.cluster import _pid_alive

# A build and an install fetch from the package index and the npm registry: on a loaded CI
# machine the first test (which builds) and the install took up to 3 minutes together.
pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

ROOT = Path(__file__).resolve().parents[2]
# A build or an install (downloads included) on a loaded CI machine.
BUILD_TIMEOUT_S = 300
# `mqcluster up` waits for a leader and every node itself; this bounds the tool.
TOOL_TIMEOUT_S = 120
# The client script: a producer and a push consumer, each with its own deadline inside.
CLIENT_TIMEOUT_S = 90
# Processes gone after `mqcluster down` (it waits for them itself).
STOP_DEADLINE_S = 15.0
STUBS = "broker/frontends/v2/_v2/apache/rocketmq/v2/"
# What the audit extra holds: never installed with the broker.
AUDIT_ONLY = ("pyspark", "pyarrow", "pandas", "numpy")
# The console scripts of an install without extras.
CORE_SCRIPTS = ("mqbroker", "mqnamesrv", "mqadmin", "mqcluster", "mqdashboard", "mqcert")
# What an operator's shell would not have: the test run's import path and venv, and the tools'
# security variables (each command below is given the ones it needs).
NOT_INHERITED = ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "RAFTMQ_CREDENTIALS", "RAFTMQ_TLS_CA")
TOPIC = "WheelOrders"
MESSAGES = 20

# Run by the venv's python (argv: NameServer, CA file, credentials file, topic, count). The
# client as docs/SECURITY.md shows it: a producer sends, a push consumer receives them all.
# Prints one JSON line: the ids sent and received, and where each module was imported from.
CLIENT_SCRIPT = r"""
import json, sys, threading
import broker, client, mqsecurity
from broker.frontends.v2 import stubs
from client import ConsumeStatus, Message, Producer, PushConsumer
from mqsecurity.channels import ClientSecurity
from mqsecurity.credentials import load_credentials
from mqsecurity.tls import TlsFiles

namesrv, ca, creds, topic, count = sys.argv[1:6]
count = int(count)
security = ClientSecurity(tls=TlsFiles(ca_path=ca), credentials=load_credentials(creds))
sent = []
with Producer("wheel-producer", namesrv, security=security) as producer:
    for i in range(count):
        sent.append(producer.send(Message(topic, f"order {i}".encode(), keys=(f"k{i}",))).msg_id)
received, lock, enough = set(), threading.Lock(), threading.Event()

def on_messages(msgs):
    with lock:
        received.update(m.msg_id for m in msgs)
        if len(received) >= count:
            enough.set()
    return ConsumeStatus.CONSUME_SUCCESS

consumer = PushConsumer("wheel-consumers", namesrv, security=security)
consumer.subscribe(topic, "*")
consumer.register_listener(on_messages)
consumer.start()
try:
    enough.wait(60)
finally:
    consumer.shutdown()
v2 = stubs.load()[0]
files = [broker.__file__, client.__file__, mqsecurity.__file__, v2.__file__]
print(json.dumps({"sent": sent, "received": sorted(received), "files": files}))
"""


def _tree(dest: Path) -> Path:
    """The checkout's files (tracked and new, not ignored) copied to ``dest``: what a clone
    holds, and the build's output stays out of the checkout."""
    listed = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard", "-z"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    )
    for rel in listed.stdout.decode().split("\0"):
        src = ROOT / rel
        if rel and src.is_file() and not src.is_symlink():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            (dest / rel).write_bytes(src.read_bytes())
    return dest


def _clean_env(**extra: str) -> dict[str, str]:
    """The environment of an operator's shell: no PYTHONPATH, no venv of the test run, none of
    the tools' security variables; the port range of this pytest session kept."""
    env = {k: v for k, v in os.environ.items() if k not in NOT_INHERITED}
    env["PATH"] = "/usr/local/bin:/usr/bin:/bin"
    env.update(extra)
    return env


def _run(argv: list[str], cwd: Path, timeout_s: float, env: dict[str, str]) -> str:
    done = subprocess.run(
        argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout_s, check=False
    )
    assert done.returncode == 0, (argv, done.stdout[-3000:], done.stderr[-3000:])
    return done.stdout


def _venv(path: Path, cwd: Path) -> Path:
    """A fresh venv at ``path`` (no system site-packages); its bin directory."""
    _run([sys.executable, "-m", "venv", str(path)], cwd, BUILD_TIMEOUT_S, _clean_env())
    return path / "bin"


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(the sdist, the wheel built from it), as README "Install" says: ``python -m build``."""
    work = tmp_path_factory.mktemp("dist")
    src = _tree(work / "src")
    builder = _venv(work / "builder", work)
    _run([str(builder / "pip"), "install", "-q", "build"], work, BUILD_TIMEOUT_S, _clean_env())
    out = work / "out"
    _run(
        [str(builder / "python"), "-m", "build", "--outdir", str(out), str(src)],
        work,
        BUILD_TIMEOUT_S,
        _clean_env(),
    )
    (sdist,) = out.glob("raftmq-*.tar.gz")
    (wheel,) = out.glob("raftmq-*.whl")
    return sdist, wheel


def test_the_sdist_has_the_hook_and_pins_but_no_upstream_proto(built: tuple[Path, Path]) -> None:
    with tarfile.open(built[0]) as tar:
        names = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
    assert {"setup.py", "protos/rmq5_deps.py", "protos/rmq5/package-lock.json"} <= names
    assert not [n for n in names if "apache" in n or n.startswith("build/")]


def test_the_wheel_carries_the_v2_stubs_and_spark_only_as_an_extra(
    built: tuple[Path, Path],
) -> None:
    with zipfile.ZipFile(built[1]) as whl:
        names = set(whl.namelist())
        meta = next(whl.read(n).decode() for n in names if n.endswith(".dist-info/METADATA"))
    for module in ("definition_pb2.py", "service_pb2.py", "service_pb2_grpc.py"):
        assert STUBS + module in names
    assert not [n for n in names if n.endswith(".proto") and "apache" in n]
    requires = [
        line.split(":", 1)[1].strip() for line in meta.splitlines() if "Requires-Dist" in line
    ]
    for name in AUDIT_ONLY:
        mine = [r for r in requires if r.lower().startswith(name)]
        assert mine and all('extra == "audit"' in r for r in mine), (name, mine)
    assert {"audit", "bench", "test"} <= {
        line.split(":", 1)[1].strip() for line in meta.splitlines() if "Provides-Extra" in line
    }


def _cluster_pids(base: Path) -> dict[int, str]:
    """pid -> config path of every process `mqcluster` started under ``base`` (its pid files)."""
    out: dict[int, str] = {}
    for pid_file in base.rglob("*.pid"):
        with contextlib.suppress(ValueError, OSError):
            pid = int(pid_file.read_text().strip())
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
            out[pid] = argv[argv.index("-c") + 1]
    return out


@pytest.fixture
def installed(built: tuple[Path, Path], tmp_path: Path) -> Path:
    """A fresh venv holding the wheel and what its metadata requires; its bin directory."""
    bin_dir = _venv(tmp_path / "venv", tmp_path)
    pip = [str(bin_dir / "pip"), "install", "-q", str(built[1])]
    _run(pip, tmp_path, BUILD_TIMEOUT_S, _clean_env())
    return bin_dir


def _absent(bin_dir: Path, cwd: Path) -> None:
    """None of the audit extra's packages is installed (nor importable) in the venv."""
    listed = _run([str(bin_dir / "pip"), "list", "--format", "json"], cwd, 60, _clean_env())
    names = {p["name"].lower() for p in json.loads(listed)}
    assert "raftmq" in names
    assert not names & set(AUDIT_ONLY), names & set(AUDIT_ONLY)
    probe = "import importlib.util as u, sys; print([m for m in sys.argv[1:] if u.find_spec(m)])"
    found = _run([str(bin_dir / "python"), "-c", probe, *AUDIT_ONLY], cwd, 60, _clean_env())
    assert found.strip() == "[]", found


@pytest.fixture
def cluster_dir(tmp_path: Path) -> Iterator[Path]:
    """Where `mqcluster` keeps the cluster; whatever it started is gone when the test ends."""
    base = tmp_path / "cluster"
    yield base
    for pid, conf in _cluster_pids(base).items():
        if _pid_alive(pid, conf):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def test_a_clean_venv_runs_the_cluster_from_the_wheel(
    installed: Path, cluster_dir: Path, tmp_path: Path
) -> None:
    bin_dir = installed
    run_dir = tmp_path / "operator"  # outside the checkout: nothing of it on sys.path
    run_dir.mkdir()
    assert not run_dir.is_relative_to(ROOT)
    _absent(bin_dir, run_dir)
    for script in CORE_SCRIPTS:
        _run([str(bin_dir / script), "--help"], run_dir, 60, _clean_env())
    # mqaudit without its extra: one line saying how to add it (exit 2), no traceback.
    audit = subprocess.run(
        [str(bin_dir / "mqaudit"), "--help"],
        cwd=run_dir,
        env=_clean_env(),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert audit.returncode == 2, audit.stderr[-2000:]
    assert "pip install 'raftmq[audit]'" in audit.stderr and "Traceback" not in audit.stderr
    mqcluster = [str(bin_dir / "mqcluster"), "--base-dir", str(cluster_dir)]
    up = _run([*mqcluster, "up", "--auto-ports"], run_dir, TOOL_TIMEOUT_S, _clean_env())
    started = _cluster_pids(cluster_dir)
    _STARTED.extend(started.items())
    assert len(started) == 4, (started, up)  # the NameServer and three nodes
    for pid in started:
        exe = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode()
        assert Path(exe).parent == bin_dir, (pid, exe)
    namesrv = re.search(r"namesrv: (127\.0\.0\.1:\d+)", up)
    assert namesrv is not None, up
    # The two exports `mqcluster up` prints (README "A local group").
    tools = _clean_env(
        RAFTMQ_CREDENTIALS=str(cluster_dir / "admin.json"),
        RAFTMQ_TLS_CA=str(cluster_dir / "tls" / "ca.crt"),
    )
    assert f"export RAFTMQ_CREDENTIALS={tools['RAFTMQ_CREDENTIALS']}" in up, up
    admin = [str(bin_dir / "mqadmin"), "-n", namesrv.group(1)]
    _run([*admin, "updateTopic", "-t", TOPIC, "-r", "4", "-w", "4"], run_dir, 60, tools)
    assert TOPIC in _run([*admin, "topicList"], run_dir, 60, tools).split()
    script = [str(bin_dir / "python"), "-c", CLIENT_SCRIPT, namesrv.group(1)]
    script += [tools["RAFTMQ_TLS_CA"], tools["RAFTMQ_CREDENTIALS"], TOPIC, str(MESSAGES)]
    report = json.loads(_run(script, run_dir, CLIENT_TIMEOUT_S, tools).splitlines()[-1])
    assert len(report["sent"]) == MESSAGES
    assert sorted(report["sent"]) == report["received"]
    site = bin_dir.parent / "lib"
    outside = [f for f in report["files"] if not Path(f).is_relative_to(site)]
    assert not outside, f"imported from outside the venv: {outside}"
    assert STUBS.rstrip("/") in report["files"][-1]
    status = json.loads(_run([*admin, "--json", "topicStatus", "-t", TOPIC], run_dir, 60, tools))
    assert sum(q["max_offset"] for q in status) == MESSAGES, status
    _run([*mqcluster, "down"], run_dir, TOOL_TIMEOUT_S, _clean_env())
    wait_for(
        lambda: not [p for p, conf in started.items() if _pid_alive(p, conf)],
        STOP_DEADLINE_S,
        "every process of the cluster gone",
    )
