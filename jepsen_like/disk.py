"""Disk faults on a stopped node's Raft log (``{store}/dledger-{id}/commitlog/``).

- :func:`tear_tail`: an interrupted write after the last entry (a header whose CRC fails and
  half a body), as a crash during an append leaves it; recovery must cut it off and start.
- :func:`flip_bit`: one bit flipped in the body of a committed entry (one at or below the
  checkpoint's commit index, in the segments recovery scans); the node must refuse to start
  or repair itself, never serve the corrupt entry.

The storage nemesis's faults (docs/JEPSEN.md "The storage nemesis"), each returning a
:class:`Damage` (one line and its facts: file, offset, indexes) for the history:

- :func:`flip_committed_bit`: one bit of a committed entry, header or body, in any segment;
- :func:`cut_committed`: a segment file cut short inside a committed entry, any segment;
- :func:`copy_store` / :func:`restore_store`: a store put back to an older copy of itself;
- :func:`damage_hard_state`: the ``meta`` file deleted, emptied, cut or with a flipped bit;
- :func:`damage_cq_record`: one ConsumeQueue record changed (derived state).

The tests that show each fault by hand (tests/integration/test_storage_*.py,
test_derived_state.py) use the same helpers (:func:`xor_byte`, :func:`shorten_cq_record`).
"""

from __future__ import annotations

import logging
import mmap
import os
import random
import shutil
import struct
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dledger.storage import codec
from dledger.storage.codec import ItemKind
from jepsen_like.errors import JepsenError

logger = logging.getLogger(__name__)

# Bytes of the torn record written after the last entry (a header and part of a body).
TORN_RECORD_BYTES = codec.ENTRY_HEADER_SIZE + 40


# A ConsumeQueue record: commitlog position, message size, tag hash (docs/FORMAT.md,
# "Broker: ConsumeQueue"); a record of all zeros is empty.
CQ_RECORD = struct.Struct(">QIq")
CQ_FIELDS = ("position", "size", "tag")
# How much the ConsumeQueue change shortens a record's size (a pull then read a
# truncated message).
CQ_SHORTEN_BYTES = 10
# The node's hard state (term, vote) inside its store directory (docs/FORMAT.md).
HARD_STATE_FILE = "meta"
HARD_STATE_DAMAGES = ("deleted", "emptied", "cut", "bit-flip")


class DiskFaultError(JepsenError):
    """The store has nothing the fault could be applied to."""


@dataclass(frozen=True, slots=True)
class Damage:
    """What a fault did: one line for people, and its facts (file, offset, indexes...) for
    the history (``facts`` values are JSON-able)."""

    what: str
    facts: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class _Found:
    path: Path
    offset: int  # in the file
    header: codec.EntryHeader


def _segments(dledger_dir: Path) -> list[tuple[Path, int]]:
    data = dledger_dir / "commitlog"
    segs = sorted(p for p in data.iterdir() if p.name.isdigit()) if data.is_dir() else []
    return [(p, int(p.name)) for p in segs]


def _entries(path: Path, base: int) -> tuple[list[_Found], int]:
    """Valid entries of one segment file and the file offset after the last one."""
    out: list[_Found] = []
    end = 0
    with path.open("rb") as fh:
        size = os.fstat(fh.fileno()).st_size
        if size == 0:
            return out, 0
        with mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            for item in codec.iter_segment(mm, base):
                if item.kind is ItemKind.ENTRY:
                    assert item.header is not None
                    out.append(_Found(path, item.offset, item.header))
                    end = item.offset + item.size
                else:
                    break
    return out, end


def _checkpoint(dledger_dir: Path) -> codec.Checkpoint:
    try:
        return codec.decode_checkpoint((dledger_dir / "checkpoint").read_bytes())
    except (OSError, codec.RecordError):
        return codec.Checkpoint()


