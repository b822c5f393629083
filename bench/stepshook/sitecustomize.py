"""Loaded by Python at start-up when this directory is on PYTHONPATH (``bench.steps`` puts it
there for the brokers it starts, nothing else does): arms ``raftmq_stepcount`` (beside this
file) in a node whose environment asks for it. Without ``RAFTMQ_STEPS_DIR`` it does nothing."""

import os

if os.environ.get("RAFTMQ_STEPS_DIR"):
    import raftmq_stepcount  # type: ignore[import-not-found]  # beside this file, on the path

    raftmq_stepcount.arm()
