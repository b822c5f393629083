"""The space reserve (docs/STORAGE.md "Disk full"): a file of ``reserve_bytes`` allocated in
the store's root at open, deleted when a metadata write (hard state, checkpoint) finds the
disk full so that the write can be retried, and allocated again once space returns.
:class:`SpaceReserve` owns the file and its state. Callers serialise its use (the store's
``_flush_lock`` or ``_meta_lock``, or the open)."""

from __future__ import annotations

import contextlib
import logging
import os
import time
from pathlib import Path

from dledger.storage.files import allocate, fsync_dir, is_disk_full

log = logging.getLogger(__name__)

RESERVE_FILE = "reserve"
# Space set aside in the store's root (the file RESERVE_FILE, allocated at open) so that the
# hard state and the checkpoint can always be written: on ENOSPC the file is deleted and the
# write retried. Each such write needs one block for a few seconds (temp file, then rename);
# 4 MiB is a thousand of them, and small next to any segment.
DEFAULT_RESERVE_BYTES = 4 << 20
# After the reserve was used, it is allocated again at most this often, and only once the file
# system has at least RESERVE_REARM_FACTOR times its size free (so that re-arming it does not
# itself fill the disk again).
RESERVE_RETRY_S = 1.0
RESERVE_REARM_FACTOR = 4


class SpaceReserve:
    """RESERVE_FILE of ``size_bytes`` (0: no reserve) in ``root``."""

    def __init__(self, root: Path, size_bytes: int) -> None:
        assert size_bytes >= 0
        self.root = root
        self.size_bytes = size_bytes
        self._held = False  # RESERVE_FILE exists, allocated in full
        self._tried_s = -RESERVE_RETRY_S  # monotonic time of the last re-arm attempt

    @property
    def held(self) -> bool:
        """Whether the reserve is allocated now."""
        return self._held

    def arm(self) -> None:
        """Allocate RESERVE_FILE if it is not there; on a full disk, go without it for now
        (:meth:`maybe_rearm` tries again)."""
        size = self.size_bytes
        self._tried_s = time.monotonic()
        if size == 0:
            return
        path = self.root / RESERVE_FILE
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            have = os.fstat(fd).st_size
            allocate(fd, 0, size)
            if have > size:
                os.ftruncate(fd, size)
            os.fsync(fd)
        except OSError as e:
            if not is_disk_full(e):
                raise
            os.close(fd)
            fd = -1
            with contextlib.suppress(OSError):
                os.unlink(path)
            log.warning(
                "space reserve not allocated root=%s bytes=%d: %s", self.root, size, e.strerror
            )
            return
        finally:
            if fd >= 0:
                os.close(fd)
        if not self._held:
            fsync_dir(self.root)
        self._held = True

    def release(self, why: str) -> bool:
        """Delete RESERVE_FILE (its blocks are free at once); False if there was none."""
        if not self._held:
            return False
        self._held = False
        self._tried_s = time.monotonic()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.root / RESERVE_FILE)
        log.warning(
            "disk full: released the space reserve root=%s bytes=%d to write %s",
            self.root,
            self.size_bytes,
            why,
        )
        return True

    def maybe_rearm(self) -> None:
        """Allocate the reserve again after it was used, once the disk has room again."""
        if self._held or self.size_bytes == 0:
            return
        now = time.monotonic()
        if now - self._tried_s < RESERVE_RETRY_S:
            return
        self._tried_s = now
        try:
            st = os.statvfs(self.root)
        except OSError:
            return
        if st.f_bavail * st.f_frsize < RESERVE_REARM_FACTOR * self.size_bytes:
            return
        self.arm()
        if self._held:
            log.info("space reserve restored root=%s bytes=%d", self.root, self.size_bytes)