def tear_tail(dledger_dir: Path, rng: random.Random) -> str:
    """Write a torn record after the last entry of the last segment holding entries."""
    for path, base in reversed(_segments(dledger_dir)):
        entries, end = _entries(path, base)
        if not entries:
            continue
        size = path.stat().st_size
        if end + TORN_RECORD_BYTES > size:
            raise DiskFaultError(f"no room for a torn record after {path}:{end}")
        last = entries[-1].header
        header = bytearray(
            codec.encode_entry(
                index=last.index + 1, term=last.term, position=base + end, body=b"x" * 40
            )[: codec.ENTRY_HEADER_SIZE]
        )
        header[codec.HEADER_CRC_OFFSET] ^= 0xFF  # the header write was interrupted
        torn = bytes(header) + bytes(rng.randrange(256) for _ in range(20))
        with path.open("r+b") as fh:
            fh.seek(end)
            fh.write(torn)
            fh.flush()
            os.fsync(fh.fileno())
        return f"torn record of {len(torn)} bytes at {path.name}+{end} after index {last.index}"
    raise DiskFaultError(f"no entries in {dledger_dir}")


def flip_bit(dledger_dir: Path, rng: random.Random) -> str:
    """Flip one bit in the body of a committed entry in the segments recovery re-verifies."""
    ckpt = _checkpoint(dledger_dir)
    segs = _segments(dledger_dir)
    # Recovery scans from the segment holding the checkpoint's flushed position on.
    scanned = segs  # no checkpoint yet: recovery scans everything
    if ckpt.flushed_position > 0:
        starts = [b for _, b in segs if b < ckpt.flushed_position]
        first = max(starts) if starts else 0
        scanned = [s for s in segs if s[1] >= first]
    candidates: list[_Found] = []
    for path, base in scanned:
        entries, _ = _entries(path, base)
        candidates += [
            e
            for e in entries
            if e.header.index <= ckpt.commit_index
            and e.header.body_size > 0
            and base + e.offset + e.header.total_size <= ckpt.flushed_position
        ]
    if not candidates:
        raise DiskFaultError(
            f"no committed entry with a body in the scanned segments of {dledger_dir}"
        )
    victim = rng.choice(candidates)
    byte = victim.offset + codec.ENTRY_HEADER_SIZE + rng.randrange(victim.header.body_size)
    bit = rng.randrange(8)
    with victim.path.open("r+b") as fh:
        fh.seek(byte)
        old = fh.read(1)[0]
        fh.seek(byte)
        fh.write(bytes([old ^ (1 << bit)]))
        fh.flush()
        os.fsync(fh.fileno())
    return (
        f"flipped bit {bit} of {victim.path.name}+{byte} in committed entry "
        f"index={victim.header.index} (commit index {ckpt.commit_index})"
    )


# ---------------------------------------------------------------- the storage nemesis


def xor_byte(path: Path, offset: int, mask: int) -> tuple[int, int]:
    """XOR the byte at ``offset`` of ``path`` with ``mask`` (through the page cache: a running
    node's mapping sees it); returns the byte before and after."""
    assert 0 < mask < 256, mask
    fd = os.open(path, os.O_RDWR)
    try:
        old = os.pread(fd, 1, offset)
        if len(old) != 1:
            raise DiskFaultError(f"{path} has no byte at offset {offset}")
        new = old[0] ^ mask
        os.pwrite(fd, bytes([new]), offset)
    finally:
        os.close(fd)
    return old[0], new


def _committed(dledger_dir: Path) -> tuple[codec.Checkpoint, list[list[_Found]]]:
    """The checkpoint and, per segment (all of them, in order), its entries that are committed
    and durable by the checkpoint: damage there is damage to data the node acknowledged."""
    ckpt = _checkpoint(dledger_dir)
    out = []
    for path, base in _segments(dledger_dir):
        entries, _ = _entries(path, base)
        out.append(
            [
                e
                for e in entries
                if e.header.index <= ckpt.commit_index
                and base + e.offset + e.header.total_size <= ckpt.flushed_position
            ]
        )
    return ckpt, out


def last_entry_index(dledger_dir: Path) -> int:
    """The index of the store's last valid entry (0: none)."""
    for path, base in reversed(_segments(dledger_dir)):
        entries, _ = _entries(path, base)
        if entries:
            return entries[-1].header.index
    return 0


