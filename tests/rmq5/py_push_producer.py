"""Run by the tests with the official RocketMQ 5 Python client's venv (build/rmq5/pyclient):
the FIFO producer of the push-consumer tests. Prints one JSON line per send receipt ({"body",
"message_id"}), then {"done": N}.

Usage: python py_push_producer.py ENDPOINTS TOPIC fifo FIRST GROUPS PER_GROUP
         FIFO messages "g{j}-{i}" of message group "g{j}" (j from FIRST, GROUPS of them), i in
         0 .. PER_GROUP - 1, the groups interleaved
(this file runs in another venv: it imports nothing of raftmq.)
"""

import json
import sys

from rocketmq import ClientConfiguration, Credentials, Message, Producer


def messages(topic, mode, args):
    if mode == "fifo":
        first, groups, per_group = (int(a) for a in args)
        for i in range(per_group):
            for j in range(first, first + groups):
                msg = Message()
                msg.topic, msg.body, msg.message_group = topic, f"g{j}-{i}".encode(), f"g{j}"
                yield msg
    else:
        raise SystemExit(f"mode {mode!r}: only fifo")


def main() -> int:
    endpoints, topic, mode = sys.argv[1:4]
    producer = Producer(ClientConfiguration(endpoints, Credentials()), (topic,))
    producer.startup()
    count = 0
    try:
        for msg in messages(topic, mode, sys.argv[4:]):
            receipt = producer.send(msg)
            line = {"body": msg.body.decode(), "message_id": receipt.message_id}
            print(json.dumps(line), flush=True)
            count += 1
    finally:
        producer.shutdown()
    print(json.dumps({"done": count}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
