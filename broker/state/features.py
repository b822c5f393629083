"""What each group feature level lets the broker propose or write (docs/RAFT.md "Feature level";
dledger's own table is dledger/features.py).

The rule (docs/ARCHITECTURE.md "Replicated records"): a new record type, a new version of a
record, or a new format of a file the broker writes is proposed or written only once the
group's committed feature level (``node.feature_level()``) is at least the level that
introduces it. Apply never looks at the level: every member of a group at level N runs a
release that decodes every record of level N (the leader sends nothing to a member that
reported less), so what a member skips as breaking a rule stays the same on every member.

Level 2 (raftmq 0.3.0) introduces one broker record: the broker config record (type 25,
:data:`BROKER_CONFIG_RECORD`, live broker.conf overrides set by ``UpdateBrokerConfig``); 0.2.0
passes over that type, so a mixed group would differ on it. Otherwise 0.3.0 proposes the
records and writes the files 0.2.0 does (the same record versions, ``snapshot.json`` version
2, whose ``config`` member only a group with an override writes, so at level 2 only; the same
ConsumeQueue and key index formats), and dledger's checkpoint format 3 is gated at level 2
too. The next broker record or file format that changes gets its row here, at the level that
introduces it.
"""

from __future__ import annotations

from mqrelease import BASELINE_LEVEL, FEATURE_LEVEL

# The highest level the broker of this release supports, and what its node reports to its
# leader and registers with the NameServers: the lower of dledger's and the broker's.
SUPPORTED_LEVEL = FEATURE_LEVEL
NODE_SUPPORTED_LEVEL = min(FEATURE_LEVEL, SUPPORTED_LEVEL)

# Record or file format -> the lowest group level at which it may be proposed or written.
BROKER_CONFIG_RECORD = "broker config record"  # ENTRY_BROKER_CONFIG (type 25)
GATES: dict[str, int] = {BROKER_CONFIG_RECORD: 2}

assert BASELINE_LEVEL <= SUPPORTED_LEVEL <= FEATURE_LEVEL
assert all(BASELINE_LEVEL < level <= SUPPORTED_LEVEL for level in GATES.values())


def allowed(what: str, group_level: int) -> bool:
    """Whether ``what`` (a key of GATES; anything else is baseline) may be proposed or
    written in a group whose committed level is ``group_level``."""
    return group_level >= GATES.get(what, BASELINE_LEVEL)
