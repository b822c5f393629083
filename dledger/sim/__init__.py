"""A seeded, deterministic simulator of a DLedger Raft group (``python -m dledger.sim``).

One thread, a simulated clock, a network that delays, drops, duplicates and reorders messages
and partitions the group in every shape, disks that lose unflushed entries on a crash, and
node crashes and restarts. After every step it checks Raft's invariants; after the faults heal
it checks liveness. The same seed replays the same run bit for bit.
"""

from dledger.sim.faults import FaultEvent, generate_schedule, minimize
from dledger.sim.memlog import MemLog
from dledger.sim.runner import Summary, run_seeds
from dledger.sim.sim import DRIVER_MUTATIONS, SimParams, SimResult, Simulation, Violation, run_seed

__all__ = [
    "DRIVER_MUTATIONS",
    "FaultEvent",
    "MemLog",
    "SimParams",
    "SimResult",
    "Simulation",
    "Summary",
    "Violation",
    "generate_schedule",
    "minimize",
    "run_seed",
    "run_seeds",
]
