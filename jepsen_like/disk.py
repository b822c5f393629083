"""Disk faults on a stopped node's Raft log (``{store}/dledger-{id}/commitlog/``).

- :func:`tear_tail`: an interrupted write after the last entry (a header whose CRC fails and
  half a body), as a crash during an append leaves it; recovery must cut it off and start.
- :func:`flip_bit`: one bit flipped in the body of a committed entry (one at or below the
  checkpoint's commit index, in the segments recovery scans); the node must refuse to start
  or repair itself, never serve the corrupt entry.
"""

from __future__ import annotations

import logging
import mmap
import os
import random
from dataclasses import dataclass
from pathlib import Path

from dledger.storage import codec
from dledger.storage.codec import ItemKind
from jepsen_like.errors import JepsenError

logger = logging.getLogger(__name__)

# Bytes of the torn record written after the last entry (a header and part of a body).
TORN_RECORD_BYTES = codec.ENTRY_HEADER_SIZE + 40


class DiskFaultError(JepsenError):
    """The store has nothing the fault could be applied to."""


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
