"""Memory while a follower catches up (issue 36): ``python -m bench.catchup``.

Each round starts a fresh insecure 3-node group with a NameServer
(``bench.__main__.local_group``), then:

1. stops a follower (SIGTERM, as ``bench.backlog``);
2. fills the topic with ``--messages`` messages of ``--size`` bytes (``bench.backlog``'s
   ``Filler``: ``send_batch`` calls of 256 messages from 4 producers x 2 threads), which the
   leader and the other follower store and commit;
3. starts the follower again and samples every node's ``RssAnon`` (``/proc/PID/status``) every
   ``--sample-ms`` from that moment until the follower has applied the commit index the
   leader had when the fill ended (the **catch-up**), and for ``--settle-seconds`` more (one
   period of the brokers' ``malloc_trim``, ``prockit.malloc.TRIM_INTERVAL_S``, by default);
4. reports per node: ``RssAnon`` before the start, its peak during the catch-up (and when, in
   seconds from the start), at the catch-up's end and after the settle; the catch-up's
   duration.

``--compare DIR`` runs the same rounds on brokers of another checkout (its code, this load),
the two trees alternating round by round, so that both see the same minutes of a shared
machine (``bench.steps``' way: the brokers' ``PYTHONPATH``). ``--node-env NODE:KEY=VALUE``
adds to one broker's environment (a diagnostic hook). Bounded: every wait has a deadline, the
fill at most ``MAX_MESSAGES`` (about 10 GB of disk for the three replicas at 64 KiB), the group
stopped and its files deleted after each round. Writes ``bench/results/catchup-<UTC>.json`` and
``.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from bench.__main__ import local_group
from bench.backlog import (
    Filler,
    _metadata,
    _metadata_of,
    _pids,
    _stop,
    parse_node_env,
)
from bench.memory import MemorySampler, Sample
from bench.sweep import create_work_dir, sweep_stale

RESULTS_DIR = Path(__file__).parent / "results"
WORK_PREFIX = "raftmq-catchup-"
DEFAULT_MESSAGES = 300_000
DEFAULT_SIZE = 1024
MAX_MESSAGES = 3_000_000
MAX_SIZE = 64 * 1024
# The fill's bytes (one replica), at most: three replicas of this stay under 10 GB of disk.
MAX_FILL_BYTES = 3 * 1024**3
DEFAULT_ROUNDS = 1
MAX_ROUNDS = 20
# Fast enough to see a burst that lasts a few tens of milliseconds; three small reads a sample.
DEFAULT_SAMPLE_MS = 20
# One malloc_trim period of the brokers (prockit.malloc.TRIM_INTERVAL_S) and a little more.
DEFAULT_SETTLE_S = 35.0
# The fill (a few hundred MB) and the catch-up each take at most this long.
FILL_TIMEOUT_S = 600.0
CATCH_UP_TIMEOUT_S = 300.0
POLL_S = 0.05
MIB = 1024 * 1024


def _commit_and_leader(cluster: Any, timeout_s: float = 60.0) -> tuple[str, int]:
    """The leader's id and commit index, once a leader answers."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for node_id, md in _metadata(cluster).items():
            if md.role == "LEADER":
                return node_id, int(md.commit_index)
        time.sleep(POLL_S)
    raise TimeoutError(f"no leader answered within {timeout_s:.0f} s")


def _wait_applied(addr: str, index: int, timeout_s: float) -> float:
    """Monotonic time at which the node at ``addr`` was first seen applied up to ``index``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        md = _metadata_of(addr)
        if md is not None and int(md.applied_index) >= index:
            return time.monotonic()
        time.sleep(POLL_S)
    raise TimeoutError(f"{addr} did not apply {index} within {timeout_s:.0f} s")


def window_figures(samples: Sequence[Sample], t0: float, t1: float) -> dict[str, dict[str, float]]:
    """Per process, the highest RssAnon (MB) of the samples in [t0, t1] and its time from t0,
    and the last sample's figure in the window."""
    out: dict[str, dict[str, float]] = {}
    for t, mems in samples:
        if not t0 <= t <= t1:
            continue
        for name, mem in mems.items():
            mb = mem.rss_anon_kib / 1024
            cur = out.setdefault(name, {"peak_mb": mb, "peak_at_s": t - t0, "last_mb": mb})
            if mb > cur["peak_mb"]:
                cur["peak_mb"], cur["peak_at_s"] = mb, t - t0
            cur["last_mb"] = mb
    return out


