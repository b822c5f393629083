"""Same-run A/B of the produce path between two checkouts (issue #33: "same-run mqbench
before and after"): rounds alternate the trees, each round starts a fresh 3-node group with a
NameServer from one tree (its own code on PYTHONPATH, mqbench's ``local_group`` and
``produce_case`` of that tree) and runs every in-flight level, so both trees see the same
machine minute by minute. Writes ``bench/results/compare-<UTC>.md`` and ``.json``.

    python -m bench.compare --before ../old-checkout [--after .] [--rounds 3]

A checkout needs its ``gen/`` (committed) and, for the v2 stubs, the usual build directory.
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

from bench.sweep import create_work_dir, sweep_stale

RESULTS_DIR = Path(__file__).parent / "results"
# One round of one tree: set-up and teardown of a group (~10 s) and the cases; a hung round is
# killed so the comparison ends by itself.
ROUND_TIMEOUT_S = 600.0
DEFAULT_IN_FLIGHT = (1, 16, 256)

# The worker: run inside the tree under test (its ``bench`` package on sys.path). Uses only
# ``local_group`` and ``produce_case``, whose signatures every mqbench since issue #10 shares.
WORKER = """
import json, sys
from pathlib import Path
from bench.__main__ import local_group, produce_case
base, flush, size, seconds = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
levels = [int(x) for x in sys.argv[5].split(",")]
out = []
with local_group(base, flush, False) as cluster:
    produce_case(cluster, size, 16, 1.0)  # warm-up: connections, first segment
    for n in levels:
        out.append(produce_case(cluster, size, n, seconds))
print(json.dumps(out))
"""


def _run_round(tree: Path, flush: str, size: int, seconds: float, levels: str) -> list[Any]:
    env = dict(os.environ, PYTHONPATH=f"{tree}:{tree / 'gen'}")
    base = create_work_dir("raftmq-compare-")  # swept by a later run if this one is killed
    try:
        cmd = [sys.executable, "-c", WORKER, str(base), flush, str(size), str(seconds), levels]
        done = subprocess.run(
            cmd, cwd=tree, env=env, capture_output=True, text=True, timeout=ROUND_TIMEOUT_S
        )
    finally:
        shutil.rmtree(base, ignore_errors=True)
    if done.returncode != 0:
        raise RuntimeError(f"{tree}: round failed: {done.stderr.strip()[-800:]}")
    return list(json.loads(done.stdout.strip().splitlines()[-1]))


def _revision(tree: Path) -> str:
    done = subprocess.run(
        ["git", "-C", str(tree), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    )
    return done.stdout.strip() or str(tree)


def _table(rows: dict[str, list[list[dict[str, Any]]]], names: dict[str, str]) -> list[str]:
    """One row per in-flight level: each tree's median msg/s, p50 and leader CPU per message."""
    lines = [
        "| in flight | "
        + " | ".join(f"{names[t]} msg/s (rounds) | p50 ms" for t in rows)
        + " | after / before |",
        "| --- |" + " --- | --- |" * len(rows) + " --- |",
    ]
    trees = list(rows)
    for i, level in enumerate(r["in_flight"] for r in rows[trees[0]][0]):
        cells, medians = [], []
        for t in trees:
            rates = [rnd[i]["messages_per_s"] for rnd in rows[t]]
            p50 = statistics.median(rnd[i]["p50_ms"] for rnd in rows[t])
            medians.append(statistics.median(rates))
            rounds = ", ".join(f"{r:,.0f}" for r in rates)
            cells.append(f"{medians[-1]:,.0f} ({rounds}) | {p50:.2f}")
        ratio = medians[-1] / medians[0] if medians[0] else 0.0
        lines.append(f"| {level} | " + " | ".join(cells) + f" | {ratio:.2f}x |")
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.compare", description=__doc__)
    p.add_argument("--before", required=True, type=Path, help="the checkout to compare with")
    p.add_argument("--after", default=Path(__file__).resolve().parents[1], type=Path)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--seconds", type=float, default=4.0, help="each case")
    p.add_argument("--size", type=int, default=1024)
    p.add_argument("--flush", default="SYNC_FLUSH", choices=("SYNC_FLUSH", "ASYNC_FLUSH"))
    p.add_argument("--in-flight", default=",".join(map(str, DEFAULT_IN_FLIGHT)))
    p.add_argument("--out", default=str(RESULTS_DIR), type=Path)
    a = p.parse_args(argv)
    sweep_stale()  # groups a killed run left behind (bench.sweep)
    if not 1 <= a.rounds <= 20 or not 0.5 <= a.seconds <= 60:
        p.error("--rounds is 1 to 20, --seconds 0.5 to 60")
    trees = {"before": a.before.resolve(), "after": a.after.resolve()}
    names = {k: f"{k} {_revision(t)}" for k, t in trees.items()}
    rows: dict[str, list[list[dict[str, Any]]]] = {k: [] for k in trees}
    for rnd in range(a.rounds):
        order = list(trees) if rnd % 2 == 0 else list(reversed(trees))
        for k in order:
            rows[k].append(_run_round(trees[k], a.flush, a.size, a.seconds, a.in_flight))
            print(f"round {rnd + 1}/{a.rounds} {names[k]} done", file=sys.stderr)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    a.out.mkdir(parents=True, exist_ok=True)
    title = f"{a.flush}, {a.size} B, {a.seconds:g} s per case, {a.rounds} alternating rounds"
    text = "\n".join([f"# Same-run comparison ({stamp})", "", title, "", *_table(rows, names)])
    (a.out / f"compare-{stamp}.md").write_text(text + "\n")
    (a.out / f"compare-{stamp}.json").write_text(json.dumps({"names": names, "rows": rows}))
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
