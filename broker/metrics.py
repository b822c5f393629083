"""A broker node's metrics (docs/METRICS.md "Broker"): its Raft member's, its traffic, its
queues, its consumer groups' lag and its store's disk.

`BrokerStats` is what the send and pull paths feed (per-topic counts in a `LabelCounters` of
`MAX_TOPIC_SERIES` topics, two latency histograms, in-flight dedup hits); a node has one only
when its process serves metrics. Everything else is read from the replicated state when
scraped, on the event loop (`mqmetrics.server.LoopCollector`), by `BrokerMetrics.families`.

Label sets and what bounds them (each family is also capped here, and what a cap leaves out is
counted in ``raftmq_metrics_series_omitted{family}``):

- ``topic``: the group's topic table (`broker.state.machine.MAX_TOPICS`); traffic counters keep at
most
  `MAX_TOPIC_SERIES` topics per process (later ones count under ``(other)``).
- ``topic`` x ``queue``: the topic table times `broker.state.machine.MAX_QUEUE_NUMS`; at most
  `MAX_QUEUE_SERIES` queues exported.
- ``group`` x ``topic`` x ``queue``: the applied consumer offsets (every commit adds a key;
  the broker has no limit of its own), so at most `MAX_LAG_SERIES` exported.
- ``group`` of retried and dead-lettered counts: the %RETRY% and %DLQ% topics of the table; at
  most `MAX_TOPIC_SERIES` groups.

The figures read from the replicated state (`REPLICATED_FAMILIES`: every member would say the
same) are exported by the leader only, so a sum over every node counts each once
(docs/METRICS.md "Leader-only figures"). Every series of the process carries ``cluster``,
``broker`` and ``node`` (`identity_labels`), added by `mqmetrics.server.MetricsServer`.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from itertools import chain

from prometheus_client import ProcessCollector
from prometheus_client.core import Metric

from broker.components.disk import DiskGuard
from broker.components.offsets import ConsumerOffsets
from broker.components.pulling import LongPolls
from broker.components.raftnode import RaftNode
from broker.components.stats import MAX_TOPIC_SERIES, BrokerStats
from broker.state.derived import DerivedCounters
from broker.state.machine import BrokerStateMachine
from broker.state.names import DLQ_PREFIX, RETRY_PREFIX, SCHEDULE_TOPIC
from dledger.core import Role
from dledger.server import StartError
from dledger.storage import SegmentedLogStore
from mqmetrics.families import (
    Omitted,
    counter,
    gauge,
    histogram,
    label_counter_pair,
    labelled_counter,
    labelled_gauge,
    refusal_family,
)
from mqmetrics.server import LoopCollector, MetricsServer
from mqsecurity.errors import CertificateError
from mqsecurity.refusals import REFUSALS
from mqsecurity.tls import TlsFiles, https_server_context

# Queues whose max offset is exported, and consumer lag series (group x topic x queue): ten
# thousand each keeps a scrape's collection to a few tens of ms of the event loop.
MAX_QUEUE_SERIES = 10_000
MAX_LAG_SERIES = 10_000
# What every broker series carries (docs/METRICS.md "Labels"): brokerClusterName, brokerName
# (rocketmq-exporter's name for a broker group; ``group`` is a consumer group here) and
# dLegerSelfId.
IDENTITY_LABELS = ("cluster", "broker", "node")
# The families read from the replicated state: the same on every member that applied the same
# entries, so only the leader exports them and a sum over a job counts each once.
REPLICATED_FAMILIES = (
    "raftmq_broker_topics",
    "raftmq_broker_queue_max_offset",
    "raftmq_broker_consumer_lag_messages",
    "raftmq_broker_delayed_messages",
    "raftmq_broker_delayed_messages_pending",
    "raftmq_broker_retried_messages",
    "raftmq_broker_dead_lettered_messages",
)
CAPPED_FAMILIES = (
    "broker_queue_max_offset",
    "broker_consumer_lag_messages",
    "broker_retried_messages_total",
    "broker_dead_lettered_messages_total",
)


@dataclass
class BrokerMetrics:
    """The families of one broker node, built at scrape time on its event loop.
    ``raft_families`` gives the Raft member's (``dledger.server.metrics.raft_families`` of the
    node, bound by the composition root); ``delay_levels`` is how many delay levels the
    broker has (``messageDelayLevel``)."""

    node: RaftNode
    sm: BrokerStateMachine
    offsets: ConsumerOffsets
    stats: BrokerStats
    polls: LongPolls
    store_path: str
    raft_families: Callable[[], list[Metric]]
    delay_levels: int
    disk_guard: DiskGuard | None = None
    # The node's client registries (heartbeats it received; each node keeps its own).
    clients: Callable[[], tuple[int, int]] | None = None

    def families(self) -> list[Metric]:
        """Every family of the node: its Raft member's, the security refusals, the broker's."""
        return [
            *self.raft_families(),
            refusal_family(REFUSALS.snapshot()),
            *self.broker_families(),
        ]

    def broker_families(self) -> list[Metric]:
        """The broker's families; the replicated-state ones (`REPLICATED_FAMILIES`) only while
        this node leads."""
        omitted = Omitted()
        out = self._traffic()
        if self.node.role is Role.LEADER:
            out += self._replicated(omitted)
        out += self._disk()
        out += scrub_families(self.sm.derived)
        out.append(omitted.family(CAPPED_FAMILIES))
        return out

    def _traffic(self) -> list[Metric]:
        stats = self.stats
        sm = self.sm
        return [
            *label_counter_pair(
                "broker_sent_messages",
                "broker_sent_bytes",
                "topic",
                (
                    "Messages of sends this node stored (leader), duplicates included",
                    "Encoded bytes of those sends",
                ),
                stats.sent,
            ),
            *label_counter_pair(
                "broker_pulled_messages",
                "broker_pulled_bytes",
                "topic",
                ("Messages this node answered pulls with", "Stored bytes of those messages"),
                stats.pulled,
            ),
            histogram(
                "broker_send_duration_seconds",
                "Seconds from a send's arrival to its answer, successful sends",
                stats.send_s,
            ),
            histogram(
                "broker_pull_duration_seconds",
                "Seconds to answer a pull, not counting the time it was held as a long poll",
                stats.pull_s,
            ),
            gauge("broker_long_polls_held", "Pulls held waiting for messages", self.polls.held),
            *self._clients(),
            labelled_counter(
                "broker_dedup_hits",
                "Messages answered as duplicates: 'applied' by the dedup window (every member), "
                "'in_flight' a retry of a send still being stored (leader)",
                ["stage"],
                [(["applied"], sm.dedup_hits), (["in_flight"], stats.inflight_dedup_hits)],
            ),
        ]

    def _clients(self) -> list[Metric]:
        """This node's live producers and consumers (its own registries: a sum over a group's
        nodes counts a client once per node it heartbeats to)."""
        if self.clients is None:
            return []
        producers, consumers = self.clients()
        return [
            gauge(
                "broker_producers_registered",
                "Producers whose heartbeats this node heard within the expiry",
                producers,
            ),
            gauge(
                "broker_consumers_registered",
                "Consumers whose heartbeats this node heard within the expiry",
                consumers,
            ),
        ]

    def _replicated(self, omitted: Omitted) -> list[Metric]:
        """The families of the replicated state (`REPLICATED_FAMILIES`), the leader's."""
        out: list[Metric] = [
            gauge("broker_topics", "Topics in the group's topic table", len(self.sm.topics)),
            *self._queues(omitted),
            self._lags(omitted),
            *self._system_topics(omitted),
        ]
        assert {f.name for f in out} == set(REPLICATED_FAMILIES), "REPLICATED_FAMILIES is stale"
        return out

    def _queues(self, omitted: Omitted) -> list[Metric]:
        sm = self.sm
        topics = list(sm.topics.values())
        total = sum(max(t.read_queue_nums, t.write_queue_nums) for t in topics)
        keys = (
            (t.name, q) for t in topics for q in range(max(t.read_queue_nums, t.write_queue_nums))
        )
        rows = (
            ([name, str(q)], sm.queue_offsets(name, q)[1])
            for name, q in omitted.capped("broker_queue_max_offset", keys, total, MAX_QUEUE_SERIES)
        )
        return [
            labelled_gauge(
                "broker_queue_max_offset",
                "Messages ever stored in each queue (its next offset), as this node applied them",
                ["topic", "queue"],
                rows,
            ),
            *self._delayed(),
        ]

    def _delayed(self) -> list[Metric]:
        sm = self.sm
        stored = pending = 0
        for level in range(1, self.delay_levels + 1):
            high = sm.queue_offsets(SCHEDULE_TOPIC, level - 1)[1]
            stored += high
            pending += max(0, high - sm.schedule_offsets.get(level, 0))
        return [
            counter(
                "broker_delayed_messages",
                "Messages stored for later delivery (delay levels, retries with a delay)",
                stored,
            ),
            gauge("broker_delayed_messages_pending", "Delayed messages not delivered yet", pending),
        ]

    def _lags(self, omitted: Omitted) -> Metric:
        sm = self.sm
        pending = self.offsets.pending
        keys: Iterator[tuple[str, str, int]] = chain(
            sm.offsets, (k for k in list(pending) if k not in sm.offsets)
        )
        total = len(sm.offsets) + sum(1 for k in pending if k not in sm.offsets)
        rows = []
        for group, topic, q in omitted.capped(
            "broker_consumer_lag_messages", keys, total, MAX_LAG_SERIES
        ):
            config = sm.topics.get(topic)
            if config is None or q >= config.read_queue_nums:
                continue  # a commit of a deleted topic or queue
            low, high = sm.queue_offsets(topic, q)
            committed = self.offsets.committed(group, topic, q)
            rows.append(([group, topic, str(q)], high - min(max(committed, low), high)))
        return labelled_gauge(
            "broker_consumer_lag_messages",
            "Messages in each queue at or after the consumer group's committed offset",
            ["group", "topic", "queue"],
            rows,
        )

    def _system_topics(self, omitted: Omitted) -> list[Metric]:
        """Retried and dead-lettered messages per consumer group: what its %RETRY% and %DLQ%
        topics ever stored (replicated state: every member says the same)."""
        out: list[Metric] = []
        for prefix, name, doc in (
            (RETRY_PREFIX, "broker_retried_messages", "Messages sent back for a retry"),
            (DLQ_PREFIX, "broker_dead_lettered_messages", "Messages moved to the %DLQ% topic"),
        ):
            topics = [t for t in self.sm.topics.values() if t.name.startswith(prefix)]
            rows = (
                (
                    [t.name[len(prefix) :]],
                    sum(
                        self.sm.queue_offsets(t.name, q)[1]
                        for q in range(max(t.read_queue_nums, t.write_queue_nums))
                    ),
                )
                for t in omitted.capped(name + "_total", topics, len(topics), MAX_TOPIC_SERIES)
            )
            out.append(labelled_counter(name, doc + ", per consumer group", ["group"], rows))
        return out

    def _disk(self) -> list[Metric]:
        out: list[Metric] = []
        try:
            st = os.statvfs(self.store_path)
        except OSError:
            pass  # the directory is gone: the store reports it; no disk figures this scrape
        else:
            size = st.f_blocks * st.f_frsize
            out += [
                gauge("store_disk_size_bytes", "Size of the store's file system", size),
                gauge(
                    "store_disk_free_bytes",
                    "Bytes of the store's file system this process may still write",
                    st.f_bavail * st.f_frsize,
                ),
                gauge(
                    "store_disk_used_bytes",
                    "Bytes of the store's file system in use",
                    (st.f_blocks - st.f_bfree) * st.f_frsize,
                ),
            ]
        if self.disk_guard is not None:
            out.append(
                counter(
                    "store_disk_refused_sends",
                    "Sends refused because the disk was above diskSpaceWarningLevelRatio, or had "
                    "less free than the log's next allocation",
                    self.disk_guard.refused_count,
                )
            )
        store = getattr(self.node, "store", None)  # not there before the node starts
        if isinstance(store, SegmentedLogStore):
            out += [
                gauge(
                    "store_next_allocation_bytes",
                    "Bytes the log must still allocate before it grows past its active files",
                    store.next_allocation_bytes(),
                ),
                counter(
                    "store_log_room_refusals",
                    "Entries the leader refused to keep the log's Raft reserve",
                    store.log_room_refusals,
                ),
            ]
        return out


