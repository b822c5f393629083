"""A broker node's metric families on a real state machine, without Raft, gRPC or HTTP: the
send and pull counters, queue offsets, consumer lag, retries and dead letters, the caps."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from broker_world import outgoing, world
from prometheus_client.core import Metric

from broker import metrics as broker_metrics
from broker.components.consumers import ConsumerGroups
from broker.components.locks import CONSUMER_EXPIRE_MS
from broker.components.offsets import ConsumerOffsets
from broker.components.producers import PRODUCER_EXPIRE_MS, ProducerRegistry
from broker.components.pulling import PullPath, PullQuery
from broker.components.sending import SendPath
from broker.components.settings import ServiceConfig
from broker.components.stats import BrokerStats
from broker.config import ConfigError, load_config, parse_config
from broker.metrics import BrokerMetrics
from broker.state.delayrules import PROPERTY_DELAY
from broker.state.message import Message, UniqIdGenerator, encode_batch
from broker.state.names import SCHEDULE_TOPIC
from broker.state.records import ENTRY_MESSAGES
from dledger.core import Role
from mqcluster.cluster import LocalCluster, metrics_line
from mqmetrics.hot import OTHER
from nameserver.config import ConfigError as NameServerConfigError
from nameserver.config import load_config as load_namesrv_config
from nameserver.config import parse_config as parse_namesrv_config

IDS = UniqIdGenerator(ip="10.0.0.1", pid=9, instance_hash=2)


def samples(families: list[Metric]) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample by (name, sorted labels)."""
    return {(s.name, tuple(sorted(s.labels.items()))): s.value for f in families for s in f.samples}


def test_families_follow_sends_pulls_commits_and_the_dedup_window(tmp_path: Path) -> None:
    async def body() -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        node, sm, topics, applied = world(tmp_path)
        await topics.upsert("T", 2, 2, 6)
        stats = BrokerStats()
        sender = SendPath(topics.ctx, topics, stats=stats)
        puller = PullPath(topics, applied, stats=stats)
        offsets = ConsumerOffsets(topics, applied)
        msgs = [outgoing(i % 2, i) for i in range(5)]  # queue 0: 3, queue 1: 2
        await sender.send("T", msgs)
        await sender.send("T", msgs)  # every one a duplicate (the dedup window)
        await sender.send("T", [outgoing(0, 9, **{PROPERTY_DELAY: "1"})])
        got = await puller.pull(PullQuery("T", 0, 0), "peer")
        assert len(got.queue_offsets) == 3
        await offsets.commit("g", "T", 0, 1, sync=True)
        await offsets.commit("g", "T", 1, 0, sync=False)  # pending on the leader only
        metrics = BrokerMetrics(
            node,  # type: ignore[arg-type]
            sm,
            offsets,
            stats,
            polls=puller.polls,
            store_path=str(tmp_path),
            raft_families=list,
            delay_levels=len(ServiceConfig("127.0.0.1", 10911).delay_levels_ms),  # world()'s
        )
        return samples(metrics.broker_families())

    got = asyncio.run(body())
    t = (("topic", "T"),)
    assert got[("raftmq_broker_sent_messages_total", t)] == 11  # duplicates included
    assert got[("raftmq_broker_sent_bytes_total", t)] > 0
    assert got[("raftmq_broker_send_duration_seconds_count", ())] == 3
    assert got[("raftmq_broker_pulled_messages_total", t)] == 3
    assert got[("raftmq_broker_pull_duration_seconds_count", ())] == 1
    assert got[("raftmq_broker_dedup_hits_total", (("stage", "applied"),))] == 5
    assert got[("raftmq_broker_queue_max_offset", (("queue", "0"), ("topic", "T")))] == 3
    assert got[("raftmq_broker_queue_max_offset", (("queue", "1"), ("topic", "T")))] == 2
    lag = "raftmq_broker_consumer_lag_messages"
    assert got[(lag, (("group", "g"), ("queue", "0"), ("topic", "T")))] == 2
    assert got[(lag, (("group", "g"), ("queue", "1"), ("topic", "T")))] == 2
    assert got[("raftmq_broker_delayed_messages_total", ())] == 1
    assert got[("raftmq_broker_delayed_messages_pending", ())] == 1
    assert got[("raftmq_broker_topics", ())] == 1  # the schedule topic is not in the table
    assert got[("raftmq_store_disk_size_bytes", ())] > got[("raftmq_store_disk_free_bytes", ())]
    omitted = "raftmq_metrics_series_omitted"
    assert got[(omitted, (("family", "raftmq_broker_queue_max_offset"),))] == 0
    assert not [k for k in got if ("topic", SCHEDULE_TOPIC) in k[1]]