def flip_committed_bit(dledger_dir: Path, rng: random.Random) -> Damage:
    """Flip one bit of a committed entry (header or body) in any segment, not only the ones
    the open scans: the scrubber (or a read) must find it."""
    ckpt, per_segment = _committed(dledger_dir)
    candidates = [(k, e) for k, entries in enumerate(per_segment) for e in entries]
    if not candidates:
        raise DiskFaultError(f"no committed entry in {dledger_dir}")
    k, victim = rng.choice(candidates)
    within = rng.randrange(victim.header.total_size)
    bit = rng.randrange(8)
    offset = victim.offset + within
    xor_byte(victim.path, offset, 1 << bit)
    part = "header" if within < codec.ENTRY_HEADER_SIZE else "body"
    return Damage(
        f"flipped bit {bit} of {victim.path.name}+{offset} ({part} of committed entry "
        f"index={victim.header.index}, segment {k + 1} of {len(per_segment)}, "
        f"commit index {ckpt.commit_index})",
        {
            "file": str(victim.path),
            "offset": offset,
            "bit": bit,
            "part": part,
            "indexes": [victim.header.index, victim.header.index],
            "segment": k + 1,
            "segments": len(per_segment),
            "commit_index": ckpt.commit_index,
        },
    )


def cut_committed(dledger_dir: Path, rng: random.Random) -> Damage:
    """Cut a segment file short inside one of its committed entries (any segment): that entry
    and every later one in the file are gone (the file system lost its tail)."""
    ckpt, per_segment = _committed(dledger_dir)
    segs = [(k, entries) for k, entries in enumerate(per_segment) if entries]
    if not segs:
        raise DiskFaultError(f"no committed entry in {dledger_dir}")
    k, entries = rng.choice(segs)
    victim = rng.choice(entries)
    path = victim.path
    cut_at = victim.offset + rng.randrange(1, victim.header.total_size)
    old_size = path.stat().st_size
    file_entries, _ = _entries(path, int(path.name))
    lost_to = file_entries[-1].header.index
    os.truncate(path, cut_at)
    return Damage(
        f"cut {path.name} from {old_size} to {cut_at} bytes, inside committed entry "
        f"index={victim.header.index} (indexes {victim.header.index}..{lost_to} of that file "
        f"gone; segment {k + 1} of {len(per_segment)}, commit index {ckpt.commit_index})",
        {
            "file": str(path),
            "offset": cut_at,
            "old_size": old_size,
            "indexes": [victim.header.index, lost_to],
            "segment": k + 1,
            "segments": len(per_segment),
            "commit_index": ckpt.commit_index,
        },
    )


def _store_items(root: Path, keep: Iterable[str]) -> list[Path]:
    kept = set(keep)
    return sorted(p for p in root.iterdir() if p.name not in kept)


def copy_store(root: Path, dst: Path, keep: Iterable[str] = ()) -> None:
    """Copy a stopped node's directory ``root`` to ``dst`` (which must not exist), leaving
    out the entries named in ``keep`` (they stay as they are at a restore)."""
    dst.mkdir(parents=True)
    for item in _store_items(root, keep):
        if item.is_dir():
            shutil.copytree(item, dst / item.name, symlinks=True)
        else:
            shutil.copy2(item, dst / item.name)


def restore_store(copy: Path, root: Path, keep: Iterable[str] = ()) -> None:
    """Put a stopped node's directory ``root`` back to ``copy`` (from :func:`copy_store`
    with the same ``keep``): everything but ``keep`` is replaced."""
    for item in _store_items(root, keep):
        if item.is_dir() and not item.is_symlink():
            shutil.rmtree(item)
        else:
            item.unlink()
    for item in sorted(copy.iterdir()):
        if item.is_dir():
            shutil.copytree(item, root / item.name, symlinks=True)
        else:
            shutil.copy2(item, root / item.name)


