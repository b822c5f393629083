"""What a broker's send and pull paths count for its metrics (broker.metrics exports them).

Plain counters and histograms of `mqmetrics.hot`, written on the event loop only: a send costs
a clock read, a histogram observation and a dict update (docs/METRICS.md "Cost").
"""

from __future__ import annotations

from mqmetrics.hot import LATENCY_BUCKETS_S, Histogram, LabelCounters

# Topics a process counts traffic for (later ones count under "(other)"), and retry/DLQ groups
# exported: a dashboard or Prometheus handles a thousand topic series per node comfortably.
MAX_TOPIC_SERIES = 1000


class BrokerStats:
    """What the send and pull paths count (on the event loop)."""

    __slots__ = ("inflight_dedup_hits", "pull_s", "pulled", "send_s", "sent")

    def __init__(self) -> None:
        self.sent = LabelCounters(MAX_TOPIC_SERIES)
        self.pulled = LabelCounters(MAX_TOPIC_SERIES)
        self.send_s = Histogram(LATENCY_BUCKETS_S)
        self.pull_s = Histogram(LATENCY_BUCKETS_S)
        self.inflight_dedup_hits = 0
