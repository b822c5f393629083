"""The broker's part of a Raft snapshot (docs/BROKER.md, "Catching up a new node").

dledger ships the leader's log from its first data segment up to the snapshot's last entry
byte for byte, so a follower that installs a snapshot holds the same entries at the same
commitlog positions as every replica. What the broker adds (:func:`capture`, on the leader,
between two applies):

* ``config/snapshot.json``: the state snapshot at the applied index, the same document a
  restart loads (topics, consumer offsets, dedup window, schedule and POP state, users and
  ACLs, each queue's max offset, the dispatch position and the key index's position);
* every ConsumeQueue file and key index file, read while the transfer runs. Their records
  point at commitlog positions the follower now holds; records written after the snapshot
  index are cut on open, exactly as a restart cuts them back to ``snapshot.json``
  (``BrokerStateMachine._recover_to_snapshot``). Key index files copied while being written
  are marked unclean first, so opening them repairs slots against their header.

  The files are listed and **pinned** before the transfer reads any: hard links under
  ``snapshot-out/<n>/``, made in a thread right after the capture (listing a few thousand
  files takes the better part of a second: never on the event loop), so the transfer reads
  exactly the files the state document counts even when a later entry deletes their topic
  or retention deletes old ones while it runs (a missing ConsumeQueue would make the
  follower's state disagree with the document and throw the install away). What the thread
  finds is at least what the capture point held, because applies only add files, except
  the two that delete them (a topic's deletion, retention's trim), which count themselves
  in ``BrokerStateMachine.files_deleted``: when that count moved between the capture
  point and the last link, or a listed file is gone before its link, the transfer fails
  and the leader restarts it from a new capture. Files added after the capture point are
  harmless: the follower cuts what they hold past the document's position on open. The
  links go when the transfer ends, and at the next start.

:func:`install` (on the follower, after dledger installed the log) swaps the staged files in
for the broker's own, idempotently (a crash part way is finished by the next start), and
leaves the state machine closed: its next ``applied_index()`` opens it at the snapshot.
"""

from __future__ import annotations

import itertools
import logging
import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

from broker.state.errors import BrokerError
from broker.state.indexfile import mark_file_unclean
from dledger.appsnapshot import AppSnapshot
from dledger.storage.files import fsync_dir

if TYPE_CHECKING:
    from broker.state.machine import BrokerStateMachine

logger = logging.getLogger(__name__)

CQ_DIR = "consumequeue"
INDEX_DIR = "index"
CONFIG_DIR = "config"
# Written in the staged directory once it is prepared (empty directories made, key index
# files marked unclean): a second run must not prepare again after some moved away.
PREPARED_MARKER = ".prepared"
# Hard links of the files a snapshot being sent reads (one directory per capture).
PIN_DIR = "snapshot-out"
_pins = itertools.count(1)


def capture(sm: BrokerStateMachine, snapshot_bytes: bytes) -> AppSnapshot:
    """The files of a snapshot at ``sm``'s applied index (``snapshot_bytes`` is its state
    document, captured now: between two applies, on the event loop). ``prepare`` lists and
    pins the files in a thread; the transfer reads them through those links."""
    files: list[tuple[str, bytes | Path]] = [(f"{CONFIG_DIR}/snapshot.json", snapshot_bytes)]
    root = sm.root
    pin = root / PIN_DIR / str(next(_pins))
    deleted_at_capture = sm.files_deleted

    def prepare() -> None:
        # In a thread, before any file is read: list and pin them, check that no apply
        # deleted a file since the capture point, then make what the document describes
        # reach them (and the index header count it).
        made: set[str] = set()  # link directories made: one mkdir each, not one per file
        for rel in list_files(root):
            link = pin / rel
            _pin(root / rel, link, made)
            files.append((rel, link))
        if sm.files_deleted != deleted_at_capture:
            raise BrokerError("store files deleted since the capture (a topic deletion, retention)")
        sm.cqs.flush()
        sm.index.flush()

    def release() -> None:
        shutil.rmtree(pin, ignore_errors=True)

    return AppSnapshot(sm.last_applied, files, prepare, release)


def list_files(root: Path) -> list[str]:
    """Every ConsumeQueue and key index file under ``root``, relative, sorted (in a thread:
    a directory walk with no stat per file)."""
    out: list[str] = []
    for base in (CQ_DIR, INDEX_DIR):
        for dirpath, _dirs, names in os.walk(root / base):
            rel = Path(dirpath).relative_to(root).as_posix()
            out.extend(f"{rel}/{name}" for name in names)
    out.sort()
    return out


def _pin(path: Path, link: Path, made: set[str]) -> None:
    """``link`` becomes a hard link to ``path`` (a copy where the file system refuses links).
    A file deleted since the capture (its topic deleted, retention) fails the transfer: the
    leader restarts it from a new capture. ``made``: the link directories that exist."""
    parent = os.path.dirname(link)
    if parent not in made:
        os.makedirs(parent, exist_ok=True)
        made.add(parent)
    try:
        os.link(path, link)
    except FileNotFoundError:
        raise BrokerError(f"snapshot file {path} deleted since the capture") from None
    except OSError as exc:
        logger.warning("snapshot: cannot link %s (%s): copying it", path, exc)
        shutil.copyfile(path, link)


def clear_pins(root: Path) -> None:
    """Drop the links of transfers a previous process did not finish."""
    shutil.rmtree(root / PIN_DIR, ignore_errors=True)


def install(sm: BrokerStateMachine, app_dir: Path) -> None:
    """Replace ``sm``'s files by the staged ones; ``sm`` must be closed for applies."""
    staged_doc = app_dir / CONFIG_DIR / "snapshot.json"
    if not staged_doc.exists():
        logger.info("snapshot files already installed root=%s", sm.root)
        return
    if not (app_dir / PREPARED_MARKER).exists():
        for name in (CQ_DIR, INDEX_DIR):
            (app_dir / name).mkdir(exist_ok=True)
        for p in (app_dir / INDEX_DIR).iterdir():
            mark_file_unclean(p)
        (app_dir / PREPARED_MARKER).touch()
        fsync_dir(app_dir)
    for name in (CQ_DIR, INDEX_DIR):
        staged = app_dir / name
        if staged.is_dir():
            shutil.rmtree(sm.root / name, ignore_errors=True)
            os.rename(staged, sm.root / name)
    (sm.root / CONFIG_DIR).mkdir(exist_ok=True)
    os.replace(staged_doc, sm.root / CONFIG_DIR / "snapshot.json")
    fsync_dir(sm.root / CONFIG_DIR)
    fsync_dir(sm.root)
    logger.info("snapshot files installed root=%s", sm.root)
