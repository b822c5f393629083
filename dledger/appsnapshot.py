"""What an application hands dledger for a Raft snapshot (dledger.server.snapshots).

Kept apart from the server (no gRPC here): the broker's state machine builds one.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True, slots=True)
class AppSnapshot:
    """The application's state at ``index``: files as (relative path, content, or a file read
    while the transfer streams). ``prepare`` (if any) runs in a thread before any file is
    read, and ``files`` is read only after it (the broker lists and pins its files there,
    off the event loop, and flushes its stores); ``release`` (if any) runs in a thread once
    the transfer ended, however it ended (the broker drops the links that pinned its
    files)."""

    index: int
    files: Sequence[tuple[str, bytes | Path]]
    prepare: Callable[[], None] | None = None
    release: Callable[[], None] | None = None
