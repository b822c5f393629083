"""Run many seeds in parallel processes and collect a summary."""

from __future__ import annotations

import logging
import multiprocessing
import os
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from dledger.sim.sim import run_seed

# Seeds per task sent to a worker: amortizes inter-process overhead, keeps the bar moving.
SEEDS_PER_TASK = 8


@dataclass(frozen=True, slots=True)
class SeedOutcome:
    seed: int
    nodes: int
    violation: str | None
    steps: int
    sim_time_ms: int
    snapshot_installs: int = 0
    storage_faults: int = 0
    repairs: int = 0
    raises: int = 0  # feature level raises the leaders accepted


@dataclass
class Summary:
    seeds_run: int = 0
    violations: int = 0
    steps: int = 0
    snapshot_installs: int = 0
    storage_faults: int = 0
    repairs: int = 0
    raises: int = 0
    sim_time_ms: int = 0
    wall_s: float = 0.0
    first_failure: SeedOutcome | None = None


def _quiet() -> None:
    # The core logs elections at INFO and check-quorum step-downs at WARNING: thousands per run.
    logging.getLogger("dledger").setLevel(logging.ERROR)


def _run_chunk(args: tuple[Sequence[int], int, frozenset[str]]) -> list[SeedOutcome]:
    seeds, nodes, mutations = args
    out = []
    for seed in seeds:
        r = run_seed(seed, nodes, mutations=mutations)
        out.append(
            SeedOutcome(
                seed=seed,
                nodes=nodes,
                violation=None if r.violation is None else str(r.violation),
                steps=r.steps,
                sim_time_ms=r.sim_time_ms,
                snapshot_installs=r.snapshot_installs,
                storage_faults=r.storage_faults,
                repairs=r.repairs,
                raises=r.raises,
            )
        )
    return out


def _chunks(seeds: Sequence[int], size: int) -> Iterator[Sequence[int]]:
    for i in range(0, len(seeds), size):
        yield seeds[i : i + size]


def run_seeds(
    seeds: Sequence[int],
    nodes: int,
    *,
    mutations: frozenset[str] = frozenset(),
    jobs: int | None = None,
    stop_at_first: bool = True,
    progress: Callable[[int, int, int], None] | None = None,
) -> Summary:
    """Run ``seeds`` over ``jobs`` processes (default: cpu count). With ``stop_at_first``,
    stops at the first violation found; ``first_failure`` is then the lowest failing seed
    among those that finished."""
    jobs = jobs or os.cpu_count() or 1
    summary = Summary()
    start = time.perf_counter()
    tasks = [(chunk, nodes, mutations) for chunk in _chunks(seeds, SEEDS_PER_TASK)]

    def absorb(outcomes: list[SeedOutcome]) -> bool:
        for o in outcomes:
            summary.seeds_run += 1
            summary.steps += o.steps
            summary.snapshot_installs += o.snapshot_installs
            summary.storage_faults += o.storage_faults
            summary.repairs += o.repairs
            summary.raises += o.raises
            summary.sim_time_ms += o.sim_time_ms
            if o.violation is not None:
                summary.violations += 1
                if summary.first_failure is None or o.seed < summary.first_failure.seed:
                    summary.first_failure = o
        if progress is not None:
            progress(summary.seeds_run, len(seeds), summary.violations)
        return stop_at_first and summary.violations > 0

    if jobs == 1:
        _quiet()
        for t in tasks:
            if absorb(_run_chunk(t)):
                break
    else:
        # Not "fork": a parent that has run gRPC (a test session, say) has its threads, and a
        # child forked while one of them holds a lock can hang forever (gRPC skips its fork
        # handlers then). Workers fork from a clean server process instead.
        ctx = multiprocessing.get_context("forkserver" if os.name == "posix" else "spawn")
        with ctx.Pool(jobs, initializer=_quiet) as pool:
            for outcomes in pool.imap(_run_chunk, tasks):
                if absorb(outcomes):
                    pool.terminate()
                    break
    summary.wall_s = time.perf_counter() - start
    return summary
