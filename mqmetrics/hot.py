"""Counters and histograms cheap enough for a send path: no lock, no label lookup objects.

Each instance has one writer thread (the event loop, or the one thread that calls it under its
own lock); the scrape reads a copy. `prometheus_client`'s own `Histogram.observe` takes a lock
and `Counter.labels(...)` builds a tuple key per call; these cost a fraction of that
(docs/METRICS.md "Cost" has the measured figures).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence

# Label value of everything counted after a `LabelCounters` is full. Parentheses are not
# allowed in topic or group names, so it never collides with a real one.
OTHER = "(other)"

# Bucket upper bounds, in seconds, for request latencies (a pull or a send on 127.0.0.1 takes
# 0.1-5 ms; a long one waits for a quorum or a disk: up to seconds).
LATENCY_BUCKETS_S = (
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
)
# For fdatasync: 50 us (a write cache) up to 1 s (a saturated disk).
FSYNC_BUCKETS_S = (0.00005, *(b for b in LATENCY_BUCKETS_S if b <= 1.0))
# Entries per append (one persist job of the Raft log: group commit gathers many).
COUNT_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 4096)
# Bytes per append: 100 B up to the 64 MiB largest entry.
BYTES_BUCKETS = (
    256,
    1024,
    4096,
    16384,
    65536,
    262144,
    1048576,
    4194304,
    16777216,
    67108864,
)


class Histogram:
    """Counts per bucket (not cumulative: the last one is ``+Inf``) and the sum."""

    __slots__ = ("bounds", "counts", "total")

    def __init__(self, bounds: Sequence[float]) -> None:
        if not bounds or list(bounds) != sorted(set(bounds)):
            raise ValueError("bucket bounds must be distinct and ascending")
        self.bounds = tuple(bounds)
        self.counts = [0] * (len(self.bounds) + 1)
        self.total = 0.0

    def observe(self, value: float) -> None:
        """Count ``value`` in the first bucket whose bound is >= it (Prometheus' ``le``)."""
        self.counts[bisect_left(self.bounds, value)] += 1
        self.total += value

    def snapshot(self) -> tuple[list[tuple[str, float]], float]:
        """Cumulative ``(le, count)`` pairs ending with ``+Inf``, and the sum: what a
        `HistogramMetricFamily` takes. The counts are copied first, so the pairs agree with
        each other even while the writer goes on."""
        counts = list(self.counts)
        total = self.total
        buckets: list[tuple[str, float]] = []
        running = 0
        for bound, n in zip((*self.bounds, float("inf")), counts, strict=True):
            running += n
            buckets.append(("+Inf" if bound == float("inf") else repr(float(bound)), running))
        return buckets, total


class LabelCounters:
    """Counts (and an amount, e.g. bytes) per label value, for at most ``max_labels`` values;
    later values are counted under :data:`OTHER`. A value once counted keeps its entry, so
    every exported series only grows."""

    __slots__ = ("amounts", "counts", "max_labels")

    def __init__(self, max_labels: int) -> None:
        if max_labels < 1:
            raise ValueError("max_labels must be >= 1")
        self.max_labels = max_labels
        self.counts: dict[str, int] = {}
        self.amounts: dict[str, int] = {}

    def add(self, label: str, count: int, amount: int) -> None:
        counts = self.counts
        if label not in counts:
            if len(counts) >= self.max_labels:
                label = OTHER
            if label not in counts:
                counts[label] = 0
                self.amounts[label] = 0
        counts[label] += count
        self.amounts[label] += amount

    def snapshot(self) -> list[tuple[str, int, int]]:
        """``(label, count, amount)`` per label, in the order first counted."""
        amounts = self.amounts
        return [(label, n, amounts.get(label, 0)) for label, n in list(self.counts.items())]
