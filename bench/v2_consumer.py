"""The v2 receive cases of ``mqbench``: the official RocketMQ 5 Python client drains a backlog.

Run by ``bench/__main__.py`` with the client's own venv (``build/rmq5/pyclient/bin/python``),
as ``bench/v2_producer.py`` is (it imports nothing of raftmq). Two modes:

- ``simple``: a ``SimpleConsumer``, ``THREADS`` threads each looping ``receive(32, 30 s)`` and
  ``ack`` of every message received (the client acks one message per call), until ``COUNT``
  messages were acked;
- ``push``: a ``PushConsumer`` whose listener answers ``SUCCESS`` (the client acks it), until
  ``COUNT`` messages were consumed.

The seconds measured run from the first message done (acked, consumed) to the ``COUNT``-th
(or the last one done when ``SECONDS`` ran out first): the drain, without the client's start-up
(its route, settings and, for push, its assignment). Prints one JSON object: messages done,
failed receives/acks, the seconds measured.

Security from the environment as ``bench/v2_producer.py`` takes it (``RMQ5_TLS``,
``RMQ5_ACCESS_KEY`` / ``RMQ5_SECRET_KEY``).

Usage: python v2_consumer.py ENDPOINTS TOPIC GROUP MODE COUNT THREADS SECONDS
"""

import json
import os
import sys
import threading
import time
from typing import Any

from rocketmq import (
    ClientConfiguration,
    ConsumeResult,
    Credentials,
    FilterExpression,
    MessageListener,
    PushConsumer,
    SimpleConsumer,
)

# Bounds of the arguments: a typo must not start a thousand threads or an hour-long case.
MAX_COUNT = 10_000_000
MAX_THREADS = 64
MAX_SECONDS = 600.0
# Messages one receive asks for (the most a v2 receive returns here is the broker's batch) and
# how long they stay invisible (longer than any case: nothing comes twice while it runs).
RECEIVE_BATCH = 32
INVISIBLE_S = 30
# A receive's long poll when the backlog is drained (the client's own default is 30 s).
AWAIT_S = 2
# How often the push case looks at its count.
POLL_S = 0.01


def _config(endpoints: str) -> tuple[ClientConfiguration, bool]:
    access_key = os.environ.get("RMQ5_ACCESS_KEY")
    secret_key = os.environ.get("RMQ5_SECRET_KEY")
    creds = Credentials(access_key, secret_key) if access_key and secret_key else Credentials()
    return ClientConfiguration(endpoints, creds), os.environ.get("RMQ5_TLS", "1") != "0"


class _Counter:
    """Messages done, failures, and when the first and the ``count``-th were done."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.done = 0
        self.failed = 0
        self.first = self.last = 0.0
        self.reached = threading.Event()

    def add(self, n: int, count: int) -> None:
        with self.lock:
            now = time.monotonic()
            if not self.done:
                self.first = now
            self.done += n
            self.last = now
            if self.done >= count:
                self.reached.set()

    def result(self) -> dict[str, Any]:
        with self.lock:
            return {"done": self.done, "failed": self.failed, "seconds": self.last - self.first}

    def fail(self) -> None:
        with self.lock:
            self.failed += 1


def simple(
    endpoints: str, topic: str, group: str, count: int, threads: int, seconds: float
) -> dict[str, Any]:
    config, tls = _config(endpoints)
    consumer = SimpleConsumer(
        config, group, {topic: FilterExpression()}, await_duration=AWAIT_S, tls_enable=tls
    )
    consumer.startup()
    counter = _Counter()
    stop_at = time.monotonic() + seconds

    def loop() -> None:
        while not counter.reached.is_set() and time.monotonic() < stop_at:
            try:
                messages = consumer.receive(RECEIVE_BATCH, INVISIBLE_S) or []
            except Exception:  # the client raises its own classes and grpc's
                counter.fail()
                continue
            for msg in messages:
                try:
                    consumer.ack(msg)
                except Exception:
                    counter.fail()
                    continue
                counter.add(1, count)

    workers = [threading.Thread(target=loop) for _ in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    consumer.shutdown()
    return counter.result()


class _Listener(MessageListener):  # type: ignore[misc]  # the client ships no types
    def __init__(self, counter: _Counter, count: int) -> None:
        self.counter = counter
        self.count = count

    def consume(self, message: object) -> ConsumeResult:
        self.counter.add(1, self.count)
        return ConsumeResult.SUCCESS


def push(endpoints: str, topic: str, group: str, count: int, seconds: float) -> dict[str, Any]:
    config, tls = _config(endpoints)
    counter = _Counter()
    consumer = PushConsumer(
        config, group, _Listener(counter, count), {topic: FilterExpression()}, tls_enable=tls
    )
    consumer.startup()
    counter.reached.wait(seconds)
    consumer.shutdown()
    return counter.result()


def main() -> int:
    if len(sys.argv) != 8:
        print(__doc__.strip().splitlines()[-1], file=sys.stderr)
        return 2
    endpoints, topic, group, mode = sys.argv[1:5]
    try:
        count, threads, seconds = int(sys.argv[5]), int(sys.argv[6]), float(sys.argv[7])
    except ValueError:
        print("v2_consumer: COUNT and THREADS are integers, SECONDS a number", file=sys.stderr)
        return 2
    if mode not in ("simple", "push"):
        print("v2_consumer: MODE is simple or push", file=sys.stderr)
        return 2
    if not (0 < count <= MAX_COUNT and 0 < threads <= MAX_THREADS and 0 < seconds <= MAX_SECONDS):
        print(
            f"v2_consumer: count in (0, {MAX_COUNT}], threads in (0, {MAX_THREADS}], "
            f"seconds in (0, {MAX_SECONDS}]",
            file=sys.stderr,
        )
        return 2
    if mode == "simple":
        result = simple(endpoints, topic, group, count, threads, seconds)
    else:
        result = push(endpoints, topic, group, count, seconds)
    json.dump(result, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
