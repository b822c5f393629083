"""Small ext4 file systems on loop devices, for disk-full tests (root only).

``mount_loop_fs(image, mountpoint, size_mib)`` makes and mounts one; ``unmount`` undoes it
(``mount -o loop`` sets the loop device to detach itself on unmount). ``loop_unavailable()``
says why such tests must be skipped on this machine, or "" when they can run.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

# Commands finish in well under a second on these sizes; a stuck one fails the test.
CMD_TIMEOUT_S = 30.0
# Tries of umount while a process that just exited still holds a file open.
UMOUNT_TRIES = 20


def _run(*cmd: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=CMD_TIMEOUT_S, check=False)


def loop_unavailable() -> str:
    """Why loop-mounted file systems cannot be used here ("" when they can)."""
    if os.geteuid() != 0:
        return "needs root to mount loop file systems"
    for tool in ("mkfs.ext4", "mount", "umount", "losetup"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed"
    if not Path("/dev/loop-control").exists():
        return "no /dev/loop-control (loop devices unavailable)"
    return ""


def mount_loop_fs(image: Path, mountpoint: Path, size_mib: int) -> None:
    """Create an ext4 image of ``size_mib`` MiB (no root-reserved blocks) and mount it."""
    with open(image, "wb") as f:
        f.truncate(size_mib << 20)
    made = _run("mkfs.ext4", "-q", "-F", "-m", "0", "-E", "nodiscard", str(image))
    if made.returncode:
        raise RuntimeError(f"mkfs.ext4 failed: {made.stderr.strip()[:300]}")
    mountpoint.mkdir(parents=True, exist_ok=True)
    mounted = _run("mount", "-o", "loop", str(image), str(mountpoint))
    if mounted.returncode:
        raise RuntimeError(f"mount -o loop failed: {mounted.stderr.strip()[:300]}")


def unmount(mountpoint: Path) -> None:
    """Unmount (retrying while busy), lazily as a last resort so that teardown never leaks."""
    for _ in range(UMOUNT_TRIES):
        if _run("umount", str(mountpoint)).returncode == 0:
            return
        if not os.path.ismount(mountpoint):
            return
        time.sleep(0.1)
    with contextlib.suppress(subprocess.SubprocessError):
        _run("umount", "-l", str(mountpoint))


def fill(path: Path, leave_free_bytes: int) -> int:
    """Allocate a file at ``path`` taking all but ``leave_free_bytes`` of its file system's
    available space; returns its size (0 if there is less than that free already)."""
    st = os.statvfs(path.parent)
    size = st.f_bavail * st.f_frsize - leave_free_bytes
    if size <= 0:
        return 0
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        os.posix_fallocate(fd, 0, size)
    finally:
        os.close(fd)
    return size


def used_percent(path: Path) -> float:
    st = os.statvfs(path)
    return 100.0 * (st.f_blocks - st.f_bavail) / st.f_blocks


@contextlib.contextmanager
def group_loop_stores(tmp_path: Path, nodes: int, size_mib: int) -> Iterator[list[Path]]:
    """One ext4 file system of ``size_mib`` per node, mounted where ``local_group`` puts that
    node's store (``tmp_path/group0/n<i>``); unmounted and their images deleted on exit (after
    the group stopped). The caller skips first when ``loop_unavailable()`` says why."""
    mounts: list[Path] = []
    try:
        for i in range(nodes):
            mnt = tmp_path / "group0" / f"n{i}"
            mount_loop_fs(tmp_path / f"n{i}.img", mnt, size_mib)
            mounts.append(mnt)
        yield mounts
    finally:
        for mnt in mounts:
            unmount(mnt)
        for i in range(nodes):
            (tmp_path / f"n{i}.img").unlink(missing_ok=True)
