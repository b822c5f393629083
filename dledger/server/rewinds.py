"""A content repair the application cannot roll back in place (docs/RAFT.md section 13).

A member whose committed copy of entries differed by content from its leader's (a forged
append, damage that kept the records valid) cuts them and takes the leader's; the node then
asks its state machine to roll back to the cut (``StateMachine.rewind``). A state machine
that can undo what the replaced entries did answers ``ROLLED_BACK``
(:class:`dledger.rewind.RewindOutcome`). One that cannot (the broker, once the entries
stored messages) does not end the process for a person to restore it: it says how its state
can be rebuilt, and the node restarts itself in place (same PID, as for damage) to do it:

* ``REPLAY_AT_START``: the application marked its state durably as invalid and rebuilds it
  at its next open by applying the (now repaired) log from its first entry;
* ``NEEDS_SNAPSHOT``: it cannot replay (retention deleted the log's first entries, and what
  they made would be lost): the node drops its log at the next start and keeps its promise
  file, so it comes back *repairing* (it neither votes nor counts toward a commit) and the
  leader installs a snapshot.

Either is decided only while the node holds the leader's copy of the entries it replaced
(the Ready that carries ``rewind_to`` follows an append of the current leader, which holds
every committed entry): the node never drops the only good copy.

The marker :data:`REWOUND_FILE` in the store directory (one short line of ``key=value``
words) carries the decision over the restart: it counts the rebuild at the next start
(``raftmq_corruption_state_rebuilds_total``) and, for a snapshot, asks that start to drop the
log before the store opens; it is removed once that is done. A marker that does not parse
drops nothing (the safe reading: a replay marker costs nothing, a wrong drop costs a copy).
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from dledger.rewind import RewindOutcome
from dledger.storage.files import atomic_write, fsync_dir, read_marker_fields
from dledger.storage.install import CHECKPOINT_FILE, DATA_DIR, INDEX_DIR

logger = logging.getLogger(__name__)

REWOUND_FILE = "rewound"
# The marker is one line of a few words (a member id is at most 64 characters); anything
# longer is not ours.
MAX_MARKER_BYTES = 256
MAX_INDEX = (1 << 63) - 1


# The rebuilds a start can carry out: the label values of the metric (a bounded set).
REBUILD_KINDS = (RewindOutcome.REPLAY_AT_START.value, RewindOutcome.NEEDS_SNAPSHOT.value)


@dataclass(frozen=True, slots=True)
class RewoundMarker:
    """A rebuild the next start carries out: ``how`` one of :data:`REBUILD_KINDS`; the node
    rolled back to ``index`` on taking leader ``leader``'s entries."""

    how: str
    index: int
    leader: str

    def encode(self) -> bytes:
        return f"how={self.how} index={self.index} leader={self.leader or '-'}\n".encode()


def write_marker(store_dir: str | os.PathLike[str], marker: RewoundMarker) -> None:
    """Write the marker durably (temp file, fsync, rename, fsync of the directory)."""
    assert marker.how in REBUILD_KINDS, marker.how
    atomic_write(Path(store_dir) / REWOUND_FILE, marker.encode())


def read_marker(store_dir: str | os.PathLike[str]) -> RewoundMarker | None:
    """The marker of the store at ``store_dir``; None when there is none. One that does not
    parse is read as a replay (it drops nothing) and logged."""
    path = Path(store_dir) / REWOUND_FILE
    try:
        fields = read_marker_fields(path, MAX_MARKER_BYTES)
        if fields is None:
            return None
        marker = RewoundMarker(fields["how"], int(fields["index"]), fields["leader"])
        if marker.how not in REBUILD_KINDS or not 0 <= marker.index <= MAX_INDEX:
            raise ValueError(f"how={marker.how} index={marker.index}")
        return marker
    except (ValueError, KeyError, UnicodeDecodeError) as exc:
        logger.warning("rewind marker %s unreadable (%s): the log is kept", path, exc)
        return RewoundMarker(RewindOutcome.REPLAY_AT_START.value, 0, "-")


def drop_log(store_dir: str | os.PathLike[str]) -> None:
    """Delete the store's entries (data segments, index segments, checkpoint) and keep the
    rest: the hard state (``meta``), the saved configuration, the reserve. The store opens
    empty afterwards; the promise file, beside the store, is not touched. Idempotent (a crash
    part way: the next start does it again, the marker is removed last)."""
    root = Path(store_dir)
    for name in (DATA_DIR, INDEX_DIR):
        shutil.rmtree(root / name, ignore_errors=True)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(root / CHECKPOINT_FILE)
    fsync_dir(root)


def clear_marker(store_dir: str | os.PathLike[str]) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(Path(store_dir) / REWOUND_FILE)
    fsync_dir(Path(store_dir))
