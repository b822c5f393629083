"""``python -m dledger.sim``: run simulated Raft groups over many seeds and check invariants.

Exit status: 0 no violation, 1 a violation (seed, minimized fault schedule and trace are
printed), 2 bad usage.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Sequence
from dataclasses import asdict

from dledger.core.config import MAX_GROUP_SIZE, MUTATIONS
from dledger.sim.faults import FaultEvent, minimize
from dledger.sim.runner import run_seeds
from dledger.sim.sim import DRIVER_MUTATIONS, SimResult, run_seed

PROGRESS_WIDTH = 40


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m dledger.sim",
        description="Deterministic simulation of a DLedger Raft group under faults.",
    )
    p.add_argument("--seeds", type=int, default=1000, help="number of seeds to run (1000)")
    p.add_argument("--start", type=int, default=0, help="first seed (0)")
    p.add_argument("--seed", type=int, default=None, help="run this one seed only")
    p.add_argument("--nodes", type=int, default=3, help="group size, 1..7 (3)")
    p.add_argument(
        "--jobs", type=int, default=os.cpu_count() or 1, help="worker processes (cpu count)"
    )
    p.add_argument(
        "--mutation",
        action="append",
        default=[],
        choices=sorted(MUTATIONS | DRIVER_MUTATIONS),
        help="TEST ONLY: break one Raft rule (repeatable) to see the checker catch it",
    )
    p.add_argument("--trace", action="store_true", help="print the event trace (--seed)")
    p.add_argument(
        "--faults-json",
        default=None,
        help="with --seed: replace the seed's fault schedule (as printed on a violation)",
    )
    p.add_argument("--no-minimize", action="store_true", help="skip schedule minimization")
    p.add_argument("-v", "--verbose", action="store_true", help="log the core at INFO")
    return p


def _faults_from_json(text: str) -> list[FaultEvent]:
    raw = json.loads(text)
    if not isinstance(raw, list):
        raise ValueError("--faults-json must be a JSON list")
    out = []
    for d in raw:
        d = dict(d)
        d["groups"] = tuple(tuple(g) for g in d.get("groups", ()))
        out.append(FaultEvent(**d))
    return out


def _faults_to_json(events: Sequence[FaultEvent]) -> str:
    return json.dumps([asdict(e) for e in events], separators=(",", ":"))


def _report_failure(seed: int, nodes: int, mutations: frozenset[str], minimize_it: bool) -> None:
    first = run_seed(seed, nodes, mutations=mutations)
    assert first.violation is not None, f"seed {seed} did not fail again: nondeterminism"
    kind = first.violation.kind
    faults = first.faults
    if minimize_it:

        def still_fails(candidate: list[FaultEvent]) -> bool:
            r = run_seed(seed, nodes, mutations=mutations, faults=candidate)
            return r.violation is not None and r.violation.kind == kind

        faults = minimize(first.faults, still_fails)
    final = run_seed(seed, nodes, mutations=mutations, faults=faults, trace=True)
    print(f"VIOLATION seed={seed} nodes={nodes}: {first.violation}")
    print(f"fault schedule: {len(first.faults)} events, minimized to {len(faults)}:")
    for f in faults:
        print(f"  {f.describe()}")
    if final.violation is not None:
        print(f"minimized run: {final.violation}")
    print("event trace of the minimized run:")
    for line in final.trace:
        print(f"  {line}")
    muts = "".join(f" --mutation {m}" for m in sorted(mutations))
    print(f"replay: python -m dledger.sim --seed {seed} --nodes {nodes}{muts} --trace")
    print(
        f"replay minimized: python -m dledger.sim --seed {seed} --nodes {nodes}{muts} --trace "
        f"--faults-json '{_faults_to_json(faults)}'"
    )


def _progress(done: int, total: int, violations: int) -> None:
    filled = PROGRESS_WIDTH * done // max(total, 1)
    bar = "#" * filled + "." * (PROGRESS_WIDTH - filled)
    end = "\n" if done >= total or violations else ""
    sys.stderr.write(f"\r[{bar}] {done}/{total} seeds, {violations} violations{end}")
    sys.stderr.flush()


def _print_single(r: SimResult, trace: bool) -> None:
    if trace:
        for line in r.trace:
            print(line)
    status = "ok" if r.violation is None else f"VIOLATION {r.violation}"
    print(
        f"seed={r.seed} nodes={r.nodes} {status} steps={r.steps} sim_time_ms={r.sim_time_ms} "
        f"acked={r.acked} snapshot_installs={r.snapshot_installs} "
        f"storage_faults={r.storage_faults} repairs={r.repairs} trace_hash={r.trace_hash}"
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:
        return 0 if e.code == 0 else 2
    if not 1 <= args.nodes <= MAX_GROUP_SIZE:
        print(f"error: --nodes must be in 1..{MAX_GROUP_SIZE}", file=sys.stderr)
        return 2
    if args.seeds < 1 or args.jobs < 1 or args.start < 0:
        print("error: --seeds and --jobs must be >= 1, --start >= 0", file=sys.stderr)
        return 2
    if args.faults_json is not None and args.seed is None:
        print("error: --faults-json needs --seed", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO if args.verbose else logging.ERROR)
    if not args.verbose:
        logging.getLogger("dledger").setLevel(logging.ERROR)
    mutations = frozenset(args.mutation)

    if args.seed is not None:
        try:
            faults = None if args.faults_json is None else _faults_from_json(args.faults_json)
        except (ValueError, TypeError) as e:
            print(f"error: bad --faults-json: {e}", file=sys.stderr)
            return 2
        r = run_seed(args.seed, args.nodes, mutations=mutations, faults=faults, trace=args.trace)
        _print_single(r, args.trace)
        if r.violation is not None:
            if faults is None:
                _report_failure(args.seed, args.nodes, mutations, not args.no_minimize)
            return 1
        return 0

    seeds = range(args.start, args.start + args.seeds)
    summary = run_seeds(seeds, args.nodes, mutations=mutations, jobs=args.jobs, progress=_progress)
    rate = summary.seeds_run / summary.wall_s if summary.wall_s > 0 else 0.0
    print(
        f"seeds run: {summary.seeds_run}  nodes: {args.nodes}  violations: {summary.violations}  "
        f"steps: {summary.steps}  snapshot installs: {summary.snapshot_installs}  "
        f"storage faults: {summary.storage_faults}  repairs: {summary.repairs}  "
        f"simulated time: {summary.sim_time_ms / 1000:.1f}s  "
        f"wall time: {summary.wall_s:.1f}s  ({rate:.0f} seeds/s, {args.jobs} jobs)"
    )
    if summary.first_failure is not None:
        _report_failure(summary.first_failure.seed, args.nodes, mutations, not args.no_minimize)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
