"""Run by the tests with the official RocketMQ 5 Python client's venv (build/rmq5/pyclient): a
PushConsumer of GROUP on TOPIC through ENDPOINTS that prints one JSON line per delivery
({"event": "consumed", "message_id", "body", "group", "attempt", "t"}) until its stdin closes,
then shuts down and prints {"done": N}. MODE: "ok" (every message consumed), or "fail" (a
message whose user property "fails" is k fails its first k deliveries; "always": every one).

Usage: python py_push_consumer.py ENDPOINTS TOPIC GROUP MODE
(this file runs in another venv: it imports nothing of raftmq.)
"""

import json
import sys
import threading
import time

from rocketmq import (
    ClientConfiguration,
    ConsumeResult,
    Credentials,
    FilterExpression,
    MessageListener,
    PushConsumer,
)


class Listener(MessageListener):
    def __init__(self, mode):
        self.mode = mode
        self.lock = threading.Lock()
        self.count = 0

    def consume(self, message):
        attempt = message.delivery_attempt
        line = {
            "event": "consumed",
            "message_id": message.message_id,
            "body": message.body.decode(),
            "group": message.message_group or "",
            "attempt": attempt,
            "t": time.time(),
        }
        with self.lock:
            self.count += 1
            print(json.dumps(line), flush=True)
        fails = (message.properties or {}).get("fails", "0") if self.mode == "fail" else "0"
        if fails == "always" or (fails.isdigit() and attempt <= int(fails)):
            return ConsumeResult.FAILURE
        return ConsumeResult.SUCCESS


def main() -> int:
    endpoints, topic, group, mode = sys.argv[1:5]
    listener = Listener(mode)
    consumer = PushConsumer(
        ClientConfiguration(endpoints, Credentials()),
        group,
        listener,
        {topic: FilterExpression("*")},
    )
    consumer.startup()
    print(json.dumps({"event": "started"}), flush=True)
    try:
        sys.stdin.read()
    finally:
        consumer.shutdown()
    print(json.dumps({"done": listener.count}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
