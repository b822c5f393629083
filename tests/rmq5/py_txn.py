"""Run by the tests with the official RocketMQ 5 Python client's venv (build/rmq5/pyclient): a
transactional producer of TOPIC through ENDPOINTS. Its checker (the application's local
transaction state) answers a check-back with ROLLBACK for a message whose body ends in
"-rollback", COMMIT for any other, printing {"event": "checked", ...}. Prints one JSON line
per step, then {"done": ...}.

Usage: python py_txn.py ENDPOINTS TOPIC PREFIX MODE
  MODE all:      commit one half, roll back one, leave one open for the check-back; then wait
                 until stdin is closed (the test saw the check-back's commit)
  MODE failover: send one half, print it, wait for a line on stdin, then commit it (retried
                 until the group answers OK, as an application would after a failover)
(this file runs in another venv: it imports nothing of raftmq.)
"""

import json
import sys
import time

from rocketmq import (
    ClientConfiguration,
    Credentials,
    Message,
    Producer,
    TransactionChecker,
    TransactionResolution,
)

# How long the failover mode keeps retrying its commit, s.
COMMIT_BUDGET_S = 30


def emit(record):
    print(json.dumps(record), flush=True)


class Checker(TransactionChecker):
    def check(self, message):
        body = message.body.decode()
        emit({"event": "checked", "message_id": message.message_id, "body": body})
        if body.endswith("-rollback"):
            return TransactionResolution.ROLLBACK
        return TransactionResolution.COMMIT


def half(producer, topic, body):
    tx = producer.begin_transaction()
    msg = Message()
    msg.topic, msg.body, msg.tag = topic, body.encode(), "tx"
    msg.add_property("kind", body.rsplit("-", 1)[-1])
    receipt = producer.send(msg, tx)
    emit(
        {
            "event": "sent",
            "body": body,
            "message_id": receipt.message_id,
            "transaction_id": receipt.transaction_id,
        }
    )
    return tx


def run_all(producer, topic, prefix):
    half(producer, topic, f"{prefix}-commit").commit()
    emit({"event": "ended", "body": f"{prefix}-commit"})
    half(producer, topic, f"{prefix}-rollback").rollback()
    emit({"event": "ended", "body": f"{prefix}-rollback"})
    half(producer, topic, f"{prefix}-check-commit")
    sys.stdin.read()  # until the test closes it


def run_failover(producer, topic, prefix):
    tx = half(producer, topic, f"{prefix}-failover")
    sys.stdin.readline()
    deadline = time.monotonic() + COMMIT_BUDGET_S
    attempts = 0
    while True:
        attempts += 1
        try:
            tx.commit()
            break
        except Exception as exc:  # the group is electing: the commit is idempotent, retry
            if time.monotonic() > deadline:
                raise
            emit({"event": "commit_failed", "error": str(exc)[:200]})
            time.sleep(0.5)
    emit({"event": "ended", "body": f"{prefix}-failover", "attempts": attempts})


def main():
    endpoints, topic, prefix, mode = sys.argv[1:5]
    producer = Producer(ClientConfiguration(endpoints, Credentials()), (topic,), Checker())
    producer.startup()
    try:
        (run_all if mode == "all" else run_failover)(producer, topic, prefix)
    finally:
        producer.shutdown()
    emit({"done": mode})
    return 0


if __name__ == "__main__":
    sys.exit(main())
