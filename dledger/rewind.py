"""What an application's ``StateMachine.rewind(index)`` answers (docs/RAFT.md section 13).

Kept apart from the server (no gRPC here): the broker's state machine returns one. What the
node does with each is :mod:`dledger.server.rewinds`.
"""

from __future__ import annotations

import enum

from dledger.log import DLedgerError
from mqerrors import codes as E


class RewindOutcome(enum.Enum):
    """What ``StateMachine.rewind(index)`` did (None from it counts as ROLLED_BACK)."""

    # The state is at ``index`` now; the node goes on.
    ROLLED_BACK = "rolled_back"
    # It cannot roll back in place; it marked its state durably, and its next open rebuilds
    # it by applying the (repaired) log from its first entry: the node restarts.
    REPLAY_AT_START = "replay"
    # It cannot replay either (the log's first entries were deleted): the node drops its log
    # and restarts; it comes back repairing and a leader installs a snapshot.
    NEEDS_SNAPSHOT = "snapshot"


class NeedsSnapshotError(DLedgerError):
    """Raised by a state machine's ``applied_index()`` (at open) when its state on disk
    cannot be used and cannot be rebuilt from the log this member holds (retention deleted
    the entries a rebuild would need). A member of a group with another voter then takes
    a snapshot from its leader instead, by the same restart as ``NEEDS_SNAPSHOT``
    (:mod:`dledger.server.rewinds`); a member alone in its group cannot and stops."""

    code = E.START_FAILED
