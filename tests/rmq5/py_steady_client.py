"""Run by the tests with the official RocketMQ 5 Python client's venv (build/rmq5/pyclient): a
Producer and a consumer of GROUP side by side, both entering by ENDPOINTS. The producer sends
to TOPIC one message every PACE_S; the consumer (CONSUMER ``simple``: a SimpleConsumer that
receives with INVISIBLE_S and acks each message as it comes; ``push``: a PushConsumer whose
listener consumes each one) takes them. The producer stops at the first line on stdin (or after
LIMIT sends) and prints ``{"event": "producer_done", "tried": sends tried}``; the consumer at
the end of stdin. One JSON line per event, each with ``t_ms`` (wall clock, ms):

- ``{"event": "sent", "i", "ok": true, "message_id"}`` or ``{"event": "sent", "i", "ok": false,
  "error"}`` (the client gave up on that send after its own retries);
- ``{"event": "received", "message_id", "origin"}`` per delivered message,
  ``{"event": "acked" | "ack_failed", "message_id"}`` per ack,
  ``{"event": "receive_failed", "error"}`` per failed receive (those of a SimpleConsumer);

then ``{"done": sends tried}``. The same lines as node_steady_client.js. With ``RMQ5_TLS=1``:
over TLS (roots from ``GRPC_DEFAULT_SSL_ROOTS_FILE_PATH``), signed with ``RMQ5_ACCESS_KEY`` /
``RMQ5_SECRET_KEY``.

Usage: python py_steady_client.py ENDPOINTS TOPIC GROUP PREFIX LIMIT INVISIBLE_S CONSUMER
(this file runs in another venv: it imports nothing of raftmq.)
"""

import contextlib
import json
import os
import sys
import threading
import time

from rocketmq import (
    ClientConfiguration,
    ConsumeResult,
    Credentials,
    FilterExpression,
    Message,
    MessageListener,
    Producer,
    PushConsumer,
    SimpleConsumer,
)

# Between two sends: a steady trickle, a few dozen a second.
PACE_S = 0.02
# Long polling per receive, s: short, so a receive parked at a node that dies costs little.
AWAIT_S = 1
# Most messages per receive; and the pause after a failed receive (no hot loop while every
# node refuses, e.g. during an election).
BATCH = 16
RECEIVE_RETRY_S = 0.05
# The longest wait for the clients' shutdown before the script exits without it.
SHUTDOWN_S = 5.0

_print_lock = threading.Lock()


def emit(record: dict) -> None:
    with _print_lock:
        print(json.dumps({**record, "t_ms": time.time() * 1000}), flush=True)


def produce(producer, topic: str, prefix: str, limit: int, stopped: threading.Event) -> int:
    """Send until ``stopped`` or ``limit`` sends; the number tried."""
    i = 0
    while i < limit and not stopped.is_set():
        msg = Message()
        msg.topic = topic
        msg.body = f"{prefix}-body-{i}".encode()
        msg.keys = f"{prefix}-{i}"
        msg.add_property("origin", prefix)
        try:
            receipt = producer.send(msg)
            emit({"event": "sent", "i": i, "ok": True, "message_id": receipt.message_id})
        except Exception as exc:  # the test counts the sends the client gave up on
            emit({"event": "sent", "i": i, "ok": False, "error": str(exc)[:300]})
        i += 1
        time.sleep(PACE_S)
    return i


def consume(consumer, invisible_s: int, stopped: threading.Event) -> None:
    while not stopped.is_set():
        try:
            messages = consumer.receive(BATCH, invisible_s) or []
        except Exception as exc:  # the test reads how long receives failed
            emit({"event": "receive_failed", "error": str(exc)[:300]})
            stopped.wait(RECEIVE_RETRY_S)
            continue
        for msg in messages:
            origin = dict(msg.properties).get("origin", "")
            emit({"event": "received", "message_id": msg.message_id, "origin": origin})
            try:
                consumer.ack(msg)
                emit({"event": "acked", "message_id": msg.message_id})
            except Exception as exc:  # its redelivery comes after the invisible time
                emit({"event": "ack_failed", "message_id": msg.message_id, "error": str(exc)[:300]})


class Listener(MessageListener):
    """A push consumer's listener: each delivery printed and consumed."""

    def consume(self, message):
        origin = dict(message.properties or {}).get("origin", "")
        emit({"event": "received", "message_id": message.message_id, "origin": origin})
        return ConsumeResult.SUCCESS


def main() -> int:
    endpoints, topic, group, prefix = sys.argv[1:5]
    limit, invisible_s, kind = int(sys.argv[5]), int(sys.argv[6]), sys.argv[7]
    stopped = threading.Event()
    tls = os.environ.get("RMQ5_TLS", "0") == "1"
    creds = Credentials()
    if tls:
        creds = Credentials(os.environ["RMQ5_ACCESS_KEY"], os.environ["RMQ5_SECRET_KEY"])
    producer = Producer(ClientConfiguration(endpoints, creds), (topic,), tls_enable=tls)
    config, subscription = ClientConfiguration(endpoints, creds), {topic: FilterExpression()}
    if kind == "push":
        consumer = PushConsumer(config, group, Listener(), subscription, tls_enable=tls)
    else:
        consumer = SimpleConsumer(config, group, subscription, AWAIT_S, tls_enable=tls)
    producer.startup()
    consumer.startup()
    emit({"event": "started"})
    receiver = threading.Thread(target=consume, args=(consumer, invisible_s, stopped), daemon=True)
    if kind != "push":
        receiver.start()
    sending_stopped = threading.Event()

    def watch_stdin() -> None:
        sys.stdin.readline()  # a line, or the end of input
        sending_stopped.set()
        sys.stdin.read()
        stopped.set()
        sending_stopped.set()

    threading.Thread(target=watch_stdin, daemon=True).start()
    tried = 0
    try:
        tried = produce(producer, topic, prefix, limit, sending_stopped)
        emit({"event": "producer_done", "tried": tried})
        stopped.wait()
        if receiver.is_alive():
            receiver.join()
    finally:
        shutdown(producer, consumer)
    print(json.dumps({"done": tried}), flush=True)
    # A push consumer's own threads may still wait on the killed node: do not wait for them.
    os._exit(0)


def shutdown(*clients) -> None:
    """Shut the clients down, giving up after SHUTDOWN_S (a push consumer's shutdown waited
    on the killed node's receive loops for longer than the test's budget)."""

    def close() -> None:
        for client in clients:
            with contextlib.suppress(Exception):  # its goodbye to the killed node fails
                client.shutdown()

    closer = threading.Thread(target=close, daemon=True)
    closer.start()
    closer.join(SHUTDOWN_S)
    if closer.is_alive():
        print("py_steady_client: shutdown not done, exiting anyway", file=sys.stderr, flush=True)


if __name__ == "__main__":
    sys.exit(main())
