"""The v2 producer case of ``mqbench``: the official RocketMQ 5 Python client's ``Producer.send``.

Run by ``bench/__main__.py`` with the client's own venv (``build/rmq5/pyclient/bin/python``):
the client bundles its own ``apache.rocketmq.v2`` stubs, which cannot share a process with the
server's, so this file imports nothing of raftmq and is not imported by the bench.

Keeps ``IN_FLIGHT`` threads each calling the blocking ``Producer.send`` (one shared producer,
as an application would) for ``SECONDS`` after a warm-up, and prints one JSON object: messages
sent, failures and every measured send's latency in microseconds. The loop is
``bench/closedloop.py``'s, the one ``bench.loadgen`` runs for the raftmq client (standard
library only; this file's directory is first on ``sys.path``), so both clients are measured
alike.

Security from the environment, as the rmq5 tests give it: ``RMQ5_TLS`` (``1``: TLS, verifying
the server against ``GRPC_DEFAULT_SSL_ROOTS_FILE_PATH``; ``0``: plaintext) and
``RMQ5_ACCESS_KEY`` / ``RMQ5_SECRET_KEY`` (the signature; unset: unsigned).

Usage: python v2_producer.py ENDPOINTS TOPIC SIZE_BYTES IN_FLIGHT SECONDS
"""

import json
import os
import sys
from typing import TYPE_CHECKING

from rocketmq import ClientConfiguration, Credentials, Message, Producer

if TYPE_CHECKING:  # mypy sees the module in its package
    from bench.closedloop import closed_loop
else:  # run as a script: bench/ is this script's directory, first on sys.path
    from closedloop import closed_loop

# Bounds of the arguments: a typo must not start a thousand threads or an hour-long case.
MAX_IN_FLIGHT = 256
MAX_SECONDS = 600.0
MAX_SIZE_BYTES = 4 << 20  # the client's own body limit


def _producer(endpoints: str, topic: str) -> Producer:
    access_key = os.environ.get("RMQ5_ACCESS_KEY")
    secret_key = os.environ.get("RMQ5_SECRET_KEY")
    creds = Credentials(access_key, secret_key) if access_key and secret_key else Credentials()
    tls = os.environ.get("RMQ5_TLS", "1") != "0"
    return Producer(ClientConfiguration(endpoints, creds), (topic,), tls_enable=tls)


def run(
    producer: Producer, topic: str, size: int, threads: int, seconds: float
) -> dict[str, object]:
    body = os.urandom(size)

    def send() -> None:
        msg = Message()  # the client fills in the id: one message object per send
        msg.topic, msg.body = topic, body
        producer.send(msg)

    # The client raises its own classes and grpc's: every exception counts as a failure.
    return closed_loop(send, Exception, threads, seconds)


def main() -> int:
    if len(sys.argv) != 6:
        print(__doc__.strip().splitlines()[-1], file=sys.stderr)
        return 2
    endpoints, topic = sys.argv[1], sys.argv[2]
    try:
        size, in_flight, seconds = int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5])
    except ValueError:
        print(
            "v2_producer: SIZE_BYTES and IN_FLIGHT are integers, SECONDS a number", file=sys.stderr
        )
        return 2
    if not (0 < size <= MAX_SIZE_BYTES and 0 < in_flight <= MAX_IN_FLIGHT):
        print(
            f"v2_producer: size in (0, {MAX_SIZE_BYTES}], in-flight in (0, {MAX_IN_FLIGHT}]",
            file=sys.stderr,
        )
        return 2
    if not 0 < seconds <= MAX_SECONDS:
        print(f"v2_producer: seconds in (0, {MAX_SECONDS}]", file=sys.stderr)
        return 2
    producer = _producer(endpoints, topic)
    producer.startup()
    try:
        result = run(producer, topic, size, in_flight, seconds)
    finally:
        producer.shutdown()
    json.dump(result, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
