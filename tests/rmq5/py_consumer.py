"""Run by the tests with the official RocketMQ 5 Python client's venv (build/rmq5/pyclient): a
SimpleConsumer of GROUP on TOPIC through ENDPOINTS. Prints one JSON line per received message
(``{"event": "received", ...}``) and per ack (``{"event": "acked", ...}``), then
``{"done": COUNT}``.

Usage: python py_consumer.py ENDPOINTS TOPIC GROUP MODE INVISIBLE_S COUNT

MODE ``all``: receive and ack until COUNT distinct messages were acked, then receive on for a
few long polls to show that nothing comes again.
MODE ``hold``: receive COUNT messages without acking, print ``{"event": "held"}`` and wait for a
line on stdin; ack the messages whose index in the held list is even, then receive (acking
each) until every odd one came again; then receive on for a few long polls.
MODE ``never``: receive (never acking) until stdin closes; every delivery is printed.
(This file runs in another venv: it imports nothing of raftmq.)
"""

import json
import sys
import threading
import time

from rocketmq import ClientConfiguration, Credentials, FilterExpression, SimpleConsumer

# Long polling per receive, s: short, so that the quiet rounds at the end take little time.
AWAIT_S = 2
# Receives after the last expected message that must bring nothing acknowledged again.
QUIET_ROUNDS = 1
# Give up after this long (the test's own timeout is longer).
BUDGET_S = 50


def _line(event: str, msg, **extra) -> None:
    record = {
        "event": event,
        "message_id": msg.message_id,
        "body": msg.body.decode(),
        "tag": msg.tag,
        "keys": sorted(msg.keys),
        "properties": dict(msg.properties),
        "attempt": msg.delivery_attempt,
        # The client's own body check (MD5 digest, upper-case hex): True if it failed.
        "corrupted": msg.corrupted,
        "t": round(time.monotonic(), 3),
        **extra,
    }
    print(json.dumps(record), flush=True)


def _receive(consumer, invisible_s: int) -> list:
    """One receive; each message printed, with ``asked``: when the receive was made (the
    message's invisible time runs from a moment after it)."""
    asked = round(time.monotonic(), 3)
    messages = consumer.receive(32, invisible_s) or []
    for msg in messages:
        _line("received", msg, asked=asked)
    return messages


def _ack(consumer, msg) -> None:
    try:
        consumer.ack(msg)
        _line("acked", msg)
    except Exception as exc:  # the test reads the failure from the line
        _line("ack_failed", msg, error=str(exc)[:300])


def consume_all(consumer, invisible_s: int, count: int) -> None:
    acked: set[str] = set()
    deadline = time.monotonic() + BUDGET_S
    while len(acked) < count and time.monotonic() < deadline:
        for msg in _receive(consumer, invisible_s):
            _ack(consumer, msg)
            acked.add(msg.message_id)
    quiet(consumer, invisible_s, ack=True)


def quiet(consumer, invisible_s: int, ack: bool) -> None:
    for _ in range(QUIET_ROUNDS):
        for msg in _receive(consumer, invisible_s):
            if ack:
                _ack(consumer, msg)


def hold(consumer, invisible_s: int, count: int) -> None:
    held: list = []
    deadline = time.monotonic() + BUDGET_S
    while len(held) < count and time.monotonic() < deadline:
        held.extend(_receive(consumer, invisible_s))
    print(json.dumps({"event": "held", "count": len(held)}), flush=True)
    sys.stdin.readline()
    for i, msg in enumerate(held):
        if i % 2 == 0:
            _ack(consumer, msg)
    waiting = {m.message_id for i, m in enumerate(held) if i % 2}
    while waiting and time.monotonic() < deadline:
        for msg in _receive(consumer, invisible_s):
            _ack(consumer, msg)
            waiting.discard(msg.message_id)
    quiet(consumer, invisible_s, ack=True)


def never(consumer, invisible_s: int) -> None:
    closed = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.read(), closed.set()), daemon=True).start()
    deadline = time.monotonic() + BUDGET_S
    while not closed.is_set() and time.monotonic() < deadline:
        _receive(consumer, invisible_s)  # every delivery printed, none acked


def main() -> int:
    endpoints, topic, group, mode = sys.argv[1:5]
    invisible_s, count = int(sys.argv[5]), int(sys.argv[6])
    config = ClientConfiguration(endpoints, Credentials())
    consumer = SimpleConsumer(config, group, {topic: FilterExpression()}, await_duration=AWAIT_S)
    consumer.startup()
    try:
        if mode == "all":
            consume_all(consumer, invisible_s, count)
        elif mode == "hold":
            hold(consumer, invisible_s, count)
        else:
            never(consumer, invisible_s)
    finally:
        consumer.shutdown()
    print(json.dumps({"done": count}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