def damage_hard_state(dledger_dir: Path, rng: random.Random) -> Damage:
    """Damage the node's hard state file one way: deleted, emptied, cut to a random length, or
    one bit flipped (docs/RAFT.md section 11: it is recovered from the promise file)."""
    path = dledger_dir / HARD_STATE_FILE
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        raise DiskFaultError(f"{path} does not exist") from None
    how = rng.choice(HARD_STATE_DAMAGES)
    facts: dict[str, Any] = {"file": str(path), "how": how, "old_size": size}
    if how == "deleted":
        path.unlink()
    elif how == "emptied" or size < 2:
        os.truncate(path, 0)
        how = facts["how"] = "emptied"
    elif how == "cut":
        facts["offset"] = cut = rng.randrange(1, size)
        os.truncate(path, cut)
    else:
        facts["offset"] = offset = rng.randrange(size)
        facts["bit"] = bit = rng.randrange(8)
        xor_byte(path, offset, 1 << bit)
    where = f" at byte {facts['offset']}" if "offset" in facts else ""
    return Damage(f"hard state {path.name} ({size} bytes) {how}{where}", facts)


def read_cq_record(path: Path, record: int) -> tuple[int, int, int]:
    with path.open("rb") as fh:
        fh.seek(record * CQ_RECORD.size)
        raw = fh.read(CQ_RECORD.size)
    if len(raw) != CQ_RECORD.size:
        raise DiskFaultError(f"{path} has no record {record}")
    position, size, tag = CQ_RECORD.unpack(raw)
    return position, size, tag


def write_cq_record(path: Path, record: int, value: tuple[int, int, int]) -> None:
    with path.open("r+b") as fh:
        fh.seek(record * CQ_RECORD.size)
        fh.write(CQ_RECORD.pack(*value))


def shorten_cq_record(path: Path, record: int) -> tuple[int, int, int]:
    """The issue's change: the record's size :data:`CQ_SHORTEN_BYTES` short (a pull read a
    truncated message). Returns the record as it was."""
    good = read_cq_record(path, record)
    write_cq_record(path, record, (good[0], good[1] - CQ_SHORTEN_BYTES, good[2]))
    return good


def _cq_records(path: Path) -> int:
    """Non-empty records at the start of a ConsumeQueue file."""
    data = path.read_bytes()
    size = CQ_RECORD.size
    for n in range(len(data) // size):
        if not any(data[n * size : (n + 1) * size]):
            return n
    return len(data) // size


def damage_cq_record(store_root: Path, topic: str, rng: random.Random) -> Damage:
    """Change one ConsumeQueue record of ``topic`` on a stopped node: its size shortened (the
    issue's case) or one bit flipped in its position, size or tag hash."""
    files = sorted((store_root / "consumequeue" / topic).glob("*/*"))
    counted = [(p, n) for p in files if p.name.isdigit() and (n := _cq_records(p))]
    if not counted:
        raise DiskFaultError(f"no ConsumeQueue record of {topic} under {store_root}")
    path, n = rng.choice(counted)
    record = rng.randrange(n)
    queue_offset = int(path.name) // CQ_RECORD.size + record
    change = rng.choice(("shortened", *CQ_FIELDS))
    if change == "shortened":
        old = shorten_cq_record(path, record)
    else:
        old = read_cq_record(path, record)
        i = CQ_FIELDS.index(change)
        width_bits = (64, 32, 63)[i]  # the tag is signed: keep it in range
        value = list(old)
        value[i] ^= 1 << rng.randrange(width_bits)
        write_cq_record(path, record, (value[0], value[1], value[2]))
    new = read_cq_record(path, record)
    queue = f"{topic}/{path.parent.name}"
    return Damage(
        f"ConsumeQueue {queue} record at offset {queue_offset} ({path.name}): {change}, "
        f"{old} -> {new}",
        {
            "file": str(path),
            "offset": record * CQ_RECORD.size,
            "queue": queue,
            "queue_offset": queue_offset,
            "change": change,
            "old": list(old),
            "new": list(new),
        },
    )
