"""A thread that samples the cluster every interval: messages written per topic, consumed and
lagging per consumer group, and each follower's Raft lag. The live rates the pages and charts
show are computed from successive samples (``mqdashboard.rates``); nothing here needs the
processes' ``/metrics``.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Any

from mqdashboard.rates import History
from mqdashboard.reader import GroupReader, GroupView, error_text

log = logging.getLogger(__name__)

DEFAULT_INTERVAL_MS = 2_000
# Shorter would have the dashboard's reads compete with the traffic it watches.
MIN_INTERVAL_MS = 200
MAX_INTERVAL_MS = 60_000
# Consumer groups whose lag one sample reads (each costs one call per topic and group).
MAX_SAMPLED_GROUPS = 50


@dataclass(frozen=True, slots=True)
class SampleError:
    part: str  # "topics", "consumers" or "cluster"
    text: str
    at_s: float


class Sampler:
    """Samples ``reader`` every ``interval_ms`` in a daemon thread (:meth:`start`,
    :meth:`stop`); every read of the histories is a copy taken under a lock."""

    def __init__(self, reader: GroupReader, interval_ms: int = DEFAULT_INTERVAL_MS) -> None:
        if not MIN_INTERVAL_MS <= interval_ms <= MAX_INTERVAL_MS:
            raise ValueError(
                f"sample interval {interval_ms} ms outside [{MIN_INTERVAL_MS}, {MAX_INTERVAL_MS}]"
            )
        self.reader = reader
        self.interval_ms = interval_ms
        self.written = History()  # counters: messages written per topic
        self.consumed = History()  # counters: messages consumed per group
        self.lag = History()  # gauges: messages behind per group
        self.raft_lag = History()  # gauges: entries behind the leader per group/node
        self.errors: dict[str, SampleError] = {}
        self.samples = 0
        self.last_groups: list[GroupView] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="mqdashboard-sampler", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)

    def _run(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            self.sample_once()
            spent = time.monotonic() - started
            self._stop.wait(max(self.interval_ms / 1000 - spent, 0.0))

    def sample_once(self) -> None:
        """One sample of every part; a part that fails keeps its error for the pages and
        leaves the others alone."""
        now = time.time()
        for part, fn in (
            ("cluster", self._sample_cluster),
            ("topics", self._sample_topics),
            ("consumers", self._sample_consumers),
        ):
            try:
                fn(now)
            except Exception as exc:  # any failure is shown on the pages, never raised
                log.debug("sample of %s failed", part, exc_info=True)
                with self._lock:
                    self.errors[part] = SampleError(part, error_text(exc), now)
            else:
                with self._lock:
                    self.errors.pop(part, None)
        with self._lock:
            self.samples += 1

    def _sample_cluster(self, now: float) -> None:
        groups = self.reader.clusters()
        lags = {
            f"{g.name}/{n.node_id}": float(n.lag)
            for g in groups
            for n in g.nodes
            if n.lag is not None
        }
        with self._lock:
            self.last_groups = groups
            self.raft_lag.add(now, lags)

    def _sample_topics(self, now: float) -> None:
        counts = {t.name: float(t.messages) for t in self.reader.topics() if not t.error}
        with self._lock:
            self.written.add(now, counts)

    def _sample_consumers(self, now: float) -> None:
        consumed: dict[str, float] = {}
        lag: dict[str, float] = {}
        for g in self.reader.consumer_groups(exact_clients=False)[:MAX_SAMPLED_GROUPS]:
            rows = self.reader.consumer_lag(g.name, g.topics)
            consumed[g.name] = float(sum(r.consumed for r in rows))
            lag[g.name] = float(sum(r.lag for r in rows))
        with self._lock:
            self.consumed.add(now, consumed)
            self.lag.add(now, lag)

    # -- what the pages read ------------------------------------------------------------------

    def send_rate(self, topic: str) -> float | None:
        with self._lock:
            return self.written.latest_rate(topic)

    def consume_rate(self, group: str) -> float | None:
        with self._lock:
            return self.consumed.latest_rate(group)

    def errors_now(self) -> list[SampleError]:
        with self._lock:
            return sorted(self.errors.values(), key=lambda e: e.part)

    def series(self) -> dict[str, Any]:
        """The charts' data: per-second rates and gauges as [time_ms, value] pairs."""

        def pairs(points: list[tuple[float, float]]) -> list[list[float]]:
            return [[round(t * 1000), round(v, 3)] for t, v in points]

        with self._lock:
            return {
                "interval_ms": self.interval_ms,
                "samples": self.samples,
                "send_rate": {
                    n: pairs(self.written.rates(n))
                    for n in self.written.names()
                    if not n.startswith("%")
                },
                "consume_rate": {n: pairs(self.consumed.rates(n)) for n in self.consumed.names()},
                "lag": {n: pairs(self.lag.points(n)) for n in self.lag.names()},
                "raft_lag": {n: pairs(self.raft_lag.points(n)) for n in self.raft_lag.names()},
                "errors": [f"{e.part}: {e.text}" for e in self.errors.values()],
            }
