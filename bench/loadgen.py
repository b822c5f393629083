"""One load-generator process for ``mqbench`` (``python -m bench.loadgen``).

Runs ``--threads`` closed-loop senders through the real client (``client.Producer``: routes from
the NameServer, coalescing of in-flight sends, retries) for ``--seconds`` after a warm-up, and
prints one JSON object: messages sent, failures, and every send's latency in microseconds (the
harness merges several processes before taking percentiles).

    python -m bench.loadgen --namesrv 127.0.0.1:9876 --topic T --size 1024 --threads 128
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time

from client import Message, MQClientError, Producer

# Sends before the measured window starts (routes fetched, channels and threads warm).
WARMUP_S = 0.5
# At most this many latency samples per thread are kept (bounds memory and the JSON output).
MAX_SAMPLES_PER_THREAD = 200_000


def run(namesrv: str, topic: str, size: int, threads: int, seconds: float) -> dict[str, object]:
    body = os.urandom(size)
    start_at = time.monotonic() + WARMUP_S
    stop_at = start_at + seconds
    sent = [0] * threads
    failed = [0] * threads
    lat_us: list[list[int]] = [[] for _ in range(threads)]
    with Producer(f"bench-{os.getpid()}", namesrv) as producer:

        def sender(i: int) -> None:
            mine = lat_us[i]
            while True:
                t0 = time.monotonic()
                if t0 >= stop_at:
                    return
                try:
                    producer.send(Message(topic, body))
                except MQClientError:
                    if t0 >= start_at:
                        failed[i] += 1
                    continue
                if t0 >= start_at:
                    sent[i] += 1
                    if len(mine) < MAX_SAMPLES_PER_THREAD:
                        mine.append(int((time.monotonic() - t0) * 1e6))

        workers = [threading.Thread(target=sender, args=(i,), daemon=True) for i in range(threads)]
        for w in workers:
            w.start()
        for w in workers:
            w.join(seconds + WARMUP_S + 30)
    return {
        "sent": sum(sent),
        "failed": sum(failed),
        "seconds": seconds,
        "latencies_us": [x for xs in lat_us for x in xs],
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.loadgen", description=__doc__)
    p.add_argument("--namesrv", required=True)
    p.add_argument("--topic", required=True)
    p.add_argument("--size", type=int, default=1024)
    p.add_argument("--threads", type=int, default=16)
    p.add_argument("--seconds", type=float, default=3.0)
    a = p.parse_args(argv)
    if a.size <= 0 or a.threads <= 0 or a.seconds <= 0:
        print("loadgen: --size, --threads and --seconds must be > 0", file=sys.stderr)
        return 2
    json.dump(run(a.namesrv, a.topic, a.size, a.threads, a.seconds), sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
