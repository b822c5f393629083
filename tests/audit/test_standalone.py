"""The same audit on a standalone Spark master and worker started from the installed pyspark
package's own ``bin/spark-class`` on 127.0.0.1: same findings and checksums as local mode."""

from __future__ import annotations

import contextlib
import json
import mmap
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import pytest
from support import wait_for

from dledger.storage import codec
from dledger.storage.codec import ENTRY_HEADER_SIZE, INDEX_RECORD_SIZE
from mqcluster.cluster import _free_ports
from spark_audit.__main__ import main

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = [pytest.mark.spark, pytest.mark.integration]

# Master and worker are ready in about 6 s on this kind of machine; generous for a busy CI box.
READY_S = 90.0
STOP_GRACE_S = 10.0
# The audit subprocess: a session start, a first Python worker, the job.
AUDIT_TIMEOUT_S = 240.0
WORKER_MEMORY = "1g"
REPO_ROOT = Path(__file__).resolve().parents[2]
EXECUTOR_MEMORY = "512m"


class GroupStores(Protocol):
    last_index: int

    def copy(self, dest: Path) -> dict[str, Path]: ...


def spark_class() -> Path:
    import pyspark

    return Path(pyspark.__file__).parent / "bin" / "spark-class"


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["SPARK_LOCAL_IP"] = "127.0.0.1"
    env["PYSPARK_PYTHON"] = sys.executable
    env["PYSPARK_DRIVER_PYTHON"] = sys.executable
    env.pop("MASTER", None)
    return env


def _start(args: list[str], log: Path) -> subprocess.Popen[bytes]:
    with open(log, "ab") as out:
        return subprocess.Popen(
            [str(spark_class()), *args],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=_env(),
            start_new_session=True,
        )


def _stop(proc: subprocess.Popen[Any]) -> None:
    """Stop one process we started, by its PID (spark-class execs the JVM: same PID)."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGKILL)
            proc.wait(STOP_GRACE_S)


@pytest.fixture
def standalone(tmp_path: Path) -> Iterator[str]:
    """A standalone master and one worker on free 127.0.0.1 ports; stopped by PID always.
    Both start at once (the worker retries until the master is up)."""
    master_port, master_ui, worker_port, worker_ui = _free_ports(4)
    url = f"spark://127.0.0.1:{master_port}"
    master_log, worker_log = tmp_path / "master.log", tmp_path / "worker.log"
    procs: list[subprocess.Popen[bytes]] = []
    try:
        procs.append(
            _start(
                [
                    "org.apache.spark.deploy.master.Master",
                    "--host", "127.0.0.1",
                    "--port", str(master_port),
                    "--webui-port", str(master_ui),
                ],
                master_log,
            )
        )  # fmt: skip
        procs.append(
            _start(
                [
                    "org.apache.spark.deploy.worker.Worker",
                    "--host", "127.0.0.1",
                    "--port", str(worker_port),
                    "--webui-port", str(worker_ui),
                    "--cores", "2",
                    "--memory", WORKER_MEMORY,
                    "--work-dir", str(tmp_path / "work"),
                    url,
                ],
                worker_log,
            )
        )  # fmt: skip
        wait_for(
            lambda: (
                "I have been elected leader" in master_log.read_text(errors="replace")
                or procs[0].poll() is not None
            ),
            READY_S,
            "the Spark master to start",
        )
        assert procs[0].poll() is None, master_log.read_text()
        wait_for(
            lambda: (
                "Successfully registered with master" in worker_log.read_text(errors="replace")
                or procs[1].poll() is not None
            ),
            READY_S,
            "the Spark worker to register",
        )
        assert procs[1].poll() is None, worker_log.read_text()
        yield url
    finally:
        for proc in reversed(procs):
            _stop(proc)
    for proc in procs:
        assert proc.poll() is not None


def _comparable(report: Any) -> Any:
    """What must not depend on where the job ran."""
    return [
        {
            "audited_index": g["audited_index"],
            "replicas": [
                {k: r[k] for k in ("replica", "status", "last_index", "committed", "segments")}
                for r in g["replicas"]
            ],
            "pairs": g["pairs"],
            "findings": g["findings"],
            "ranges": g["ranges"],
        }
        for g in report["groups"]
    ]


def test_standalone_cluster_gives_the_local_result(
    spark: SparkSession, group_stores: GroupStores, standalone: str, tmp_path: Path
) -> None:
    stores = group_stores.copy(tmp_path / "stores")
    # One fault so that the comparison covers findings too: a flipped bit on n1.
    store = stores["n1"]
    index = group_stores.last_index // 2
    byte = index * INDEX_RECORD_SIZE
    index_file = sorted((store / "index").iterdir())[0]
    rec = codec.decode_index_record(index_file.read_bytes(), byte)
    seg = sorted((store / "commitlog").iterdir())[rec.position // (4 << 20)]
    with open(seg, "r+b") as f:
        mm = mmap.mmap(f.fileno(), 0)
        mm[rec.position % (4 << 20) + ENTRY_HEADER_SIZE + 7] ^= 0x01
        mm.close()
    dirs = [str(p) for p in stores.values()]
    cluster_json = tmp_path / "cluster.json"
    # The cluster run (its own driver process: one SparkContext per process) starts first
    # and boots while the local run goes on in the shared session.
    proc = subprocess.Popen(
        [
            sys.executable, "-m", "spark_audit", *dirs,
            "--master", standalone,
            "--conf", f"spark.executor.memory={EXECUTOR_MEMORY}",
            "--json", str(cluster_json),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**_env(), "PYTHONPATH": str(REPO_ROOT)},
        cwd=tmp_path,  # the code reaches the executors by addPyFile, not by the cwd
    )  # fmt: skip
    try:
        local_json = tmp_path / "local.json"
        assert main([*dirs, "--json", str(local_json), "-q"], spark=spark) == 1
        _, stderr = proc.communicate(timeout=AUDIT_TIMEOUT_S)
    finally:
        _stop(proc)
    assert proc.returncode == 1, stderr[-3000:]
    assert "job done" in stderr
    local, cluster = json.loads(local_json.read_text()), json.loads(cluster_json.read_text())
    assert cluster["master"] == standalone
    assert _comparable(cluster) == _comparable(local)
    # The entry's damage, and the range verdict that names n1 and its repair.
    found = [(f["what"], f["replica"]) for f in cluster["groups"][0]["findings"]]
    assert found == [("damaged_range", "n1"), ("corrupt_entry", "n1")]
