"""Our client's CPU per send, same-run A/B between two checkouts (issue 36).

Each round starts, per tree (alternating, the tree's own code on PYTHONPATH), a fresh insecure
3-node group with a NameServer and, per in-flight level, runs one ``bench.loadgen`` process (the
real ``client.Producer``: ``send_async`` chains) twice: ``--long-s`` and ``--short-s`` seconds.
The load generator's CPU (user + system, from the children's rusage) of the two runs differ by
its CPU for the extra sends only, so its start-up (imports, the route, the channels) drops
out: CPU per send = (cpu_long - cpu_short) / (sends_long - sends_short). Writes
``bench/results/clientcpu-<UTC>.md`` and ``.json``.

    python -m bench.clientcpu --before ../old-checkout [--after .] [--rounds 2]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench.compare import ROUND_TIMEOUT_S, _revision
from bench.sweep import create_work_dir, sweep_stale

RESULTS_DIR = Path(__file__).parent / "results"
DEFAULT_IN_FLIGHT = (1, 16)
# The two runs per case: long enough for many sends, short enough that the start-up is a large
# share (the difference is what is measured).
LONG_S = 16.0
SHORT_S = 2.0
MIN_SEND_DIFFERENCE = 100  # fewer extra sends than this: no figure (the group did not work)

# The worker, run inside the tree under test: a group, a warm-up, then per level the loadgen's
# long and short runs with their CPU (children's rusage around each).
WORKER = """
import json, os, subprocess, sys
from pathlib import Path
from bench.__main__ import TOPIC, local_group, produce_case
base, flush, size = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
long_s, short_s, levels = sys.argv[4], sys.argv[5], [int(x) for x in sys.argv[6].split(",")]
out = []
with local_group(base, flush, False, metrics=False) as cl:
    produce_case(cl, int(size), 16, 1.0)  # warm-up: connections, first segment
    for n in levels:
        runs = []
        for secs in (long_s, short_s):
            cmd = [sys.executable, "-m", "bench.loadgen", "--namesrv", cl.namesrv.addr,
                   "--topic", TOPIC, "--size", size, "--in-flight", str(n), "--seconds", secs,
                   *cl.tool_argv()]
            t0 = os.times()
            done = subprocess.run(cmd, capture_output=True, text=True, check=True)
            t1 = os.times()
            cpu = (t1.children_user + t1.children_system) - (t0.children_user + t0.children_system)
            sent = json.loads(done.stdout.strip().splitlines()[-1])["sent"]
            runs.append({"seconds": float(secs), "sent": sent, "cpu_s": cpu})
        out.append({"in_flight": n, "runs": runs})
print(json.dumps(out))
"""


def _run_round(tree: Path, flush: str, size: int, levels: str) -> list[Any]:
    env = dict(os.environ, PYTHONPATH=f"{tree}:{tree / 'gen'}")
    base = create_work_dir("raftmq-compare-cpu-")  # bench.sweep: a later run sweeps it if killed
    argv = [str(base), flush, str(size), str(LONG_S), str(SHORT_S), levels]
    try:
        done = subprocess.run(
            [sys.executable, "-c", WORKER, *argv],
            cwd=tree,
            env=env,
            capture_output=True,
            text=True,
            timeout=ROUND_TIMEOUT_S,
        )
    finally:
        shutil.rmtree(base, ignore_errors=True)
    if done.returncode != 0:
        raise RuntimeError(f"{tree}: round failed: {done.stderr.strip()[-800:]}")
    return list(json.loads(done.stdout.strip().splitlines()[-1]))


def cpu_per_send_us(runs: list[dict[str, Any]]) -> float | None:
    """The loadgen's CPU per extra send of the long run over the short one, in microseconds;
    None when the long run sent too few more messages to tell."""
    long_run, short_run = runs
    sends = long_run["sent"] - short_run["sent"]
    if sends < MIN_SEND_DIFFERENCE:
        return None
    return float((long_run["cpu_s"] - short_run["cpu_s"]) / sends * 1e6)


def _table(rows: dict[str, list[list[dict[str, Any]]]], names: dict[str, str]) -> list[str]:
    trees = list(rows)
    lines = [
        "| in flight | "
        + " | ".join(f"{names[t]}: CPU us per send (rounds) | msg/s" for t in trees)
        + " | after / before |",
        "| --- |" + " --- | --- |" * len(trees) + " --- |",
    ]
    for i, level in enumerate(c["in_flight"] for c in rows[trees[0]][0]):
        cells, medians = [], []
        for t in trees:
            per = [cpu_per_send_us(rnd[i]["runs"]) for rnd in rows[t]]
            known = [p for p in per if p is not None]
            medians.append(statistics.median(known) if known else 0.0)
            rate = statistics.median(
                rnd[i]["runs"][0]["sent"] / rnd[i]["runs"][0]["seconds"] for rnd in rows[t]
            )
            shown = ", ".join("-" if p is None else f"{p:,.0f}" for p in per)
            cells.append(f"{medians[-1]:,.0f} ({shown}) | {rate:,.0f}")
        ratio = medians[-1] / medians[0] if medians[0] else 0.0
        lines.append(f"| {level} | " + " | ".join(cells) + f" | {ratio:.2f}x |")
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.clientcpu", description=__doc__)
    p.add_argument("--before", required=True, type=Path, help="the checkout to compare with")
    p.add_argument("--after", default=Path(__file__).resolve().parents[1], type=Path)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--size", type=int, default=1024)
    p.add_argument("--flush", default="SYNC_FLUSH", choices=("SYNC_FLUSH", "ASYNC_FLUSH"))
    p.add_argument("--in-flight", default=",".join(map(str, DEFAULT_IN_FLIGHT)))
    p.add_argument("--out", default=str(RESULTS_DIR), type=Path)
    a = p.parse_args(argv)
    sweep_stale()
    if not 1 <= a.rounds <= 20 or not 1 <= a.size <= 4 << 20:
        p.error("--rounds is 1 to 20, --size 1 to 4 MiB")
    trees = {"before": a.before.resolve(), "after": a.after.resolve()}
    names = {k: f"{k} {_revision(t)}" for k, t in trees.items()}
    rows: dict[str, list[list[dict[str, Any]]]] = {k: [] for k in trees}
    for rnd in range(a.rounds):
        order = list(trees) if rnd % 2 == 0 else list(reversed(trees))
        for k in order:
            rows[k].append(_run_round(trees[k], a.flush, a.size, a.in_flight))
            print(f"round {rnd + 1}/{a.rounds} {names[k]} done", file=sys.stderr)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    a.out.mkdir(parents=True, exist_ok=True)
    title = (
        f"{a.flush}, {a.size} B, one bench.loadgen process, CPU of {LONG_S:g} s minus "
        f"{SHORT_S:g} s runs per extra send, {a.rounds} alternating rounds"
    )
    text = "\n".join([f"# Client CPU per send ({stamp})", "", title, "", *_table(rows, names)])
    (a.out / f"clientcpu-{stamp}.md").write_text(text + "\n")
    (a.out / f"clientcpu-{stamp}.json").write_text(json.dumps({"names": names, "rows": rows}))
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