def one_round(cluster: Any, a: argparse.Namespace) -> dict[str, Any]:
    """Stop a follower, fill, start it, sample (the module's docstring)."""
    assert cluster.namesrv is not None
    leader = cluster.wait_leader()
    follower = next(n.node_id for n in cluster.nodes if n.node_id != leader)
    _stop(cluster, follower)
    t_fill = time.monotonic()
    with (
        MemorySampler(_pids(cluster), interval_s=a.sample_ms / 1000) as fill_sampler,
        Filler(cluster.namesrv.addr, a.size) as filler,
    ):
        stored = filler.fill(a.messages, t_fill + FILL_TIMEOUT_S)
    fill_s = time.monotonic() - t_fill
    during_fill = window_figures(fill_sampler.samples(), t_fill, float("inf"))
    leader, commit = _commit_and_leader(cluster)
    pids = _pids(cluster)
    with MemorySampler(pids, interval_s=a.sample_ms / 1000) as before:
        pass
    cluster.start(follower)
    pids[follower] = cluster.pid(cluster.node(follower))
    with MemorySampler(pids, interval_s=a.sample_ms / 1000) as sampler:
        t0 = time.monotonic()
        t1 = _wait_applied(cluster.node(follower).client_addr, commit, CATCH_UP_TIMEOUT_S)
        time.sleep(a.settle_seconds)  # sampling meanwhile: what the peak leaves behind
    samples = sampler.samples()
    catch_up = window_figures(samples, t0, t1)
    settled = window_figures(samples, t1 + a.settle_seconds - 1.0, float("inf"))
    return {
        "leader": leader,
        "follower": follower,
        "stored": stored,
        "fill_s": fill_s,
        "failed_calls": filler.failed_calls,
        "commit_index": commit,
        "catch_up_s": t1 - t0,
        "samples": len(samples),
        "before_mb": {k: m.rss_anon_kib / 1024 for k, m in before.samples()[-1][1].items()},
        "fill_peak_mb": {k: v["peak_mb"] for k, v in during_fill.items()},
        "catch_up": catch_up,
        "settled_mb": {k: v["last_mb"] for k, v in settled.items()},
    }


@contextmanager
def tree_group(work: Path, a: argparse.Namespace, root: Path, keys: Any) -> Iterator[Any]:
    """A group whose brokers run ``root``'s code (``bench.steps``' way)."""
    env = {"PYTHONPATH": os.pathsep.join([str(root), str(root / "gen")])}
    cwd = os.getcwd()
    os.chdir(work)  # ``python -m broker`` puts its cwd first on sys.path: a neutral one
    try:
        with local_group(
            work,
            a.flush,
            False,
            name="catchup",
            metrics=False,
            node_env=env,
            env_of_node=parse_node_env(a.node_env),
            broker_keys=keys,
        ) as cluster:
            yield cluster
    finally:
        os.chdir(cwd)


def run(a: argparse.Namespace, work: Path) -> dict[str, Any]:
    from bench.steps import broker_keys

    this = Path(__file__).resolve().parent.parent
    trees: list[tuple[str, Path, Any]] = [("this", this, None)]
    if a.compare:
        other = Path(a.compare).resolve()
        trees.append(("base", other, broker_keys(other)))
    rounds: dict[str, list[dict[str, Any]]] = {name: [] for name, _, _ in trees}
    for r in range(a.rounds):
        for name, root, keys in trees if r % 2 == 0 else trees[::-1]:
            with tree_group(work, a, root, keys) as cluster:
                res = one_round(cluster, a)
            res["load_avg"] = os.getloadavg()
            rounds[name].append(res)
            print(f"{name} round {r + 1}: {summary_line(res)}", flush=True)
            shutil.rmtree(work / "catchup", ignore_errors=True)
    return {"args": vars(a), "trees": {n: str(p) for n, p, _ in trees}, "rounds": rounds}


def summary_line(res: Mapping[str, Any]) -> str:
    parts = []
    for node, fig in sorted(res["catch_up"].items()):
        role = "L" if node == res["leader"] else "F*" if node == res["follower"] else "F"
        parts.append(
            f"{node}({role}) {res['before_mb'].get(node, 0):.0f}->"
            f"{fig['peak_mb']:.0f}@{fig['peak_at_s']:.1f}s->"
            f"{res['settled_mb'].get(node, 0):.0f}"
        )
    fill = ", ".join(f"{k} {v:.0f}" for k, v in sorted(res["fill_peak_mb"].items()))
    return (
        f"fill {res['stored']:,} in {res['fill_s']:.1f} s (peaks MB {fill}); catch-up "
        f"{res['catch_up_s']:.1f} s; MB before->peak@t->settled: " + ", ".join(parts)
    )


