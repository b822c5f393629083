"""raftmq's benchmarks (``mqbench``, ``bench.store``, ``bench.broker``, ``bench.peers``)."""

from __future__ import annotations

import os
from pathlib import Path

CLK_TCK = os.sysconf("SC_CLK_TCK")


def cpu_s(pid: int | None) -> float:
    """CPU seconds (user + system, every thread) process ``pid`` has used; 0 when it is gone
    or None."""
    if pid is None:
        return 0.0
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / CLK_TCK  # utime + stime


def tune_gc() -> None:
    """The broker's garbage-collector settings (``broker.__main__.tune_gc``) for a load
    generator process: raftmq's and the peers' load generators get the same treatment."""
    from broker.__main__ import tune_gc as broker_tune_gc

    broker_tune_gc()
