"""Run by the tests with the official RocketMQ 5 Python client's venv (build/rmq5/pyclient):
send COUNT DELAY messages to TOPIC through ENDPOINTS, message i asking for delivery
MIN_S..MAX_S seconds after it is sent (uniform, seeded by PREFIX), all sends in flight at
once. Prints one JSON line per send receipt with the delivery time asked for, then
``{"done": COUNT}``.

The client 5.1.2 puts ``delivery_timestamp`` into the protocol's Timestamp as *seconds*
(its docstring says ms), so delivery times from this client are whole seconds.

Usage: python py_timed_producer.py ENDPOINTS TOPIC COUNT PREFIX MIN_S MAX_S
(this file runs in another venv: it imports nothing of raftmq.)
"""

import json
import random
import sys
import time

from rocketmq import ClientConfiguration, Credentials, Message, Producer


def main() -> int:
    endpoints, topic, count, prefix = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    low_s, high_s = float(sys.argv[5]), float(sys.argv[6])
    rng = random.Random(prefix)
    producer = Producer(ClientConfiguration(endpoints, Credentials()), (topic,))
    producer.startup()
    try:
        pending = []
        for i in range(count):
            msg = Message()
            msg.topic = topic
            msg.body = f"{prefix}-body-{i}".encode()
            msg.tag = "timed"
            # Whole seconds, at least low_s ahead: the client drops anything finer.
            deliver_s = int(time.time() + rng.uniform(low_s, high_s)) + 1
            msg.delivery_timestamp = deliver_s
            pending.append((i, deliver_s * 1000, producer.send_async(msg)))
        for i, deliver_ms, future in pending:
            receipt = future.result(timeout=60)
            line = {"i": i, "message_id": receipt.message_id, "deliver_ms": deliver_ms}
            print(json.dumps(line), flush=True)
    finally:
        producer.shutdown()
    print(json.dumps({"done": count}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
