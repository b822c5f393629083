"""Damage in a store's log: what was found, and the marker that asks the next open to check
every segment (docs/STORAGE.md, "Recovery on open" and "Damage and repair").

A *torn tail* is the end of the log cut by a crash: bytes beyond what the checkpoint says is
durable, with nothing valid after them. *Damage* is a record that fails a check inside what
was durable (below the checkpoint's flushed position, or with a valid entry after it): the
disk changed or lost bytes it had acknowledged. The store never serves or keeps a damaged
entry: it truncates its log at the first damaged entry and reports it (:class:`DamageReport`),
and the node fetches everything after from its leader.

The marker (:data:`DAMAGE_FILE`, one short line of ``key=value`` words) is written when damage
is found while the node runs (a read or the scrubber): the node then restarts, and the next
open checks every segment, not just the last, so it finds and cuts the damage. It also counts
those restarts, so that a disk that keeps returning bad bytes stops the node instead of
restarting it for ever (:data:`MAX_DAMAGE_RESTARTS` in :data:`DAMAGE_RESTART_WINDOW_S`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path

from dledger.storage.files import atomic_write, read_marker_fields

log = logging.getLogger(__name__)

DAMAGE_FILE = "damaged"
# Restarts for damage a node may make within the window before it stops instead: each one
# cuts the damage it found, so more than a few in minutes means the disk keeps failing.
MAX_DAMAGE_RESTARTS = 5
DAMAGE_RESTART_WINDOW_S = 600.0
# The marker is one line of a few words; anything longer is not ours (read as "verify").
MAX_MARKER_BYTES = 256


@dataclass(frozen=True, slots=True)
class DamageReport:
    """Damage a store found and cut: entries ``first_index..last_index`` are gone from this
    replica (``last_index``: the highest index it held durably before, as far as the
    checkpoint and the index records tell). ``path``/``offset``: the first bad record."""

    path: str
    offset: int
    first_index: int
    last_index: int
    reason: str
    found_by: str  # "open" (recovery) or what found it at run time ("scrub", "read", ...)

    @property
    def entries_lost(self) -> int:
        return max(0, self.last_index - self.first_index + 1)

    def describe(self) -> str:
        return (
            f"path={self.path} offset={self.offset} indexes={self.first_index}.."
            f"{self.last_index} found_by={self.found_by} reason={self.reason}"
        )


@dataclass(frozen=True, slots=True)
class DamageMarker:
    """The marker's content: ``verify`` asks the next open to check every segment;
    ``restarts`` damage restarts since ``since_s`` (wall clock, seconds)."""

    verify: bool
    restarts: int
    since_s: float

    def encode(self) -> bytes:
        return (
            f"verify={int(self.verify)} restarts={self.restarts} since_s={int(self.since_s)}\n"
        ).encode()


def read_marker(root: Path) -> DamageMarker | None:
    """The marker of the store at ``root``; None when there is none. A marker that does not
    parse is read as "verify" (the safe reading: a full check costs time, never data)."""
    path = root / DAMAGE_FILE
    try:
        fields = read_marker_fields(path, MAX_MARKER_BYTES)
        if fields is None:
            return None
        marker = DamageMarker(
            verify=fields["verify"] == "1",
            restarts=int(fields["restarts"]),
            since_s=float(fields["since_s"]),
        )
        if not 0 <= marker.restarts <= 1 << 20:
            raise ValueError(f"restarts={marker.restarts}")
        return marker
    except (ValueError, KeyError, UnicodeDecodeError) as e:
        log.warning("damage marker %s unreadable (%s): checking every segment", path, e)
        return DamageMarker(verify=True, restarts=0, since_s=time.time())


def write_marker(root: Path, marker: DamageMarker) -> None:
    atomic_write(root / DAMAGE_FILE, marker.encode())


def next_restart(root: Path, now_s: float | None = None) -> DamageMarker:
    """The marker for one more damage restart (the count restarts after a quiet window)."""
    now = time.time() if now_s is None else now_s
    old = read_marker(root)
    if old is None or now - old.since_s > DAMAGE_RESTART_WINDOW_S or now < old.since_s:
        return DamageMarker(verify=True, restarts=1, since_s=now)
    return DamageMarker(verify=True, restarts=old.restarts + 1, since_s=old.since_s)


def verified(root: Path, marker: DamageMarker | None) -> None:
    """The open checked every segment: keep only the restart count (or nothing)."""
    if marker is None:
        return
    if time.time() - marker.since_s > DAMAGE_RESTART_WINDOW_S:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(root / DAMAGE_FILE)
        return
    write_marker(root, DamageMarker(verify=False, restarts=marker.restarts, since_s=marker.since_s))
