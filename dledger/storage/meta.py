"""The store's small metadata files in its root (docs/FORMAT.md): the checkpoint (what is
durable, where recovery starts) and ``meta``, the Raft hard state. Each is replaced whole by
an atomic write; on a full disk the space reserve (:mod:`dledger.storage.reserve`) is released
and the write tried once more. :class:`MetaFiles` does the reading and writing; what goes into
the checkpoint is the store's. A file of a format newer than this release reads is
FormatTooNewError (never CorruptLogError: it is not damage, and nothing rewrites it)."""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable
from pathlib import Path

from dledger.log import CorruptLogError, HardState
from dledger.storage import codec
from dledger.storage.codec import Checkpoint, RecordError
from dledger.storage.errors import DiskFullError, short_path
from dledger.storage.files import atomic_write, is_disk_full
from dledger.storage.reserve import SpaceReserve
from prockit.fatal import fatal

CHECKPOINT_FILE = "checkpoint"
META_FILE = "meta"


class MetaFiles:
    """The checkpoint and hard-state files of the store in ``root``. ``disk_full(what, e)``
    makes the error raised when a write finds no space (the store counts them)."""

    def __init__(
        self,
        root: Path,
        reserve: SpaceReserve,
        disk_full: Callable[[str, OSError], DiskFullError],
    ) -> None:
        self.root = root
        self._reserve = reserve
        self._disk_full = disk_full
        self._hard_state_lock = threading.Lock()  # one hard-state read or write at a time

    def read_checkpoint(self) -> Checkpoint:
        """The checkpoint on disk (the default one if there is none). A temp file that an
        interrupted write left is deleted. CorruptLogError if it does not decode,
        FormatTooNewError if a newer release wrote it."""
        path = self.root / CHECKPOINT_FILE
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path.with_name(path.name + ".tmp"))
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return Checkpoint()
        try:
            return codec.decode_checkpoint(data, str(path))
        except RecordError as e:
            raise CorruptLogError(
                f"checkpoint {path}: {e.reason}", path=str(path), offset=e.offset
            ) from None

    def checkpoint_exists(self) -> bool:
        return (self.root / CHECKPOINT_FILE).exists()

    def write_checkpoint(self, ckpt: Checkpoint) -> None:
        """Replace the checkpoint durably (see :meth:`write`)."""
        self.write(CHECKPOINT_FILE, codec.encode_checkpoint(ckpt))

    def load_hard_state(self) -> HardState:
        path = self.root / META_FILE
        with self._hard_state_lock:
            try:
                data = path.read_bytes()
            except FileNotFoundError:
                return HardState()
        try:
            return codec.decode_hard_state(data, str(path))
        except RecordError as e:
            raise CorruptLogError(
                f"hard state {path}: {e.reason}", path=str(path), offset=e.offset
            ) from None

    def save_hard_state(self, state: HardState, check_open: Callable[[], None]) -> None:
        """Replace the hard state durably; ``check_open`` raises if the store is closed (it
        runs under the same lock as the write, so no write follows a close)."""
        data = codec.encode_hard_state(state)
        with self._hard_state_lock:
            check_open()
            self.write(META_FILE, data)

    def write(self, name: str, data: bytes) -> None:
        """``atomic_write`` a small metadata file. On a full disk the reserve is released and
        the write tried once more; DiskFullError if there is still no space. Any other error
        is fatal: it is an fsync or I/O failure of the store's own metadata (never retried)."""
        path = self.root / name
        try:
            try:
                atomic_write(path, data)
                return
            except OSError as e:
                if not is_disk_full(e) or not self._reserve.release(name):
                    raise
            atomic_write(path, data)
        except OSError as e:
            if is_disk_full(e):
                raise self._disk_full(name, e) from None
            fatal("store-meta", f"WRITE_FAILED path={short_path(path)} error={e}")