def scrub_families(c: DerivedCounters) -> list[Metric]:
    """The derived-state checks (broker.state.derived): at open, on read and by the scrubber."""
    return [
        labelled_counter(
            "scrub_records_checked",
            "Derived-state records checked against the commitlog (open, scrubber, repairs)",
            ["store"],
            [([store], n) for store, n in sorted(c.checked.items())],
        ),
        labelled_counter(
            "scrub_mismatches",
            "Derived-state records found not to match the commitlog, by store and by where"
            " they were found: open (the open-time check), read (a pull, POP receive or key"
            " lookup), scrub (the background scrubber)",
            ["store", "found"],
            [([store, where], n) for (store, where), n in sorted(c.mismatches.items())],
        ),
        counter(
            "scrub_rebuilt_records",
            "ConsumeQueue records rewritten from the commitlog in place",
            c.rebuilt,
        ),
        counter(
            "scrub_read_repairs",
            "Reads (pulls, POP receives) that met a wrong record, rebuilt it and answered",
            c.read_repairs,
        ),
        counter(
            "scrub_unrepaired",
            "Derived damage that could not be rebuilt in place: the next start rebuilds all",
            c.unrepaired,
        ),
        counter("scrub_passes", "Scrubber passes over every derived record done", c.passes),
        gauge("scrub_last_pass_seconds", "Seconds the last scrubber pass took", c.last_pass_s),
        gauge(
            "scrub_last_pass_end_timestamp_seconds",
            "Unix time the last scrubber pass ended (0: none yet)",
            c.last_pass_end_unix_s,
        ),
    ]


