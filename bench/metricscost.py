"""The cost of metrics (issue #22: serving and being scraped for /metrics may not lower the send
rate by more than 2 %), measured by many short paired rounds.

Two plaintext 3-node groups are up side by side, one serving /metrics on every node and the
NameServer (scraped every ``scrape_interval_s`` all along), one with ``metricsPort=0``
(nothing served, nothing counted). Each side has its own load-generator processes, started
once (``bench.loadgen --serve``), so a round costs no process start-up. A pair is one round on
each side back to back, the order alternating by pair (off on, on off, off on, ...: ABBA), so
a drift of the machine's load falls on both sides. Every round is measured over the same
window, ``[start_at, start_at + seconds)``: the load generators count the sends issued in it
and the harness reads the CPU (user + system) of the group's processes, nodes and NameServer,
at its two ends.

The comparison rests on each pair's ratio, on over off, of the send rate and of the CPU per
message (``bench.pairstats``): their medians with a 95 % sign-test interval.

Two groups are never quite alike (an A/A run with nothing served by either showed the group
started second 3-5 % faster), so the comparison can be a **crossover**: ``periods`` (even)
periods, each with two fresh groups "g0" (started first) and "g1", the one serving metrics
swapped from period to period. A group's own advantage b multiplies the ratios of one period
by b and of the next by 1/b; the geometric mean of pair i of period 2j and pair i of period
2j + 1 cancels it, and these means are the units the interval is taken over. Each period's own
median stays in the results, so the size of the bias the crossover took out is visible.

Rounds on a shared machine spread by tens of percent; the two rounds of a pair, seconds
apart, share most of that, and the CPU per message is set by the work a message takes, not
by how much of the CPU the group got. At saturation the send rate is CPU-bound, so the CPU
per message is the load-robust measure of the cost.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import select
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import IO, Any

from bench import cpu_s
from bench.closedloop import WARMUP_S
from bench.pairstats import median_ci, pair_ratios, paired
from mqcluster.cluster import LocalCluster

# How the two rounds of a pair are run, as the results' conditions say it.
DESIGNS = {
    "concurrent": "the two rounds of a pair run at once, in the same window, each group with "
    "its own load generators (the machine's swings fall on both)",
    "alternating": "the two rounds of a pair back to back, the order alternating by pair "
    "(ABBA: a drift of the machine's load falls on both sides)",
}
# Seconds between scrapes of the "on" group: a second is the harsher case; Prometheus' own
# default is a minute and the interval most configurations set is 15 s (--metrics-scrape-interval).
SCRAPE_INTERVAL_S = 1.0
# What --metrics-scrape-interval accepts: down to twice a second (the endpoint answers from the
# same collection within MIN_COLLECT_INTERVAL_S anyway), up to Prometheus' default minute.
MIN_SCRAPE_INTERVAL_S = 0.5
MAX_SCRAPE_INTERVAL_S = 60.0
SCRAPE_TIMEOUT_S = 5.0
# A load generator must answer a round within its end plus this (a send's own timeout and
# retries are shorter), and exit within LOADGEN_STOP_S of its stdin closing.
ROUND_GRACE_S = 60.0
LOADGEN_STOP_S = 10.0
# Before the measured pairs, one unrecorded round per side and in-flight count of this long:
# routes fetched, channels open, the groups' first segments written.
WARM_ROUND_S = 1.0


# The metrics' own CPU as each process counts it (mqmetrics.server), summed over its parts.
OWN_CPU_PREFIX = b"raftmq_metrics_cpu_seconds_total"


def own_cpu_s(body: bytes) -> float:
    """The CPU seconds a /metrics answer says the metrics cost its process (0.0 without the
    family: a process that does not count it)."""
    total = 0.0
    for line in body.splitlines():
        if line.startswith(OWN_CPU_PREFIX):
            total += float(line.rsplit(None, 1)[1])
    return total


class Scraper:
    """Scrapes every /metrics of a group every ``interval_s`` from a thread, as Prometheus
    would, from its start to its end whatever the rounds do (a round sees the scrapes that
    fall in it: at 15 s, most rounds of 2 s none, some one); counts the scrapes, the failures
    and the bytes, and (:meth:`own_cost`) what the metrics cost the group's processes by
    their own count against the group's whole CPU between the first and the last complete
    scrape (one more is made at the end)."""

    def __init__(self, cluster: LocalCluster, interval_s: float = SCRAPE_INTERVAL_S) -> None:
        self.interval_s = interval_s
        # A secure group's endpoints speak HTTPS with its CA (the comparison's groups are
        # plaintext: None).
        context = getattr(cluster, "metrics_ssl_context", None)
        self._context = context() if context is not None else None
        self.urls = [n.metrics_url for n in cluster.nodes if n.metrics_port]
        if cluster.namesrv is not None and cluster.namesrv.metrics_port:
            self.urls.append(cluster.namesrv.metrics_url)
        self.scrapes = 0
        self.bytes = 0
        self.failures = 0
        self._cluster = cluster
        self._pids: list[int | None] = []
        # (metrics' own CPU, the group's CPU) at the first and the last complete scrape.
        self._first: tuple[float, float] | None = None
        self._last: tuple[float, float] | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bench-scraper", daemon=True)

    def __enter__(self) -> Scraper:
        self._pids = group_pids(self._cluster)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._scrape_all()  # the end of the span own_cost covers

    def _run(self) -> None:
        while True:  # at once, then every interval
            self._scrape_all()
            if self._stop.wait(self.interval_s):
                return

    def _scrape_all(self) -> None:
        own_s, complete = 0.0, True
        for url in self.urls:
            try:
                with urllib.request.urlopen(
                    url, timeout=SCRAPE_TIMEOUT_S, context=self._context
                ) as resp:
                    body = resp.read()
                self.bytes += len(body)
                self.scrapes += 1
                own_s += own_cpu_s(body)
            except OSError:
                self.failures += 1
                complete = False
        if complete:
            self._last = (own_s, sum(map(cpu_s, self._pids)))
            self._first = self._first or self._last

    def own_cost(self) -> dict[str, Any]:
        """What the metrics cost the group by its processes' own count
        (``raftmq_metrics_cpu_seconds_total``: building the families and serving the scrapes;
        not the counting on the hot paths, docs/METRICS.md), against the group's whole CPU,
        between the first and the last complete scrape."""
        if self._first is None or self._last is None:
            return {"metrics_cpu_s": None, "group_cpu_s": None, "share": None}
        metrics_s = self._last[0] - self._first[0]
        group_s = self._last[1] - self._first[1]
        return {
            "metrics_cpu_s": metrics_s,
            "group_cpu_s": group_s,
            "share": metrics_s / group_s if group_s > 0 else None,
            "scrapes": self.scrapes,
            "scrape_failures": self.failures,
        }

    def counts(self) -> tuple[int, int]:
        """(scrapes, failures) so far."""
        return self.scrapes, self.failures


class LoadPool:
    """``processes`` load generators (``bench.loadgen --serve``) on one group, each keeping
    its share of a round's sends in flight; stderr goes to ``log_dir``."""

    def __init__(
        self, cluster: LocalCluster, topic: str, size: int, processes: int, mode: str
    ) -> None:
        assert cluster.namesrv is not None
        cmd = [sys.executable, "-m", "bench.loadgen", "--serve", "--namesrv", cluster.namesrv.addr]
        cmd += ["--topic", topic, "--size", str(size), "--mode", mode, *cluster.tool_argv()]
        self.processes = processes
        self._logs: list[IO[str]] = []
        self._procs: list[subprocess.Popen[str]] = []
        for i in range(processes):
            log = (cluster.base / f"loadgen-{i}.log").open("w")
            self._logs.append(log)
            self._procs.append(
                subprocess.Popen(
                    cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, text=True
                )
            )

    def start(self, in_flight: int, seconds: float, start_at: float) -> None:
        """Every process begins a round: ``in_flight`` sends in all, measured from
        ``start_at`` for ``seconds``."""
        each = max(1, in_flight // self.processes)
        line = json.dumps({"in_flight": each, "seconds": seconds, "start_at": start_at})
        for p in self._procs:
            assert p.stdin is not None
            p.stdin.write(line + "\n")
            p.stdin.flush()

    def results(self, deadline: float) -> list[dict[str, Any]]:
        """Each process's result of the round begun, by ``deadline`` (monotonic)."""
        out = []
        for i, p in enumerate(self._procs):
            assert p.stdout is not None
            ready, _, _ = select.select([p.stdout], [], [], max(0.0, deadline - time.monotonic()))
            line = p.stdout.readline() if ready else ""
            if not line:
                raise RuntimeError(f"load generator {i} gave no result: {self._log_tail(i)}")
            out.append(json.loads(line))
        return out

    def _log_tail(self, i: int) -> str:
        self._logs[i].flush()
        return Path(self._logs[i].name).read_text()[-500:].strip() or "(no output)"

    def close(self) -> None:
        for p in self._procs:
            if p.stdin is not None:
                p.stdin.close()
        for p in self._procs:
            try:
                p.wait(LOADGEN_STOP_S)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
            if p.stdout is not None:
                p.stdout.close()
        for log in self._logs:
            log.close()


@contextlib.contextmanager
def load_pool(
    cluster: LocalCluster, topic: str, size: int, processes: int, mode: str
) -> Iterator[LoadPool]:
    pool = LoadPool(cluster, topic, size, processes, mode)
    try:
        yield pool
    finally:
        pool.close()


def group_pids(cluster: LocalCluster) -> list[int | None]:
    """The group's processes: every node and the NameServer."""
    return [cluster.pid(n) for n in cluster.nodes] + [cluster.namesrv_pid()]


def _sleep_until(t: float) -> None:
    time.sleep(max(0.0, t - time.monotonic()))


Side = tuple[LoadPool, list[int | None]]


def measured_rounds(sides: dict[str, Side], in_flight: int, seconds: float) -> dict[str, Any]:
    """One round on each of ``sides`` at once (one side: alone): ``in_flight`` sends kept in
    flight on each, measured over ``seconds`` after a ``WARMUP_S`` warm-up; each group's CPU
    read at the window's two ends (as a rate over the time between the reads, so a late
    wake-up of the harness does not bias it)."""
    start_at = time.monotonic() + WARMUP_S
    for pool, _ in sides.values():
        pool.start(in_flight, seconds, start_at)
    _sleep_until(start_at)
    t0, cpu0 = time.monotonic(), {k: sum(map(cpu_s, pids)) for k, (_, pids) in sides.items()}
    _sleep_until(start_at + seconds)
    t1, cpu1 = time.monotonic(), {k: sum(map(cpu_s, pids)) for k, (_, pids) in sides.items()}
    cases = {}
    for k, (pool, _) in sides.items():
        outs = pool.results(start_at + seconds + ROUND_GRACE_S)
        sent = sum(int(o["sent"]) for o in outs)
        group_cpu_s = (cpu1[k] - cpu0[k]) * seconds / (t1 - t0) if t1 > t0 else 0.0
        cases[k] = {
            "in_flight": pool.processes * max(1, in_flight // pool.processes),
            "seconds": seconds,
            "messages": sent,
            "failed": sum(int(o["failed"]) for o in outs),
            "messages_per_s": sent / seconds,
            "group_cpu_s": group_cpu_s,
            "cpu_us_per_message": group_cpu_s / sent * 1e6 if sent else 0.0,
            "load_avg_1m": os.getloadavg()[0],
        }
    return cases


Groups = dict[str, tuple[LocalCluster, LoadPool]]


def _rounds(
    order: Sequence[str], groups: Groups, n: int, s: float, scraper: Scraper
) -> dict[str, Any]:
    """A round on each side of ``order`` at once; the "on" side's case counts the scrapes
    that fell between its start and its results (the scraper runs all along)."""
    sides = {k: (groups[k][1], group_pids(groups[k][0])) for k in order}
    before = scraper.counts()
    cases = measured_rounds(sides, n, s)
    after = scraper.counts()
    scraped = {"scrapes": after[0] - before[0], "scrape_failures": after[1] - before[1]}
    none = {"scrapes": 0, "scrape_failures": 0}
    return {k: {**c, **(scraped if k == "on" else none)} for k, c in cases.items()}


def _pair(
    i: int, groups: Groups, n: int, s: float, concurrent: bool, scraper: Scraper
) -> dict[str, Any]:
    """Pair ``i``: both sides at once, or one after the other in ABBA order."""
    order = ("off", "on") if i % 2 == 0 else ("on", "off")
    if concurrent:
        return _rounds(order, groups, n, s, scraper)
    return {k: _rounds((k,), groups, n, s, scraper)[k] for k in order}


def run_pairs(
    groups: Groups,
    in_flight: Sequence[int],
    pairs: int,
    seconds: float,
    concurrent: bool,
    scrape_interval_s: float = SCRAPE_INTERVAL_S,
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """``pairs`` pairs per in-flight count (``concurrent``: both sides loaded in the same
    window; otherwise one after the other, the order alternating by pair: ABBA), after one
    unrecorded warm round per side and count; the "on" group is scraped every
    ``scrape_interval_s`` from the first warm round to the last pair. Returns the cases and
    the metrics' own cost over the whole span (:meth:`Scraper.own_cost`)."""
    with Scraper(groups["on"][0], scrape_interval_s) as scraper:
        cases = _run_pairs(groups, in_flight, pairs, seconds, concurrent, scraper)
    return cases, scraper.own_cost()


def _run_pairs(
    groups: Groups,
    in_flight: Sequence[int],
    pairs: int,
    seconds: float,
    concurrent: bool,
    scraper: Scraper,
) -> list[dict[str, Any]]:
    for n in in_flight:
        _pair(0, groups, n, min(WARM_ROUND_S, seconds), concurrent, scraper)
    cases: list[dict[str, Any]] = []
    for i in range(pairs):
        for n in in_flight:
            for side, case in _pair(i, groups, n, seconds, concurrent, scraper).items():
                cases.append({"metrics": side, "pair": i, "asked_in_flight": n, **case})
                print(
                    f"metrics {side}, {n} in flight, pair {i}: "
                    f"{case['messages_per_s']:,.0f} msg/s, {case['cpu_us_per_message']:.0f} "
                    f"CPU us/msg, load {case['load_avg_1m']:.1f}",
                    flush=True,
                )
    return cases


# Most periods of a crossover: each starts two fresh groups (about 10 s).
MAX_PERIODS = 8


def crossover_units(per_period: Sequence[Sequence[float]]) -> list[float]:
    """The crossover's units: for each block of two periods (2j, 2j + 1), the geometric mean
    of their i-th pair ratios, for every i both have; a group's own advantage, a factor on one
    period and its inverse on the next, cancels in each. An odd trailing period is refused."""
    if len(per_period) % 2:
        raise ValueError(f"{len(per_period)} periods: a crossover needs an even number")
    units: list[float] = []
    for first, second in zip(per_period[::2], per_period[1::2], strict=True):
        units += [math.sqrt(a * b) for a, b in zip(first, second, strict=False)]
    return units


def _measure(mine: Sequence[dict[str, Any]], key: str, periods: list[int]) -> dict[str, Any]:
    """One measure's pair ratios on/off: a median and interval over the pairs (one period) or
    over the crossover's units (several), each side's median, and each period's median."""

    def side(name: str, period: int | None = None) -> list[float]:
        return [
            float(c[key])
            for c in mine
            if c["metrics"] == name and (period is None or c.get("period", 0) == period)
        ]

    if len(periods) == 1:
        return paired(side("on"), side("off"))
    per_period = [pair_ratios(side("on", p), side("off", p)) for p in periods]
    units = crossover_units(per_period)
    on, off = side("on"), side("off")
    return {
        **median_ci(units),
        "on_median": statistics.median(on) if on else None,
        "off_median": statistics.median(off) if off else None,
        "ratios": units,
        "period_medians": [statistics.median(r) if r else None for r in per_period],
    }


def summary(cases: Sequence[dict[str, Any]], in_flight: Sequence[int]) -> list[dict[str, Any]]:
    """Per in-flight count: the pair ratios on/off of the send rate and of the CPU per
    message, each's median with its interval (over the crossover's units when the cases come
    from several periods), and the load average over the rounds."""
    out = []
    for n in in_flight:
        mine = sorted(
            (c for c in cases if c["asked_in_flight"] == n),
            key=lambda c: (c.get("period", 0), c["pair"]),
        )
        periods = sorted({int(c.get("period", 0)) for c in mine}) or [0]
        loads = [c["load_avg_1m"] for c in mine]
        rate = _measure(mine, "messages_per_s", periods)
        out.append(
            {
                "in_flight": n,
                "pairs": len(rate["ratios"]),
                "periods": len(periods),
                "rate": rate,
                "cpu_per_message": _measure(mine, "cpu_us_per_message", periods),
                "load_avg_1m": [min(loads), max(loads)] if loads else None,
            }
        )
    return out