def test_retries_and_dead_letters_are_counted_per_group_and_caps_are_reported(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(broker_metrics, "MAX_QUEUE_SERIES", 2)
    monkeypatch.setattr(broker_metrics, "MAX_LAG_SERIES", 1)

    async def body() -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        node, sm, topics, applied = world(tmp_path)
        await topics.upsert("T", 2, 2, 6)
        for name, n in (("%RETRY%g", 3), ("%DLQ%g", 2), ("%RETRY%h", 1)):
            await topics.ensure_system(name, 1)
            msgs = [Message(name, 0, b"x", uniq_id=IDS.next_id()) for _ in range(n)]
            await node.propose([encode_batch(msgs)[0]], ENTRY_MESSAGES)
        offsets = ConsumerOffsets(topics, applied)
        await offsets.commit("g", "T", 0, 0, sync=True)
        await offsets.commit("h", "T", 0, 0, sync=True)
        stats = BrokerStats()
        polls = PullPath(topics, applied).polls
        metrics = BrokerMetrics(
            node,  # type: ignore[arg-type]
            sm,
            offsets,
            stats,
            polls=polls,
            store_path=str(tmp_path),
            raft_families=list,
            delay_levels=len(ServiceConfig("127.0.0.1", 10911).delay_levels_ms),  # world()'s
        )
        return samples(metrics.broker_families())

    got = asyncio.run(body())
    assert got[("raftmq_broker_retried_messages_total", (("group", "g"),))] == 3
    assert got[("raftmq_broker_retried_messages_total", (("group", "h"),))] == 1
    assert got[("raftmq_broker_dead_lettered_messages_total", (("group", "g"),))] == 2
    queues = [k for k in got if k[0] == "raftmq_broker_queue_max_offset"]
    assert len(queues) == 2  # capped: T has 2 queues, the three system topics 1 each
    omitted = "raftmq_metrics_series_omitted"
    assert got[(omitted, (("family", "raftmq_broker_queue_max_offset"),))] == 3
    assert got[(omitted, (("family", "raftmq_broker_consumer_lag_messages"),))] == 1
    assert len([k for k in got if k[0] == "raftmq_broker_consumer_lag_messages"]) == 1


def test_topics_beyond_the_traffic_table_count_as_other() -> None:
    stats = BrokerStats()
    for i in range(stats.sent.max_labels + 3):
        stats.sent.add(f"T{i}", 1, 10)
    rows = stats.sent.snapshot()
    assert len(rows) == stats.sent.max_labels + 1
    assert rows[-1] == (OTHER, 3, 30)


BASE_CONF = "dLegerPeers=n0-127.0.0.1:40911\ndLegerSelfId=n0\nlistenPort=10911\n"


def test_metrics_port_keys_are_checked() -> None:
    assert parse_config(BASE_CONF).metricsPort == 0
    assert parse_config(BASE_CONF + "metricsPort=5557\n").metricsPort == 5557
    for bad in ("10911", "40911", "70000", "-1", "x"):
        with pytest.raises(ConfigError, match="metricsPort"):
            parse_config(BASE_CONF + f"metricsPort={bad}\n")
    assert parse_namesrv_config("metricsPort=5556\n").metricsPort == 5556
    with pytest.raises(NameServerConfigError, match="metricsPort"):
        parse_namesrv_config("listenPort=9876\nmetricsPort=9876\n")


def test_a_local_group_gives_every_process_a_metrics_port_and_prints_them(tmp_path: Path) -> None:
    cluster = LocalCluster(tmp_path / "on")
    cluster.configure(3, auto_ports=True, namesrv=True)
    assert cluster.namesrv is not None
    ports = [n.metrics_port for n in cluster.nodes] + [cluster.namesrv.metrics_port]
    used = {p for n in cluster.nodes for p in (n.client_port, n.peer_port, n.grpc_port)}
    assert all(ports) and len(set(ports)) == 4 and not used & set(ports)
    for n in cluster.nodes:
        assert load_config(n.conf).metricsPort == n.metrics_port
    line = metrics_line(cluster)
    assert all(f"http://127.0.0.1:{p}/metrics" in line for p in ports)
    assert LocalCluster(tmp_path / "on").nodes == cluster.nodes  # kept in cluster.json
    off = LocalCluster(tmp_path / "off")
    off.configure(1, auto_ports=True, extra={"metricsPort": "0"})
    assert off.nodes[0].metrics_port == 0
    assert metrics_line(off) == "metrics: not served (metricsPort=0)"


def test_metrics_follow_tls_unless_metrics_tls_enable_says_otherwise(tmp_path: Path) -> None:
    secure = LocalCluster(tmp_path / "secure")
    secure.configure(2, auto_ports=True, namesrv=True, secure=True)
    assert secure.namesrv is not None
    for n in secure.nodes:  # HTTPS with the node's own member certificate
        cfg = load_config(n.conf)
        assert cfg.metricsTlsEnable is None and cfg.metrics_tls_files == cfg.tls_files
        assert cfg.tls_files is not None and cfg.tls_files.cert_path is not None
        assert cfg.tls_files.cert_path.endswith(f"-{n.node_id}.crt")
        assert n.metrics_url == f"https://127.0.0.1:{n.metrics_port}/metrics"
    ns_cfg = load_namesrv_config(secure.namesrv.conf)
    assert ns_cfg.metrics_tls_files is not None
    assert ns_cfg.metrics_tls_files.cert_path == ns_cfg.tlsServerCertPath
    assert secure.namesrv.metrics_url.startswith("https://")
    assert LocalCluster(tmp_path / "secure").nodes == secure.nodes  # kept in cluster.json
    # What scrapers are given: the group's CA; what up and status print: how to curl with it.
    assert secure.metrics_ca == secure.layout.ca_cert
    assert secure.metrics_ssl_context() is not None
    line = metrics_line(secure)
    assert f"curl --cacert {secure.layout.ca_cert} https://127.0.0.1:" in line
    assert "http://" not in line
    # A cluster.json written before metrics_tls: a secure group's processes serve HTTPS.
    state = tmp_path / "secure" / "cluster.json"
    data = json.loads(state.read_text())
    for n in [*data["nodes"], data["namesrv"]]:
        del n["metrics_tls"]
    state.write_text(json.dumps(data))
    assert LocalCluster(tmp_path / "secure").nodes == secure.nodes
    # metricsTlsEnable=false: plain HTTP for a scraper without TLS (the other ports keep TLS).
    opted_out = LocalCluster(tmp_path / "out")
    opted_out.configure(1, auto_ports=True, secure=True, extra={"metricsTlsEnable": "false"})
    cfg = load_config(opted_out.nodes[0].conf)
    assert cfg.tlsEnable and cfg.metrics_tls_files is None
    assert opted_out.nodes[0].metrics_url.startswith("http://")
    assert opted_out.metrics_ssl_context() is None and "curl" not in metrics_line(opted_out)
    # A plaintext group stays plain HTTP; true without tlsEnable is refused.
    plain = LocalCluster(tmp_path / "plain")
    plain.configure(1, auto_ports=True, namesrv=True)
    assert load_config(plain.nodes[0].conf).metrics_tls_files is None
    assert plain.metrics_ssl_context() is None and plain.metrics_ca is None
    with pytest.raises(ConfigError, match="metricsTlsEnable"):
        parse_config(BASE_CONF + "metricsTlsEnable=true\n")
    with pytest.raises(NameServerConfigError, match="metricsTlsEnable"):
        parse_namesrv_config("metricsTlsEnable=true\n")
    assert parse_namesrv_config("metricsTlsEnable=false\n").metrics_tls_files is None


def test_a_follower_exports_no_figure_of_the_replicated_state(tmp_path: Path) -> None:
    """Only the leader exports what every member would say the same (docs/METRICS.md
    "Leader-only figures"): a sum over every node counts each figure once."""

    async def body() -> tuple[set[str], set[str]]:
        node, sm, topics, applied = world(tmp_path)
        await topics.upsert("T", 2, 2, 6)
        await topics.ensure_system("%DLQ%g", 1)
        offsets = ConsumerOffsets(topics, applied)
        await offsets.commit("g", "T", 0, 0, sync=True)
        metrics = BrokerMetrics(
            node,  # type: ignore[arg-type]
            sm,
            offsets,
            BrokerStats(),
            polls=PullPath(topics, applied).polls,
            store_path=str(tmp_path),
            raft_families=list,
            delay_levels=len(ServiceConfig("127.0.0.1", 10911).delay_levels_ms),
        )
        leading = {f.name for f in metrics.broker_families()}
        node.role = Role.FOLLOWER
        following = {f.name for f in metrics.broker_families()}
        return leading, following

    leading, following = asyncio.run(body())
    assert set(broker_metrics.REPLICATED_FAMILIES) <= leading
    assert not set(broker_metrics.REPLICATED_FAMILIES) & following
    # The node's own figures stay on every member.
    assert {"raftmq_broker_sent_messages", "raftmq_store_disk_free_bytes"} <= following


def test_the_nodes_live_producers_and_consumers_are_gauges(tmp_path: Path) -> None:
    """Each node's own registries, counted at scrape time with the silent clients dropped
    first: two producers and a consumer, then none once the expiry passed."""

    async def body() -> list[dict[tuple[str, tuple[tuple[str, str], ...]], float]]:
        node, sm, topics, applied = world(tmp_path)
        await topics.upsert("T", 2, 2, 6)
        producers, consumers = ProducerRegistry(1000), ConsumerGroups(topics)
        clock = [1_000_000]
        producers.clock_ms = consumers.clock_ms = lambda: clock[0]
        producers.heartbeat("pg", "p1", ("127.0.0.1:1", "PYTHON", "0.3.0"))
        producers.heartbeat("pg", "p2", ("127.0.0.1:2", "PYTHON", "0.3.0"))
        consumers.heartbeat("cg", "c1", [("T", "*")], [])
        metrics = BrokerMetrics(
            node,  # type: ignore[arg-type]
            sm,
            ConsumerOffsets(topics, applied),
            BrokerStats(),
            polls=PullPath(topics, applied).polls,
            store_path=str(tmp_path),
            raft_families=list,
            delay_levels=len(ServiceConfig("127.0.0.1", 10911).delay_levels_ms),
            clients=lambda: (producers.live_count(), consumers.live_count()),
        )
        before = samples(metrics.broker_families())
        clock[0] += max(PRODUCER_EXPIRE_MS, CONSUMER_EXPIRE_MS)
        return [before, samples(metrics.broker_families())]

    before, after = asyncio.run(body())
    assert before[("raftmq_broker_producers_registered", ())] == 2
    assert before[("raftmq_broker_consumers_registered", ())] == 1
    assert after[("raftmq_broker_producers_registered", ())] == 0
    assert after[("raftmq_broker_consumers_registered", ())] == 0
