"""The client host of tests/integration/test_multihost_netns.py: run inside its own network
namespace, it reaches the cluster only through the NameServers' routes, over TLS, as the
admin user (RAFTMQ_TLS_CA, RAFTMQ_CREDENTIALS).

    python multihost_client.py produce NAMESRV TOPIC OUT STOP_FILE
        send until STOP_FILE exists (at most MAX_SENDS, MAX_RUN_S); one line per
        acknowledged send, "<msg id> <group>", flushed before the next send
    python multihost_client.py consume NAMESRV TOPIC OUT
        every message of every readable queue: one msg id a line
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from client import Message, MQClientError, Producer, PullConsumer
from mqsecurity.channels import ClientSecurity
from mqsecurity.credentials import load_credentials
from mqsecurity.tls import TlsFiles

MAX_SENDS = 200_000
MAX_RUN_S = 600.0
# Routes asked again this often (RocketMQ's pollNameServerInterval, 30 s by default), so a
# group added meanwhile is used within it.
POLL_NAME_SERVER_S = 0.5
MAX_PULLS = 100_000


def _security() -> ClientSecurity:
    return ClientSecurity(
        tls=TlsFiles(None, None, os.environ["RAFTMQ_TLS_CA"]),
        credentials=load_credentials(os.environ["RAFTMQ_CREDENTIALS"]),
    )


def produce(namesrv: str, topic: str, out: Path, stop: Path) -> None:
    deadline = time.monotonic() + MAX_RUN_S
    with (
        Producer(
            "hosts-p",
            namesrv,
            security=_security(),
            poll_name_server_interval_s=POLL_NAME_SERVER_S,
        ) as producer,
        out.open("w") as f,
    ):
        for i in range(MAX_SENDS):
            if stop.exists() or time.monotonic() > deadline:
                return
            try:
                r = producer.send(Message(topic, f"m{i}".encode()))
            except MQClientError as exc:  # not acknowledged: not counted
                print(f"send {i}: {exc}", file=sys.stderr, flush=True)
                continue
            f.write(f"{r.msg_id} {r.message_queue.broker_name}\n")
            f.flush()


def consume(namesrv: str, topic: str, out: Path) -> None:
    ids: list[str] = []
    with PullConsumer("hosts-c", namesrv, security=_security()) as reader:
        for mq in reader.fetch_queues(topic):
            offset = 0
            for _ in range(MAX_PULLS):
                r = reader.pull(mq, offset, max_nums=256)
                if not r.messages:
                    break
                ids.extend(m.msg_id for m in r.messages)
                offset = r.next_begin_offset
    out.write_text("".join(f"{i}\n" for i in ids))


if __name__ == "__main__":
    if sys.argv[1] == "produce":
        produce(sys.argv[2], sys.argv[3], Path(sys.argv[4]), Path(sys.argv[5]))
    else:
        consume(sys.argv[2], sys.argv[3], Path(sys.argv[4]))
