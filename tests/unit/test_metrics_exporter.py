"""mqmetrics: the hot-path counters, the capped families and the bounded /metrics endpoint."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest
from prometheus_client.core import Metric
from prometheus_client.parser import text_string_to_metric_families

from mqmetrics.families import Omitted, gauge, histogram
from mqmetrics.hot import OTHER, Histogram, LabelCounters
from mqmetrics.server import MAX_CONNECTIONS, LoopCollector, MetricsServer


def test_histogram_counts_each_value_in_its_le_bucket_and_snapshots_cumulatively() -> None:
    h = Histogram((0.001, 0.01, 0.1))
    for v in (0.0005, 0.001, 0.002, 0.05, 3.0):
        h.observe(v)
    buckets, total = h.snapshot()
    # le is inclusive (0.001 falls in the 0.001 bucket), +Inf holds every observation.
    assert buckets == [("0.001", 2), ("0.01", 3), ("0.1", 4), ("+Inf", 5)]
    assert total == pytest.approx(3.0535)
    with pytest.raises(ValueError):
        Histogram((0.1, 0.01))
    with pytest.raises(ValueError):
        Histogram(())


def test_label_counters_keep_their_labels_and_count_the_overflow_as_other() -> None:
    c = LabelCounters(2)
    c.add("A", 1, 10)
    c.add("B", 2, 20)
    c.add("C", 3, 30)  # the table is full: counted under (other)
    c.add("A", 1, 5)
    c.add("D", 1, 1)
    assert c.snapshot() == [("A", 2, 15), ("B", 2, 20), (OTHER, 4, 31)]
    with pytest.raises(ValueError):
        LabelCounters(0)


def test_omitted_counts_what_a_cap_leaves_out() -> None:
    omitted = Omitted()
    assert list(omitted.capped("f", iter(range(10)), 10, 3)) == [0, 1, 2]
    assert list(omitted.capped("g", iter(range(2)), 2, 3)) == [0, 1]
    family = omitted.family(["f", "g"])
    assert [(s.labels["family"], s.value) for s in family.samples] == [
        ("raftmq_f", 7),
        ("raftmq_g", 0),
    ]


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    """An event loop running in a thread of its own, as a server's is."""
    lp = asyncio.new_event_loop()
    thread = threading.Thread(target=lp.run_forever, daemon=True)
    thread.start()
    yield lp
    lp.call_soon_threadsafe(lp.stop)
    thread.join(5)
    lp.close()


def _get(url: str, method: str = "GET") -> tuple[int, str]:
    req = urllib.request.Request(url, method=method)
    try:
        with urllib.request.urlopen(req, timeout=5) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_the_endpoint_serves_families_built_on_the_loop_and_nothing_else(
    loop: asyncio.AbstractEventLoop,
) -> None:
    threads: list[str] = []
    hist = Histogram((1.0,))
    hist.observe(0.5)

    def build() -> list[Metric]:
        threads.append(threading.current_thread().name)
        return [gauge("test_value", "A test gauge", 42), histogram("test_seconds", "h", hist)]

    collector = LoopCollector(build, loop, min_interval_s=0.0)
    server = MetricsServer("127.0.0.1", 0, [collector])
    server.start()
    try:
        url = f"http://127.0.0.1:{server.port}"
        status, text = _get(url + "/metrics")
        assert status == 200
        families = {f.name: f for f in text_string_to_metric_families(text)}
        assert families["raftmq_test_value"].samples[0].value == 42
        assert {s.name: s.value for s in families["raftmq_test_seconds"].samples} == {
            "raftmq_test_seconds_bucket": 1,
            "raftmq_test_seconds_count": 1,
            "raftmq_test_seconds_sum": 0.5,
        }
        assert families["raftmq_metrics_collect_timeouts"].samples[0].value == 0
        assert threads and all(t != "metrics-http" for t in threads)  # on the loop's thread
        assert _get(url + "/")[0] == 404
        assert _get(url + "/metrics/../admin")[0] == 404
        assert _get(url + "/metrics", "POST")[0] == 405
    finally:
        server.stop()


def test_scrapes_within_the_interval_reuse_one_collection(
    loop: asyncio.AbstractEventLoop,
) -> None:
    calls = []
    collector = LoopCollector(lambda: calls.append(1) or [], loop, min_interval_s=60.0)
    for _ in range(5):
        list(collector.collect())
    assert len(calls) == 1 and collector.collections == 1


def test_a_blocked_loop_answers_without_the_state_and_counts_a_timeout(
    loop: asyncio.AbstractEventLoop,
) -> None:
    release = threading.Event()
    loop.call_soon_threadsafe(lambda: release.wait(10))  # the loop is busy
    collector = LoopCollector(
        lambda: [gauge("never", "x", 1)], loop, min_interval_s=0.0, timeout_s=0.2
    )
    try:
        families = list(collector.collect())
    finally:
        release.set()
    assert [f.name for f in families] == ["raftmq_metrics_collect_timeouts"]
    assert collector.timeouts == 1
    assert families[0].samples[0].value == 1


def test_connections_beyond_the_limit_are_closed_at_once(
    loop: asyncio.AbstractEventLoop,
) -> None:
    server = MetricsServer("127.0.0.1", 0, [LoopCollector(lambda: [], loop)])
    server.start()
    idle = []
    try:
        for _ in range(MAX_CONNECTIONS):  # each holds a slot, sending nothing
            idle.append(socket.create_connection(("127.0.0.1", server.port), timeout=5))
        # Accepted in order: the idle ones took every slot, this one is closed unserved.
        with socket.create_connection(("127.0.0.1", server.port), timeout=5) as extra:
            assert extra.recv(1) == b""
        assert server.refused_connections == 1
    finally:
        for s in idle:
            s.close()
    deadline = time.monotonic() + 5
    status = 0
    while status != 200 and time.monotonic() < deadline:  # the slots come back
        try:
            status = _get(f"http://127.0.0.1:{server.port}/metrics")[0]
        except (urllib.error.URLError, ConnectionError):
            time.sleep(0.05)
    server.stop()
    assert status == 200


def test_a_busy_port_fails_at_construction() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        with pytest.raises(OSError):
            MetricsServer("127.0.0.1", taken.getsockname()[1], [])
