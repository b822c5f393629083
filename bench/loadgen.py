"""One load-generator process for ``mqbench`` (``python -m bench.loadgen``).

Keeps ``--in-flight`` closed-loop senders busy through the real client (``client.Producer``:
routes from the NameServer, coalescing of in-flight sends, retries) for ``--seconds`` after a
warm-up, and prints one JSON object: messages sent, failures, and every send's latency in
microseconds (the harness merges several processes before taking percentiles).

Two ways to keep sends in flight:

- ``--mode async`` (the default): each sender is a chain of ``send_async`` calls, the next one
  sent from the previous one's callback. What a RocketMQ user does for throughput, and the
  same shape as the peers' load (asyncio tasks, one write each in flight).
- ``--mode threads``: one thread per sender calling ``send`` (blocking). Costs the client far
  more CPU per message (thread wake-ups), which shares the 2 cores with the brokers.

    python -m bench.loadgen --namesrv 127.0.0.1:9876 --topic T --size 1024 --in-flight 128
        [--tls-ca CA --credentials FILE ...]    (a secure group: mqsecurity.options)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time

from bench import tune_gc
from bench.closedloop import MAX_SAMPLES_PER_THREAD, WARMUP_S, closed_loop
from client import Message, MQClientError, Producer
from mqsecurity.errors import SecurityError
from mqsecurity.options import add_security_arguments, security_from_args

# An async sender whose send could not even be submitted (no route yet) tries again after this.
RETRY_PAUSE_S = 0.05


def run(
    producer: Producer, topic: str, size: int, threads: int, seconds: float
) -> dict[str, object]:
    """``threads`` threads each calling the blocking ``send``."""
    body = os.urandom(size)
    return closed_loop(lambda: producer.send(Message(topic, body)), MQClientError, threads, seconds)


def run_async(
    producer: Producer, topic: str, size: int, in_flight: int, seconds: float
) -> dict[str, object]:
    """``in_flight`` chains of ``send_async``, the next send of a chain issued from the
    previous one's callback."""
    body = os.urandom(size)
    start_at = time.monotonic() + WARMUP_S
    stop_at = start_at + seconds
    counts = {"sent": 0, "failed": 0, "active": in_flight}
    lat_us: list[int] = []
    max_samples = MAX_SAMPLES_PER_THREAD * 4
    finished = threading.Event()
    lock = threading.Lock()  # callbacks run on one thread; the retry timers on others

    def count(what: str, n: int = 1) -> None:
        with lock:
            counts[what] += n
            if counts["active"] == 0:
                finished.set()

    def chain_over() -> None:
        count("active", -1)

    def issue() -> None:
        t0 = time.monotonic()
        if t0 >= stop_at:
            chain_over()
            return

        def ok(_: object) -> None:
            if t0 >= start_at:
                count("sent")
                if len(lat_us) < max_samples:
                    lat_us.append(int((time.monotonic() - t0) * 1e6))
            issue()

        def failed(_: BaseException) -> None:
            if t0 >= start_at:
                count("failed")
            issue()

        try:
            producer.send_async(Message(topic, body), on_success=ok, on_exception=failed)
        except MQClientError:  # no route yet: try again shortly, off the callback thread
            if t0 >= start_at:
                count("failed")
            threading.Timer(RETRY_PAUSE_S, issue).start()

    for _ in range(in_flight):
        issue()
    finished.wait(seconds + WARMUP_S + 30)
    return {
        "sent": counts["sent"],
        "failed": counts["failed"],
        "seconds": seconds,
        "latencies_us": lat_us,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.loadgen", description=__doc__)
    p.add_argument("--namesrv", required=True)
    p.add_argument("--topic", required=True)
    p.add_argument("--size", type=int, default=1024)
    p.add_argument("--in-flight", type=int, default=16, help="sends kept in flight")
    p.add_argument("--mode", choices=("async", "threads"), default="async")
    p.add_argument("--seconds", type=float, default=3.0)
    add_security_arguments(p)
    a = p.parse_args(argv)
    if a.size <= 0 or a.in_flight <= 0 or a.seconds <= 0:
        print("loadgen: --size, --in-flight and --seconds must be > 0", file=sys.stderr)
        return 2
    try:
        security = security_from_args(a)
    except SecurityError as exc:
        print(f"loadgen: {exc}", file=sys.stderr)
        return 2
    tune_gc()  # as the broker and the peers' load generators do
    fn = run_async if a.mode == "async" else run
    with Producer(f"bench-{os.getpid()}", a.namesrv, security=security) as producer:
        result = fn(producer, a.topic, a.size, a.in_flight, a.seconds)
    json.dump(result, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
