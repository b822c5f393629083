"""File access for the audit: local paths (memory-mapped) and other filesystem URIs.

A plain path or a ``file://`` URI is read through ``mmap`` (no copy, the page cache does the
work). Any other URI (``hdfs://``, ``s3://``, ``gs://``, ...) goes through ``pyarrow.fs``,
which must be able to reach it from the driver and from every executor; such a file is read
whole into memory when a task needs it, so executors need about one segment of memory per
replica on top of Spark's own.
"""

from __future__ import annotations

import contextlib
import importlib
import mmap
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlparse

from spark_audit.errors import AuditError

LOCAL_SCHEMES = ("", "file")


class FsError(AuditError, OSError):
    """A file or directory of a store cannot be listed or read."""


@dataclass(frozen=True, slots=True)
class FileEntry:
    name: str
    size_bytes: int
    is_dir: bool


def scheme_of(uri: str) -> str:
    if "://" not in uri:
        return ""
    return urlparse(uri).scheme.lower()


def is_local(uri: str) -> bool:
    return scheme_of(uri) in LOCAL_SCHEMES


def local_path(uri: str) -> str:
    if scheme_of(uri) == "file":
        return unquote(urlparse(uri).path)
    return uri


def join(uri: str, *names: str) -> str:
    out = uri.rstrip("/")
    for n in names:
        out = f"{out}/{n}"
    return out


def basename(uri: str) -> str:
    return uri.rstrip("/").rsplit("/", 1)[-1]


def stamp(uri: str) -> tuple[int, ...] | None:
    """What changes when a file is written, replaced or truncated: (size, mtime_ns,
    ctime_ns, device, inode) for a local file (ctime cannot be set back by a tool), (size,
    mtime_ns) for another filesystem; None when the file is not there."""
    if is_local(uri):
        try:
            st = os.stat(local_path(uri))
        except OSError:
            return None
        return (st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_dev, st.st_ino)
    pafs = _pyarrow_fs()
    try:
        fs, path = _arrow_fs(uri)
        info = fs.get_file_info(path)
    except (FsError, OSError):
        return None
    if info.type != pafs.FileType.File:
        return None
    return (int(info.size or 0), int(info.mtime_ns or 0))


def dirname(uri: str) -> str:
    """The directory holding ``uri`` (``join``'s inverse for one name)."""
    head = uri.rstrip("/").rsplit("/", 1)[0]
    return head or "/"


def _pyarrow_fs() -> Any:
    """``pyarrow.fs``, imported only for non-local URIs (it has no type information)."""
    return importlib.import_module("pyarrow.fs")


def _arrow_fs(uri: str) -> tuple[Any, str]:
    pafs = _pyarrow_fs()

    try:
        fs, path = pafs.FileSystem.from_uri(uri)
    except Exception as exc:  # pyarrow raises ArrowInvalid, ValueError, OSError...
        raise FsError(f"cannot open {uri}: {exc}") from None
    return fs, path


def list_dir(uri: str) -> list[FileEntry]:
    """Entries of a directory; FsError if it is missing or not a directory."""
    if is_local(uri):
        path = local_path(uri)
        try:
            with os.scandir(path) as it:
                return [
                    FileEntry(
                        e.name,
                        0 if e.is_dir() else e.stat().st_size,
                        e.is_dir(),
                    )
                    for e in it
                ]
        except OSError as exc:
            raise FsError(f"cannot list {uri}: {exc.strerror or exc}") from None
    pafs = _pyarrow_fs()

    fs, path = _arrow_fs(uri)
    try:
        infos = fs.get_file_info(pafs.FileSelector(path))
    except Exception as exc:
        raise FsError(f"cannot list {uri}: {exc}") from None
    return [
        FileEntry(
            i.base_name,
            0 if i.type == pafs.FileType.Directory else int(i.size or 0),
            i.type == pafs.FileType.Directory,
        )
        for i in infos
    ]


def is_dir(uri: str) -> bool:
    if is_local(uri):
        return os.path.isdir(local_path(uri))
    pafs = _pyarrow_fs()

    try:
        fs, path = _arrow_fs(uri)
        info = fs.get_file_info(path)
    except (FsError, OSError):
        return False
    return bool(info.type == pafs.FileType.Directory)


def exists(uri: str) -> bool:
    if is_local(uri):
        return os.path.exists(local_path(uri))
    pafs = _pyarrow_fs()

    try:
        fs, path = _arrow_fs(uri)
        info = fs.get_file_info(path)
    except (FsError, OSError):
        return False
    return bool(info.type != pafs.FileType.NotFound)


def read_range(uri: str, offset: int, size: int) -> bytes:
    """Up to ``size`` bytes at ``offset`` (fewer at the end of the file)."""
    if is_local(uri):
        try:
            with open(local_path(uri), "rb") as f:
                return os.pread(f.fileno(), size, offset)
        except OSError as exc:
            raise FsError(f"cannot read {uri}: {exc.strerror or exc}") from None
    fs, path = _arrow_fs(uri)
    try:
        with fs.open_input_file(path) as f:
            return bytes(f.read_at(size, offset))
    except Exception as exc:
        raise FsError(f"cannot read {uri}: {exc}") from None


def read_all(uri: str) -> bytes:
    if is_local(uri):
        try:
            with open(local_path(uri), "rb") as f:
                return f.read()
        except OSError as exc:
            raise FsError(f"cannot read {uri}: {exc.strerror or exc}") from None
    fs, path = _arrow_fs(uri)
    try:
        with fs.open_input_file(path) as f:
            return bytes(f.read())
    except Exception as exc:
        raise FsError(f"cannot read {uri}: {exc}") from None


class MappedView:
    """A whole file as a read-only buffer: an mmap for local files, bytes otherwise."""

    def __init__(self, uri: str) -> None:
        self.uri = uri
        self._mm: mmap.mmap | None = None
        self.buf: mmap.mmap | bytes
        if is_local(uri):
            try:
                with open(local_path(uri), "rb") as f:
                    size = os.fstat(f.fileno()).st_size
                    if size == 0:
                        self.buf = b""
                    else:
                        self._mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
                        self.buf = self._mm
            except OSError as exc:
                raise FsError(f"cannot map {uri}: {exc.strerror or exc}") from None
        else:
            self.buf = read_all(uri)

    def __len__(self) -> int:
        return len(self.buf)

    def close(self) -> None:
        if self._mm is not None:
            with contextlib.suppress(BufferError):  # a memoryview still points into it
                self._mm.close()
            self._mm = None


@contextlib.contextmanager
def mapped(uri: str) -> Iterator[MappedView]:
    view = MappedView(uri)
    try:
        yield view
    finally:
        view.close()
