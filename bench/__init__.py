"""raftmq's benchmarks (``mqbench``, ``bench.store``, ``bench.broker``, ``bench.peers``)."""

from __future__ import annotations


def tune_gc() -> None:
    """The broker's garbage-collector settings (``broker.__main__.tune_gc``) for a load
    generator process: raftmq's and the peers' load generators get the same treatment."""
    from broker.__main__ import tune_gc as broker_tune_gc

    broker_tune_gc()
