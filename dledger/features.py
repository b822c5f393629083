"""What each group feature level lets dledger write (docs/RAFT.md "Feature level").

The level is one integer per group, carried in its CONFIG entries (``ConfState.features``),
raised by an operator once every member reported supporting it, never lowered. Below the
level that introduces a format, no member writes it: a member of the previous release can
read everything the group holds until the raise, so a node can still be rolled back. Each
gate is the lowest level at which its format may be written; the broker has its own table
(broker/state/features.py). Nothing else in dledger/ depends on the level.
"""

from __future__ import annotations

from mqrelease import BASELINE_LEVEL, FEATURE_LEVEL

# Level 2: the store's checkpoint is written in format 3, which carries the level. raftmq
# 0.2.0 reads checkpoint formats 1 and 2 only, so it refuses to open the store of a member
# of a raised group ("format version 3 is newer than 2"): the rollback guard.
CHECKPOINT_V3_LEVEL = 2

# Every gate with the format it opens, for the docs and the checks below.
GATES: dict[str, int] = {
    "checkpoint format 3 (carries the feature level)": CHECKPOINT_V3_LEVEL,
}

assert all(BASELINE_LEVEL < level <= FEATURE_LEVEL for level in GATES.values())
