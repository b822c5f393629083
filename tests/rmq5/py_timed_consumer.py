"""Run by the tests with the official RocketMQ 5 Python client's venv (build/rmq5/pyclient): a
SimpleConsumer of GROUP on TOPIC through ENDPOINTS that receives and acks until COUNT distinct
messages were received (or BUDGET_S passed). Prints one JSON line per received message with the
wall-clock time it arrived (``received_ms``) and the delivery time it carries, then
``{"done": COUNT}``.

Usage: python py_timed_consumer.py ENDPOINTS TOPIC GROUP COUNT BUDGET_S
(this file runs in another venv: it imports nothing of raftmq.)
"""

import json
import sys
import time

from rocketmq import ClientConfiguration, Credentials, FilterExpression, SimpleConsumer

# Long polling per receive, s (a receive returns as soon as a message is visible).
AWAIT_S = 2
INVISIBLE_S = 60
ACK_ATTEMPTS = 10


def _ack(consumer, msg) -> None:
    """Ack, retried a few times across a failover (the receipt handle stays valid)."""
    for _ in range(ACK_ATTEMPTS):
        try:
            consumer.ack(msg)
            return
        except Exception as exc:
            error = str(exc)[:200]
            time.sleep(0.2)
    print(json.dumps({"event": "ack_failed", "error": error}), flush=True)


def main() -> int:
    endpoints, topic, group = sys.argv[1:4]
    count, budget_s = int(sys.argv[4]), float(sys.argv[5])
    config = ClientConfiguration(endpoints, Credentials())
    consumer = SimpleConsumer(config, group, {topic: FilterExpression()}, await_duration=AWAIT_S)
    consumer.startup()
    seen: set[str] = set()
    deadline = time.monotonic() + budget_s
    try:
        while len(seen) < count and time.monotonic() < deadline:
            try:
                messages = consumer.receive(32, INVISIBLE_S) or []
            except Exception as exc:  # a failover: the next receive goes on
                print(json.dumps({"event": "receive_failed", "error": str(exc)[:200]}), flush=True)
                time.sleep(0.05)
                continue
            received_ms = int(time.time() * 1000)
            for msg in messages:
                line = {
                    "event": "received",
                    "message_id": msg.message_id,
                    "received_ms": received_ms,
                    "deliver_ms": msg.delivery_timestamp,
                    "body": msg.body.decode(),
                    "properties": dict(msg.properties),
                }
                print(json.dumps(line), flush=True)
                seen.add(msg.message_id)
                _ack(consumer, msg)
    finally:
        consumer.shutdown()
    print(json.dumps({"done": len(seen)}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
