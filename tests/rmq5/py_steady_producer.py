"""Run by the tests with the official RocketMQ 5 Python client's venv (build/rmq5/pyclient):
send to TOPIC through ENDPOINTS, one message every PACE_S, until stdin ends or LIMIT sends were
tried. One JSON line per send: ``{"i", "ok": true, "message_id", "t_ms"}`` when acknowledged,
``{"i", "ok": false, "error", "t_ms"}`` when the client gave up on it (after its own retries);
then ``{"done": sends tried}``. The same lines as node_steady_producer.js. With ``RMQ5_TLS=1``:
over TLS (roots from ``GRPC_DEFAULT_SSL_ROOTS_FILE_PATH``), signed with ``RMQ5_ACCESS_KEY`` /
``RMQ5_SECRET_KEY``.

Usage: python py_steady_producer.py ENDPOINTS TOPIC PREFIX LIMIT
(this file runs in another venv: it imports nothing of raftmq.)
"""

import contextlib
import json
import os
import sys
import threading
import time

from rocketmq import ClientConfiguration, Credentials, Message, Producer

# Between two sends: a steady trickle, a few dozen a second.
PACE_S = 0.02


def emit(record: dict) -> None:
    print(json.dumps({**record, "t_ms": time.time() * 1000}), flush=True)


def main() -> int:
    endpoints, topic, prefix, limit = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    stopped = threading.Event()

    def watch_stdin() -> None:
        sys.stdin.read()  # returns at end of input
        stopped.set()

    threading.Thread(target=watch_stdin, daemon=True).start()
    tls = os.environ.get("RMQ5_TLS", "0") == "1"
    creds = Credentials()
    if tls:
        creds = Credentials(os.environ["RMQ5_ACCESS_KEY"], os.environ["RMQ5_SECRET_KEY"])
    config = ClientConfiguration(endpoints, creds)
    producer = Producer(config, (topic,), tls_enable=tls)
    producer.startup()
    emit({"started": True})
    i = 0
    try:
        while i < limit and not stopped.is_set():
            msg = Message()
            msg.topic = topic
            msg.body = f"{prefix}-body-{i}".encode()
            msg.keys = f"{prefix}-{i}"
            msg.add_property("origin", prefix)
            try:
                receipt = producer.send(msg)
                emit({"i": i, "ok": True, "message_id": receipt.message_id})
            except Exception as exc:  # the test counts the sends the client gave up on
                emit({"i": i, "ok": False, "error": str(exc)[:300]})
            i += 1
            time.sleep(PACE_S)
    finally:
        with contextlib.suppress(Exception):  # its goodbye to the killed node fails
            producer.shutdown()
    print(json.dumps({"done": i}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
