"""Closed-loop senders, timed: the one measuring loop of ``bench.loadgen`` (the raftmq client)
and ``bench/v2_producer.py`` (the official RocketMQ 5 Python client, run in that client's own
venv). Standard library only, so that both can import it."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

# Sends before the measured window starts (routes fetched, channels and threads warm).
WARMUP_S = 0.5
# At most this many latency samples per thread are kept (bounds memory and the JSON output).
MAX_SAMPLES_PER_THREAD = 200_000
# The joins wait the case plus this (a send's own timeout and retries are shorter).
JOIN_GRACE_S = 30.0


def closed_loop(
    send: Callable[[], object],
    failure: type[BaseException] | tuple[type[BaseException], ...],
    threads: int,
    seconds: float,
    start_at: float | None = None,
) -> dict[str, object]:
    """``threads`` threads each calling ``send()`` back to back for ``seconds`` after
    `WARMUP_S` (or from ``start_at``, a ``time.monotonic()`` instant, the sends before it a
    warm-up); a send raising ``failure`` counts as failed. Messages sent, failures and every
    measured send's latency in microseconds (the harness takes the percentiles)."""
    start_at = time.monotonic() + WARMUP_S if start_at is None else start_at
    stop_at = start_at + seconds
    sent = [0] * threads
    failed = [0] * threads
    lat_us: list[list[int]] = [[] for _ in range(threads)]

    def sender(i: int) -> None:
        mine = lat_us[i]
        while True:
            t0 = time.monotonic()
            if t0 >= stop_at:
                return
            try:
                send()
            except failure:
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
        w.join(max(0.0, stop_at - time.monotonic()) + JOIN_GRACE_S)
    return {
        "sent": sum(sent),
        "failed": sum(failed),
        "seconds": seconds,
        "latencies_us": [x for xs in lat_us for x in xs],
    }
