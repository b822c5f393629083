"""Run by the tests with the official RocketMQ 5 Python client's venv (build/rmq5/pyclient): a
SimpleConsumer of GROUP on TOPIC through ENDPOINTS that receives, with a few receives in flight,
until COUNT distinct messages came (or BUDGET_S passed). Prints one JSON line per received
message with the wall-clock time the client handed it over (``received_ms``: when its receive's
future completed, not when this loop got round to it), which receive carried it and when that
receive started (``call``, ``call_started_ms``), the delivery time it carries and its delivery
attempt; one line per failed receive; then ``{"done": COUNT}``.

It does not ack (acks are the POP tests' business, and each is a commit that would slow the
receives on a loaded machine): a message stays invisible for INVISIBLE_S, longer than the
test, so each comes once, unless the answer of its receive was lost (its node died): then it
comes again after INVISIBLE_S with attempt 2.

Usage: python py_timed_consumer.py ENDPOINTS TOPIC GROUP COUNT BUDGET_S
(this file runs in another venv: it imports nothing of raftmq.)
"""

import itertools
import json
import sys
import time
from concurrent.futures import FIRST_COMPLETED, wait

from rocketmq import ClientConfiguration, Credentials, FilterExpression, SimpleConsumer

# Long polling per receive, s (a receive returns as soon as a message is visible).
AWAIT_S = 2
INVISIBLE_S = 20
# Receives in flight at once: one at a time cannot keep up with a burst of due messages.
RECEIVES = 4


def _messages(future) -> list:
    try:
        return future.result() or []
    except Exception as exc:  # a failover: the next receive goes on
        line = {"event": "receive_failed", "error": str(exc)[:200], "call": future.call[0]}
        line["started_ms"], line["failed_ms"] = future.call[1], _done_ms(future)
        print(json.dumps(line), flush=True)
        return []


def _print(msg, future) -> None:
    line = {
        "event": "received",
        "message_id": msg.message_id,
        "received_ms": _done_ms(future),
        "call": future.call[0],
        "call_started_ms": future.call[1],
        "deliver_ms": msg.delivery_timestamp,
        "attempt": msg.delivery_attempt,
        "body": msg.body.decode(),
        "properties": dict(msg.properties),
    }
    print(json.dumps(line), flush=True)


def _receive(consumer, number: int):
    """A receive in flight; ``call`` says which (its number) and when it started, and
    ``done_ms`` will say when the client handed over its answer."""
    started_ms = int(time.time() * 1000)
    future = consumer.receive_async(32, INVISIBLE_S)
    future.call = (number, started_ms)
    future.add_done_callback(_stamp)
    return future


def _stamp(future) -> None:
    future.done_ms = int(time.time() * 1000)


def _done_ms(future) -> int:
    # The done callback runs just after the waiters are woken: rarely not yet.
    return getattr(future, "done_ms", int(time.time() * 1000))


def main() -> int:
    endpoints, topic, group = sys.argv[1:4]
    count, budget_s = int(sys.argv[4]), float(sys.argv[5])
    config = ClientConfiguration(endpoints, Credentials())
    consumer = SimpleConsumer(config, group, {topic: FilterExpression()}, await_duration=AWAIT_S)
    consumer.startup()
    seen: set[str] = set()
    deadline = time.monotonic() + budget_s
    calls = itertools.count()
    try:
        receives = {_receive(consumer, next(calls)) for _ in range(RECEIVES)}
        while len(seen) < count and time.monotonic() < deadline:
            done, _ = wait(receives, timeout=1.0, return_when=FIRST_COMPLETED)
            for future in done:
                receives.discard(future)
                receives.add(_receive(consumer, next(calls)))
                for msg in _messages(future):
                    _print(msg, future)
                    seen.add(msg.message_id)
        wait(receives, timeout=AWAIT_S + 5)
    finally:
        consumer.shutdown()
    print(json.dumps({"done": len(seen)}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
