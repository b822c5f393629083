"""Building `prometheus_client` metric families at scrape time, with bounded label sets."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from itertools import islice
from typing import TypeVar

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)

from mqmetrics.hot import Histogram, LabelCounters

T = TypeVar("T")

# Every metric name starts with this (the project's namespace).
PREFIX = "raftmq_"


def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(PREFIX + name, doc, value=value)


def counter(name: str, doc: str, value: float) -> CounterMetricFamily:
    """``name`` without ``_total``: the family adds it to the sample."""
    return CounterMetricFamily(PREFIX + name, doc, value=value)


def labelled_gauge(
    name: str, doc: str, labels: Sequence[str], rows: Iterable[tuple[Sequence[str], float]]
) -> GaugeMetricFamily:
    return _filled(GaugeMetricFamily(PREFIX + name, doc, labels=labels), rows)


def labelled_counter(
    name: str, doc: str, labels: Sequence[str], rows: Iterable[tuple[Sequence[str], float]]
) -> CounterMetricFamily:
    return _filled(CounterMetricFamily(PREFIX + name, doc, labels=labels), rows)


F = TypeVar("F", GaugeMetricFamily, CounterMetricFamily)


def _filled(family: F, rows: Iterable[tuple[Sequence[str], float]]) -> F:
    for values, value in rows:
        family.add_metric(values, value)
    return family


def histogram(name: str, doc: str, hist: Histogram) -> HistogramMetricFamily:
    family = HistogramMetricFamily(PREFIX + name, doc)
    buckets, total = hist.snapshot()
    family.add_metric([], buckets, total)
    return family


def label_counter_pair(
    counts_name: str,
    amounts_name: str,
    label: str,
    docs: tuple[str, str],
    counters: LabelCounters,
) -> list[Metric]:
    """Two counter families from one `LabelCounters`: its counts and its amounts."""
    rows = counters.snapshot()
    return [
        labelled_counter(counts_name, docs[0], [label], (([k], n) for k, n, _ in rows)),
        labelled_counter(amounts_name, docs[1], [label], (([k], a) for k, _, a in rows)),
    ]


def state_set(name: str, doc: str, label: str, states: Sequence[str], current: str) -> Metric:
    """One gauge per state, 1 for ``current`` and 0 for the others (a fixed label set)."""
    return labelled_gauge(name, doc, [label], (([s], 1.0 if s == current else 0.0) for s in states))


class Omitted:
    """How many series each capped family left out at this scrape (exported as
    ``raftmq_metrics_series_omitted{family}``, so a cut is never silent)."""

    def __init__(self) -> None:
        self.by_family: dict[str, int] = {}

    def capped(self, family: str, rows: Iterable[T], total: int, cap: int) -> Iterator[T]:
        """The first ``cap`` of ``rows`` (which holds ``total`` items); the rest counted."""
        if total > cap:
            self.by_family[family] = self.by_family.get(family, 0) + total - cap
        return islice(rows, cap)

    def family(self, names: Iterable[str]) -> GaugeMetricFamily:
        """The omitted counts of ``names`` (0 for a family that kept everything)."""
        counts: Mapping[str, int] = self.by_family
        return labelled_gauge(
            "metrics_series_omitted",
            "Series a capped family left out at this scrape (docs/METRICS.md 'Cardinality')",
            ["family"],
            (([PREFIX + n], counts.get(n, 0)) for n in names),
        )


def refusal_family(snapshot: Mapping[str, int]) -> CounterMetricFamily:
    """The security refusal counts of this process (mqsecurity.refusals: a fixed vocabulary
    of reasons)."""
    return labelled_counter(
        "security_refusals",
        "Calls refused by a security check, by reason (mqsecurity/refusals.py)",
        ["reason"],
        (([reason], n) for reason, n in sorted(snapshot.items())),
    )
