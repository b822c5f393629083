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

The marker also counts those restarts (``restarts`` since ``since_s``), as the damage marker
does: a content repair needs one, and an honest group makes one rarely (a forged append, a
damaged copy that kept its CRCs), so a member that is made to restart more than
:data:`MAX_REWIND_RESTARTS` times within :data:`REWIND_RESTART_WINDOW_S` is being fed bad
copies again and again (a peer that keeps forging on an ``--insecure`` group) and stops with
``REWIND_REPEATS`` instead of restarting for ever. After the start carried the rebuild out,
the marker stays as ``how=done`` (nothing to do, the count kept) until the window passed.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import shutil
import time
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


# Restarts to rebuild the state a member may make within the window before it stops instead.
# One content repair costs one; honest groups see one after a rare fault (a forged append, a
# damaged copy whose CRCs held), and a member whose rebuilds follow each other within minutes
# is being fed bad copies by a peer that keeps forging: restarting it for ever serves the
# forger (each restart is a replay of the whole log or a snapshot, and the member is
# repairing meanwhile). Three leaves room for a second fault during a repair.
MAX_REWIND_RESTARTS = 3
REWIND_RESTART_WINDOW_S = 600.0
MAX_RESTARTS_FIELD = 1 << 20  # a count read back above this is not ours


# The rebuilds a start can carry out: the label values of the metric (a bounded set).
REBUILD_KINDS = (RewindOutcome.REPLAY_AT_START.value, RewindOutcome.NEEDS_SNAPSHOT.value)
# A marker whose rebuild the start carried out: it only keeps the restart count.
DONE = "done"


@dataclass(frozen=True, slots=True)
class RewoundMarker:
    """A rebuild the next start carries out: ``how`` one of :data:`REBUILD_KINDS` (or
    :data:`DONE`: carried out, only the count kept); the node rolled back to ``index`` on
    taking leader ``leader``'s entries; ``restarts`` such restarts since ``since_s`` (wall
    clock, seconds), this one included."""

    how: str
    index: int
    leader: str
    restarts: int = 1
    since_s: float = 0.0

    def encode(self) -> bytes:
        return (
            f"how={self.how} index={self.index} leader={self.leader or '-'} "
            f"restarts={self.restarts} since_s={int(self.since_s)}\n"
        ).encode()


def write_marker(store_dir: str | os.PathLike[str], marker: RewoundMarker) -> None:
    """Write the marker durably (temp file, fsync, rename, fsync of the directory)."""
    assert marker.how in (*REBUILD_KINDS, DONE), marker.how
    assert 1 <= marker.restarts <= MAX_RESTARTS_FIELD, marker.restarts
    atomic_write(Path(store_dir) / REWOUND_FILE, marker.encode())


def in_window(marker: RewoundMarker | None, now_s: float) -> bool:
    """Whether ``marker``'s count still runs at ``now_s`` (a clock set back restarts it)."""
    return marker is not None and 0 <= now_s - marker.since_s <= REWIND_RESTART_WINDOW_S


def next_restart(
    store_dir: str | os.PathLike[str], how: str, index: int, leader: str, now_s: float
) -> RewoundMarker:
    """The marker for one more restart to rebuild (the count starts again after a quiet
    window); the caller stops instead when its ``restarts`` exceed
    :data:`MAX_REWIND_RESTARTS`."""
    old = read_marker(store_dir)
    if old is None or not in_window(old, now_s):
        return RewoundMarker(how, index, leader, 1, now_s)
    return RewoundMarker(how, index, leader, old.restarts + 1, old.since_s)


def recent_restarts(store_dir: str | os.PathLike[str], now_s: float) -> int:
    """Restarts to rebuild within the current window (0: none, or the window passed)."""
    marker = read_marker(store_dir)
    return marker.restarts if marker is not None and in_window(marker, now_s) else 0


def carried_out(store_dir: str | os.PathLike[str], marker: RewoundMarker) -> None:
    """The start carried ``marker``'s rebuild out: keep only its count while its window
    runs, else remove it."""
    if in_window(marker, time.time()):
        write_marker(
            store_dir,
            RewoundMarker(
                DONE, marker.index, marker.leader, max(1, marker.restarts), marker.since_s
            ),
        )
    else:
        clear_marker(store_dir)


def read_marker(store_dir: str | os.PathLike[str]) -> RewoundMarker | None:
    """The marker of the store at ``store_dir``; None when there is none. One that does not
    parse is read as a replay (it drops nothing) counted as the first restart now, and
    logged. One written before the count (no ``restarts``) counts as the first, now."""
    path = Path(store_dir) / REWOUND_FILE
    now = time.time()
    try:
        fields = read_marker_fields(path, MAX_MARKER_BYTES)
        if fields is None:
            return None
        marker = RewoundMarker(
            fields["how"],
            int(fields["index"]),
            fields["leader"],
            int(fields.get("restarts", "1")),
            float(fields.get("since_s", now)),
        )
        if (
            marker.how not in (*REBUILD_KINDS, DONE)
            or not 0 <= marker.index <= MAX_INDEX
            or not 1 <= marker.restarts <= MAX_RESTARTS_FIELD
            or not math.isfinite(marker.since_s)
        ):
            raise ValueError(f"how={marker.how} index={marker.index} restarts={marker.restarts}")
        return marker
    except (ValueError, KeyError, UnicodeDecodeError) as exc:
        logger.warning("rewind marker %s unreadable (%s): the log is kept", path, exc)
        return RewoundMarker(RewindOutcome.REPLAY_AT_START.value, 0, "-", 1, now)


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