def identity_labels(cluster: str, broker: str, node: str) -> dict[str, str]:
    """The constant labels of every series a broker process exports (`IDENTITY_LABELS`)."""
    return dict(zip(IDENTITY_LABELS, (cluster, broker, node), strict=True))


class BrokerExporter:
    """``/metrics`` of one broker process: serves ``metrics`` (whose `BrokerStats` the send and
    pull paths, and whose Raft member's `RaftStats` the node, were built counting into: the
    composition root, :mod:`broker.app`), binds the port in :meth:`bind` (inside the event
    loop, before the node touches its store) and serves from :meth:`start`."""

    def __init__(
        self,
        host: str,
        port: int,
        metrics: BrokerMetrics,
        tls: TlsFiles | None = None,
        labels: dict[str, str] | None = None,
    ) -> None:
        """``tls``: the node's certificate and key, /metrics over HTTPS (None: plain HTTP);
        ``labels``: added to every series (`identity_labels`)."""
        self.labels = labels or {}
        self.host = host
        self.port = port
        self.tls = tls
        self.metrics = metrics
        self.server: MetricsServer | None = None

    def bind(self, loop: asyncio.AbstractEventLoop) -> None:
        """Bind the port; `StartError` when it cannot be."""
        collectors = [LoopCollector(self.metrics.families, loop), ProcessCollector(registry=None)]
        try:
            context = https_server_context(self.tls) if self.tls is not None else None
            self.server = MetricsServer(
                self.host, self.port, collectors, tls=context, const_labels=self.labels
            )
        except (OSError, CertificateError) as exc:
            raise StartError(f"metricsPort {self.host}:{self.port}: {exc}") from None

    def start(self) -> None:
        assert self.server is not None, "bind() first"
        self.server.start()

    async def stop(self) -> None:
        if self.server is not None:
            await asyncio.to_thread(self.server.stop)
            self.server = None
