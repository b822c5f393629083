"""Run by the tests with the official RocketMQ 5 Python client's venv (build/rmq5/pyclient):
send COUNT messages to TOPIC through ENDPOINTS, each with a tag, two keys and two user
properties, and print one JSON line per send receipt, then one line ``{"done": COUNT}``.
With MESSAGE_GROUP, FIFO messages of that message group, in send order.

Usage: python py_producer.py ENDPOINTS TOPIC COUNT PREFIX [MESSAGE_GROUP]
(this file runs in another venv: it imports nothing of raftmq.)
"""

import json
import sys

from rocketmq import ClientConfiguration, Credentials, Message, Producer


def main() -> int:
    endpoints, topic, count, prefix = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    message_group = sys.argv[5] if len(sys.argv) > 5 else ""
    config = ClientConfiguration(endpoints, Credentials())
    producer = Producer(config, (topic,))
    producer.startup()
    try:
        for i in range(count):
            msg = Message()
            msg.topic = topic
            msg.body = f"{prefix}-body-{i}".encode()
            msg.tag = f"tag{i % 3}"
            msg.keys = f"{prefix}-key-{i}"
            msg.keys = f"{prefix}-k2-{i}"
            msg.add_property("seq", str(i))
            msg.add_property("origin", prefix)
            if message_group:
                msg.message_group = message_group
            receipt = producer.send(msg)
            line = {"i": i, "message_id": receipt.message_id, "offset": receipt.offset}
            print(json.dumps(line), flush=True)
    finally:
        producer.shutdown()
    print(json.dumps({"done": count}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
