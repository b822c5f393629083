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

``--serve`` keeps the producer for many rounds: each line read on stdin is one round,
``{"in_flight": N, "seconds": S, "start_at": T}`` (``T`` a ``time.monotonic()`` instant, the
same clock in every process of the machine; sends before it are the round's warm-up), and each
round's result is printed as one line. The harness starts every process of a round at the
same ``T`` and reads the group's CPU at ``T`` and ``T + S``: the paired comparisons of
``mqbench`` run short rounds without a process start-up in each.
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
# --serve: a round's bounds (a round asks at most this many sends in flight and this long, and
# starts at most this far from now: a harness asking more is wrong, not slow).
SERVE_MAX_IN_FLIGHT = 4096
SERVE_MAX_SECONDS = 600.0
SERVE_MAX_LEAD_S = 60.0


def run(
    producer: Producer,
    topic: str,
    size: int,
    threads: int,
    seconds: float,
    start_at: float | None = None,
) -> dict[str, object]:
    """``threads`` threads each calling the blocking ``send``."""
    body = os.urandom(size)

    def send() -> object:
        return producer.send(Message(topic, body))

    return closed_loop(send, MQClientError, threads, seconds, start_at)


def run_async(
    producer: Producer,
    topic: str,
    size: int,
    in_flight: int,
    seconds: float,
    start_at: float | None = None,
) -> dict[str, object]:
    """``in_flight`` chains of ``send_async``, the next send of a chain issued from the
    previous one's callback; measured from ``start_at`` (default: after ``WARMUP_S``)."""
    body = os.urandom(size)
    start_at = time.monotonic() + WARMUP_S if start_at is None else start_at
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
    finished.wait(max(0.0, stop_at - time.monotonic()) + 30)
    return {
        "sent": counts["sent"],
        "failed": counts["failed"],
        "seconds": seconds,
        "latencies_us": lat_us,
    }


def serve_round(line: str) -> tuple[int, float, float]:
    """A --serve round's ``(in_flight, seconds, start_at)``, each checked (ValueError)."""
    cmd = json.loads(line)
    if not isinstance(cmd, dict):
        raise ValueError("a round is a JSON object")
    in_flight, seconds, start_at = cmd.get("in_flight"), cmd.get("seconds"), cmd.get("start_at")
    if not isinstance(in_flight, int) or not 0 < in_flight <= SERVE_MAX_IN_FLIGHT:
        raise ValueError(f"in_flight must be an integer in [1, {SERVE_MAX_IN_FLIGHT}]")
    if not isinstance(seconds, int | float) or not 0 < seconds <= SERVE_MAX_SECONDS:
        raise ValueError(f"seconds must be in (0, {SERVE_MAX_SECONDS:g}]")
    now = time.monotonic()
    if not isinstance(start_at, int | float) or abs(start_at - now) > SERVE_MAX_LEAD_S:
        raise ValueError(f"start_at must be a monotonic instant within {SERVE_MAX_LEAD_S:g} s")
    return in_flight, float(seconds), float(start_at)


def serve(producer: Producer, topic: str, size: int, mode: str) -> int:
    """--serve: one round per stdin line, one result line each, until stdin closes."""
    fn = run_async if mode == "async" else run
    for line in sys.stdin:
        try:
            in_flight, seconds, start_at = serve_round(line)
        except ValueError as exc:  # json's errors are ValueErrors too
            print(f"loadgen: bad round {line.strip()[:200]!r}: {exc}", file=sys.stderr)
            return 2
        print(json.dumps(fn(producer, topic, size, in_flight, seconds, start_at)), flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.loadgen", description=__doc__)
    p.add_argument("--namesrv", required=True)
    p.add_argument("--topic", required=True)
    p.add_argument("--size", type=int, default=1024)
    p.add_argument("--in-flight", type=int, default=16, help="sends kept in flight")
    p.add_argument("--mode", choices=("async", "threads"), default="async")
    p.add_argument("--seconds", type=float, default=3.0)
    p.add_argument("--serve", action="store_true", help="rounds read from stdin (see above)")
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
        if a.serve:
            return serve(producer, a.topic, a.size, a.mode)
        result = fn(producer, a.topic, a.size, a.in_flight, a.seconds)
    json.dump(result, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
