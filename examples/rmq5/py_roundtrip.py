"""The official RocketMQ 5 Python client, unchanged, against raftmq: a ``Producer`` sends COUNT
messages to TOPIC, then a ``SimpleConsumer`` of GROUP receives them and acks each one.

Runs with the client's own venv (``build/rmq5/pyclient/bin/python``, made by ``make venv``):
the client bundles its own ``apache.rocketmq.v2`` stubs, so this file imports nothing of
raftmq. ``make demo`` runs it against its secure group (``mqcluster/demo.py``).

Security from the environment: ``RMQ5_TLS`` (``1``, the default: TLS, verifying the server
against ``GRPC_DEFAULT_SSL_ROOTS_FILE_PATH``; ``0``: plaintext) and ``RMQ5_ACCESS_KEY`` /
``RMQ5_SECRET_KEY`` (the AccessKey/SecretKey signature; unset: unsigned).

Prints one line per send, per received and per acked message, then
``roundtrip: sent N, acked N of them`` and exits 0 when every message sent was received and
acked exactly once within BUDGET_S, else 1.

Usage: python py_roundtrip.py ENDPOINT TOPIC GROUP COUNT
"""

import os
import sys
import time

from rocketmq import (
    ClientConfiguration,
    Credentials,
    FilterExpression,
    Message,
    Producer,
    SimpleConsumer,
)

TAG = "official-client"
# Long polling per receive, seconds.
AWAIT_S = 2
# A received message stays invisible this long (seconds) if its ack were lost.
INVISIBLE_S = 30
# Receives at most this many messages per call.
RECEIVE_BATCH = 16
# The whole roundtrip gives up after this long (the demo's own timeout is longer).
BUDGET_S = 40
MAX_COUNT = 1000


def _config(endpoint: str) -> tuple[ClientConfiguration, bool]:
    access_key = os.environ.get("RMQ5_ACCESS_KEY")
    secret_key = os.environ.get("RMQ5_SECRET_KEY")
    creds = Credentials(access_key, secret_key) if access_key and secret_key else Credentials()
    return ClientConfiguration(endpoint, creds), os.environ.get("RMQ5_TLS", "1") != "0"


def produce(config: ClientConfiguration, tls: bool, topic: str, count: int) -> dict[str, str]:
    """Send ``count`` messages; their message ids -> bodies."""
    producer = Producer(config, (topic,), tls_enable=tls)
    producer.startup()
    sent: dict[str, str] = {}
    try:
        for i in range(count):
            msg = Message()
            msg.topic, msg.tag, msg.keys = topic, TAG, f"roundtrip-{i}"
            msg.body = f"hello from the official Python client #{i}".encode()
            msg.add_property("origin", "rocketmq-python-client")
            receipt = producer.send(msg)
            sent[receipt.message_id] = msg.body.decode()
            print(f"  sent     {receipt.message_id}  {msg.body.decode()}", flush=True)
    finally:
        producer.shutdown()
    return sent


def consume(config: ClientConfiguration, tls: bool, topic: str, group: str, want: dict) -> int:
    """Receive and ack until every message of ``want`` was acked; the number acked (a message
    received twice, or one that was never sent, counts as a failure: -1)."""
    subscription = {topic: FilterExpression(TAG)}
    consumer = SimpleConsumer(config, group, subscription, await_duration=AWAIT_S, tls_enable=tls)
    consumer.startup()
    acked: set[str] = set()
    deadline = time.monotonic() + BUDGET_S
    try:
        while len(acked) < len(want) and time.monotonic() < deadline:
            for msg in consumer.receive(RECEIVE_BATCH, INVISIBLE_S) or []:
                body = msg.body.decode()
                print(f"  received {msg.message_id}  {body}  (attempt {msg.delivery_attempt})")
                if msg.message_id in acked or want.get(msg.message_id) != body:
                    print(f"  unexpected: {msg.message_id} again or not as sent", flush=True)
                    return -1
                consumer.ack(msg)
                acked.add(msg.message_id)
                print(f"  acked    {msg.message_id}", flush=True)
    finally:
        consumer.shutdown()
    return len(acked)


def main() -> int:
    if len(sys.argv) != 5 or not sys.argv[4].isdigit() or not 0 < int(sys.argv[4]) <= MAX_COUNT:
        print(__doc__.strip().splitlines()[-1] + f"  (0 < COUNT <= {MAX_COUNT})", file=sys.stderr)
        return 2
    endpoint, topic, group, count = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    config, tls = _config(endpoint)
    print(f"producer: {count} messages to {topic} via {endpoint} (TLS {tls})", flush=True)
    sent = produce(config, tls, topic, count)
    print(f"SimpleConsumer of {group}: receive, then ack each", flush=True)
    acked = consume(config, tls, topic, group, sent)
    print(f"roundtrip: sent {len(sent)}, acked {max(acked, 0)} of them", flush=True)
    return 0 if acked == len(sent) == count else 1


if __name__ == "__main__":
    sys.exit(main())
