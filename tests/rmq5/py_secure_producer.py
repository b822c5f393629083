"""Run by the tests with the official RocketMQ 5 Python client's venv (build/rmq5/pyclient):
send COUNT messages to TOPIC through ENDPOINTS over TLS (``tls_enable=True``; the client
verifies the server's certificate against the roots gRPC reads from
``GRPC_DEFAULT_SSL_ROOTS_FILE_PATH``; ``RMQ5_TLS=0``: plaintext), signed with the AccessKey
and SecretKey of ``RMQ5_ACCESS_KEY`` and ``RMQ5_SECRET_KEY``. Prints one JSON line per
receipt and then ``{"done": COUNT}``, or, when the client raises, one line
``{"error": <exception class>, "at": "startup"|"send"}`` and exits 3.

Usage: python py_secure_producer.py ENDPOINTS TOPIC COUNT PREFIX
(this file runs in another venv: it imports nothing of raftmq.)
"""

import contextlib
import json
import os
import sys

from rocketmq import ClientConfiguration, Credentials, Message, Producer


def main() -> int:
    endpoints, topic, count, prefix = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    tls = os.environ.get("RMQ5_TLS", "1") != "0"
    creds = Credentials(os.environ["RMQ5_ACCESS_KEY"], os.environ["RMQ5_SECRET_KEY"])
    producer = Producer(ClientConfiguration(endpoints, creds), (topic,), tls_enable=tls)
    at = "startup"
    try:
        producer.startup()
        at = "send"
        for i in range(count):
            msg = Message()
            msg.topic = topic
            msg.body = f"{prefix}-body-{i}".encode()
            msg.tag = "secure"
            msg.keys = f"{prefix}-key-{i}"
            msg.add_property("origin", prefix)
            receipt = producer.send(msg)
            print(json.dumps({"i": i, "message_id": receipt.message_id}), flush=True)
    except Exception as exc:  # the test reads which refusal the client raised
        print(json.dumps({"error": type(exc).__name__, "at": at, "text": str(exc)[:300]}))
        return 3
    finally:
        # a producer whose startup failed may refuse to shut down
        with contextlib.suppress(Exception):
            producer.shutdown()
    print(json.dumps({"done": count}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
