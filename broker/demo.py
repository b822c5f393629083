"""``make demo``: a local 3-node group over gRPC, a leader failover, and a check of every replica.

Steps: start a 3-node group (``mqcluster up``), append a batch stream through the client
service, SIGKILL the leader under load and time the failover, restart the old leader and wait
until it catches up, compare every replica's committed log, tear everything down.
"""

from __future__ import annotations

import argparse
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path

from broker.cluster import ClusterError, LocalCluster, format_table
from dledger.server.client import ClientError

# Bounds of the demo's load (it must stop by itself).
DEMO_BATCHES = 200
DEMO_BATCH_SIZE = 50
DEMO_MAX_SECONDS = 120


def _say(text: str) -> None:
    print(f"\n== {text}", flush=True)


def run(base_dir: Path) -> int:
    cluster = LocalCluster(base_dir / "group")
    # Small segments: the demo writes a few MB; default 1 GiB segments are for production.
    cluster.configure(3, auto_ports=True, extra={"mappedFileSizeCommitLog": str(16 << 20)})
    try:
        _say("starting a 3-node DLedger group on 127.0.0.1")
        leader = cluster.up()
        print(format_table(cluster.status_rows()))
        client = cluster.client()

        _say(f"appending {DEMO_BATCHES} batches of {DEMO_BATCH_SIZE} entries through gRPC")
        acked: list[bytes] = []
        ack_times: list[float] = []
        stop = threading.Event()
        errors: list[str] = []

        def writer() -> None:
            deadline = time.monotonic() + DEMO_MAX_SECONDS
            for b in range(DEMO_BATCHES):
                if stop.is_set() or time.monotonic() > deadline:
                    return
                bodies = [f"demo-{b:04d}-{i:02d}".encode() for i in range(DEMO_BATCH_SIZE)]
                try:
                    client.append(bodies)
                except ClientError as exc:
                    errors.append(exc.code)
                    time.sleep(0.02)
                    continue
                acked.extend(bodies)
                ack_times.append(time.monotonic())

        started = time.monotonic()
        thread = threading.Thread(target=writer, daemon=True)
        thread.start()
        while len(ack_times) < DEMO_BATCHES // 3 and thread.is_alive():
            time.sleep(0.01)

        _say(f"SIGKILL the leader {leader} while appends continue")
        cluster.signal(leader, signal.SIGKILL)
        killed_at = time.monotonic()
        new_leader = cluster.wait_leader(exclude=leader)
        thread.join(DEMO_MAX_SECONDS)
        stop.set()
        after = [t for t in ack_times if t > killed_at]
        failover_s = (after[0] - killed_at) if after else float("nan")
        elapsed = time.monotonic() - started
        print(
            f"new leader: {new_leader}; failover (kill -> next acknowledged append): "
            f"{failover_s * 1000:.0f} ms"
        )
        print(
            f"acknowledged {len(acked)} entries in {elapsed:.2f} s; "
            f"failed or unknown-outcome batches: {len(errors)} {sorted(set(errors))}"
        )
        print(format_table(cluster.status_rows()))

        _say(f"restarting {leader}; it must catch up from the new leader")
        cluster.start(leader)
        deadline = time.monotonic() + 30
        logs: dict[str, list[bytes]] = {}
        while time.monotonic() < deadline:
            rows = cluster.status_rows()
            commits = {r["commit"] for r in rows}
            if len(commits) == 1 and all(r["role"] in ("LEADER", "FOLLOWER") for r in rows):
                break
            time.sleep(0.1)
        print(format_table(cluster.status_rows()))
        for n in cluster.nodes:
            logs[n.node_id] = [e.body for e in client.read_all(n.client_addr) if e.type == 0]
        first = logs[cluster.nodes[0].node_id]
        same = all(log == first for log in logs.values())
        present = set(first)
        lost = [v for v in acked if v not in present]
        dupes = len(first) - len(present)
        _say("verdict")
        print(
            f"replicas identical: {same}; entries per replica: "
            f"{ {k: len(v) for k, v in logs.items()} }"
        )
        print(f"acknowledged entries lost: {len(lost)}; duplicated entries: {dupes}")
        client.close()
        ok = same and not lost and dupes == 0
        print("DEMO OK" if ok else "DEMO FAILED")
        return 0 if ok else 1
    except ClusterError as exc:
        print(f"demo: {exc}", file=sys.stderr)
        return 1
    finally:
        _say("tearing down")
        cluster.down()
        print("all nodes stopped")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="raftmq-demo", description=__doc__)
    parser.add_argument("--base-dir", help="keep data and logs here (default: a temp dir)")
    ns = parser.parse_args(argv)
    if ns.base_dir:
        return run(Path(ns.base_dir))
    with tempfile.TemporaryDirectory(prefix="raftmq-demo-") as tmp:
        return run(Path(tmp))


if __name__ == "__main__":
    sys.exit(main())
