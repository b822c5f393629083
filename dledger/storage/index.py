"""The index files of a store (docs/FORMAT.md "Index records"): one fixed-size record per
entry under ``index/``, record ``i`` at byte ``i * INDEX_RECORD_SIZE`` of the index space, cut
into files of ``index_segment_size_bytes``. :class:`IndexFiles` owns the open files; the
store, its recovery and its truncation go through it.

Locking is the store's (``dledger.storage.store``): an ``IndexFiles`` has none of its own.
"""

from __future__ import annotations

from pathlib import Path

from dledger.log import CorruptLogError
from dledger.storage import codec
from dledger.storage.codec import (
    INDEX_CRC_OFFSET,
    INDEX_MAGIC,
    INDEX_NO_CRC,
    INDEX_RECORD_SIZE,
    U32,
    RecordError,
    crc32c,
)
from dledger.storage.files import MappedFile, fsync_dir, segment_name
from dledger.storage.segments import list_files


class IndexFiles:
    """The index files of one store, by number (file ``n`` starts at record byte
    ``n * file_bytes``)."""

    def __init__(self, directory: Path, file_bytes: int) -> None:
        assert file_bytes % INDEX_RECORD_SIZE == 0
        self.directory = directory
        self.file_bytes = file_bytes
        self._files: dict[int, MappedFile] = {}

    def open_existing(self) -> None:
        """Map the index files on disk."""
        for start in list_files(self.directory, self.file_bytes):
            path = self.directory / segment_name(start)
            self._files[start // self.file_bytes] = MappedFile(
                path, start, self.file_bytes, create=False
            )

    def delete_all_on_disk(self) -> None:
        """Delete every index file (before they are opened: a store of an older format,
        whose index recovery rebuilds)."""
        assert not self._files
        for p in self.directory.iterdir():
            p.unlink()
        fsync_dir(self.directory)

    def __contains__(self, number: int) -> bool:
        return number in self._files

    def files(self) -> list[MappedFile]:
        """The open files (a copy of the list: the caller may drop the store's lock)."""
        return list(self._files.values())

    def file(self, number: int, *, create: bool) -> MappedFile | None:
        """Index file ``number``; created (allocated) if missing and ``create``, else None.
        OSError (ENOSPC included) from the creation."""
        f = self._files.get(number)
        if f is None and create:
            start = number * self.file_bytes
            f = MappedFile(
                self.directory / segment_name(start), start, self.file_bytes, create=True
            )
            self._files[number] = f
        return f

    def file_of(self, index: int) -> MappedFile:
        """The file holding the record of ``index``, created if missing."""
        f = self.file(index * INDEX_RECORD_SIZE // self.file_bytes, create=True)
        assert f is not None
        return f

    def write_record(
        self, index: int, size: int, pos: int, term: int, typ: int, chain: int
    ) -> None:
        """Write the record of entry ``index`` (recovery's rebuild; appends batch theirs)."""
        f = self.file_of(index)
        off = index * INDEX_RECORD_SIZE - f.start
        head = INDEX_NO_CRC.pack(INDEX_MAGIC, size, pos, term, chain, typ)
        f.mm[off : off + INDEX_CRC_OFFSET] = head
        U32.pack_into(f.mm, off + INDEX_CRC_OFFSET, crc32c(head))

    def record(self, index: int) -> codec.IndexRecord:
        """The record of ``index``; CorruptLogError if it is missing or bad."""
        byte = index * INDEX_RECORD_SIZE
        f = self._files.get(byte // self.file_bytes)
        if f is None:
            path = self.directory / segment_name(byte - byte % self.file_bytes)
            raise CorruptLogError(
                f"index file {path} for index {index} is missing", path=str(path), offset=0
            )
        try:
            return codec.decode_index_record(f.mm, byte - f.start)
        except RecordError as e:
            raise CorruptLogError(
                f"index record of index {index} in {f.path} at offset {e.offset}: {e.reason}",
                path=str(f.path),
                offset=e.offset,
                index=index,
            ) from None

    def highest_valid(self, first: int) -> int:
        """The highest index from ``first`` on with a valid index record, stopping at the
        first that is not (the records the log held before its end was lost); 0 if none."""
        last = 0
        index = first
        while True:
            byte = index * INDEX_RECORD_SIZE
            f = self._files.get(byte // self.file_bytes)
            if f is None:
                return last
            try:
                codec.decode_index_record(f.mm, byte - f.start)
            except RecordError:
                return last
            last = index
            index += 1

    def clean_after(self, last: int) -> bool:
        """Zero index records above ``last`` and delete index files wholly above it. Returns
        whether a file was deleted (the caller syncs the directory)."""
        first_byte = (last + 1) * INDEX_RECORD_SIZE
        deleted = False
        for number in sorted(self._files):
            f = self._files[number]
            if f.start > first_byte and number != first_byte // self.file_bytes:
                del self._files[number]
                f.delete()
                deleted = True
            elif f.end > first_byte:
                off = first_byte - f.start
                end = off
                while end < f.size_bytes and f.mm[end : end + 4] != b"\0\0\0\0":
                    end += INDEX_RECORD_SIZE
                f.zero(off, end)
                f.sync(off, end)
        return deleted

    def clean_before(self, first: int) -> bool:
        """Delete index files whose records are all below ``first``; True if any."""
        deleted = False
        for number in sorted(self._files):
            f = self._files[number]
            if f.end <= first * INDEX_RECORD_SIZE:
                del self._files[number]
                f.delete()
                deleted = True
        return deleted

    def close(self) -> None:
        for f in self._files.values():
            f.close()
        self._files = {}


def sync_records(files: list[MappedFile], lo: int, hi: int) -> None:
    """Sync the records of indices ``lo..hi`` held in ``files`` (a :meth:`IndexFiles.files`
    copy, so that the caller may do it without the store's lock)."""
    for f in files:
        a = max(lo * INDEX_RECORD_SIZE, f.start)
        b = min((hi + 1) * INDEX_RECORD_SIZE, f.end)
        if a < b:
            f.sync(a - f.start, b - f.start)