def markdown(r: Mapping[str, Any]) -> str:
    a = r["args"]
    lines = [
        f"# Memory while a follower catches up ({r['stamp']})",
        "",
        f"`{a['messages']:,} x {a['size']} B`, {a['flush']}, samples every {a['sample_ms']} ms,"
        f" settle {a['settle_seconds']:g} s. Trees: "
        + ", ".join(f"{n} `{p}`" for n, p in r["trees"].items()),
        "",
        "| tree | round | catch-up s | leader MB before / peak / settled | caught-up follower |"
        " other follower | load |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name, rounds in r["rounds"].items():
        for i, res in enumerate(rounds):
            other = next(n for n in res["catch_up"] if n not in (res["leader"], res["follower"]))
            cells = [_node_cell(res, n) for n in (res["leader"], res["follower"], other)]
            lines.append(
                f"| {name} | {i + 1} | {res['catch_up_s']:.1f} | "
                + " | ".join(cells)
                + f" | {res['load_avg'][0]:.1f} |"
            )
    return "\n".join(lines) + "\n"


def _node_cell(res: Mapping[str, Any], node: str) -> str:
    fig = res["catch_up"].get(node, {})
    return (
        f"{res['before_mb'].get(node, 0):.0f} / {fig.get('peak_mb', 0):.0f} / "
        f"{res['settled_mb'].get(node, 0):.0f}"
    )


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench.catchup", description=__doc__)
    p.add_argument("--messages", type=int, default=DEFAULT_MESSAGES)
    p.add_argument("--size", type=int, default=DEFAULT_SIZE, help="message body bytes")
    p.add_argument("--rounds", type=int, default=DEFAULT_ROUNDS)
    p.add_argument("--flush", choices=("ASYNC_FLUSH", "SYNC_FLUSH"), default="ASYNC_FLUSH")
    p.add_argument("--sample-ms", type=int, default=DEFAULT_SAMPLE_MS)
    p.add_argument("--settle-seconds", type=float, default=DEFAULT_SETTLE_S)
    p.add_argument("--compare", default="", help="another checkout, alternating with this one")
    p.add_argument("--out", default=str(RESULTS_DIR))
    p.add_argument("--work", default=None, help="where the groups' files go (a temp dir)")
    p.add_argument(
        "--node-env",
        action="append",
        default=[],
        metavar="NODE:KEY=VALUE",
        help="extra environment of one broker (n0, n1 or n2); repeat for more",
    )
    return p


def check_args(a: argparse.Namespace) -> str:
    """Why the arguments cannot run ("" when they can)."""
    if not 0 < a.messages <= MAX_MESSAGES or not 0 < a.size <= MAX_SIZE:
        return f"--messages must be in [1, {MAX_MESSAGES:,}] and --size in [1, {MAX_SIZE}]"
    if a.messages * a.size > MAX_FILL_BYTES:
        return f"--messages x --size is over {MAX_FILL_BYTES / 1e9:.1f} GB"
    if not 0 < a.rounds <= MAX_ROUNDS:
        return f"--rounds must be in [1, {MAX_ROUNDS}]"
    if not 5 <= a.sample_ms <= 1000 or not 0 <= a.settle_seconds <= 300:
        return "--sample-ms must be in [5, 1000] and --settle-seconds in [0, 300]"
    try:
        parse_node_env(a.node_env)
    except ValueError as e:
        return str(e)
    return ""


def main(argv: list[str] | None = None) -> int:
    a = _parser().parse_args(argv)
    problem = check_args(a)
    if problem:
        print(problem, file=sys.stderr)
        return 2
    sweep_stale(a.work)
    work = create_work_dir(WORK_PREFIX, a.work)
    try:
        result = run(a, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    result["stamp"] = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"catchup-{result['stamp']}.md"
    path.with_suffix(".json").write_text(json.dumps(result, indent=1))
    path.write_text(markdown(result))
    print(path.read_text())
    print(f"wrote {path} (.json)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
