"""The encoding step of the store's append path (:meth:`SegmentedLogStore.append`): a run of
entries that fits in one data segment and one index file, encoded as the parts of the entries
(headers and the bodies as they are, written with one ``pwritev``: the kernel gathers them, no
join copies the bodies) and one buffer of index records (one ``pwrite``). Kept free of per-entry
objects beyond the packed bytes themselves: this is the store's hot loop."""

from __future__ import annotations

from collections.abc import Sequence

from dledger.chain import link
from dledger.storage.codec import (
    ENTRY_HEADER_SIZE,
    ENTRY_MAGIC,
    FORMAT_VERSION,
    HEADER_NO_CRC,
    INDEX_MAGIC,
    INDEX_NO_CRC,
    INDEX_RECORD_SIZE,
    U32,
    crc32c,
)

# An item to append: (term, type, body), validated by the store.
Item = tuple[int, int, bytes]


def encode_run(
    items: Sequence[Item],
    i: int,
    seg_start: int,
    off: int,
    seg_size: int,
    ioff: int,
    isize: int,
    idx: int,
    chain: int,
) -> tuple[int, int, int, list[bytes], bytes, int]:
    """Encode ``items[i:]`` from offset ``off`` of the data segment at ``seg_start`` (of
    ``seg_size`` bytes) and offset ``ioff`` of an index file of ``isize`` bytes, while they
    fit in both, after entry ``idx`` of chain ``chain``. At least one item must fit (flat
    arguments: this runs once per appended batch). Returns the next item's position in
    ``items``, the last term and chain encoded, the entries' parts, the index records' bytes,
    and the data segment's offset after the run."""
    head_pack = HEADER_NO_CRC.pack
    idx_pack = INDEX_NO_CRC.pack
    u32_pack = U32.pack
    header_size = ENTRY_HEADER_SIZE
    n_items = len(items)
    term = items[i][0]
    assert off + header_size + len(items[i][2]) <= seg_size and ioff < isize
    parts: list[bytes] = []
    iparts: list[bytes] = []
    add = parts.extend
    iadd = iparts.extend
    while i < n_items:
        term_i, typ, body = items[i]
        n = len(body)
        total = header_size + n
        if off + total > seg_size or ioff >= isize:
            break
        term = term_i
        idx += 1
        pos = seg_start + off
        bcrc = crc32c(body)
        head = head_pack(ENTRY_MAGIC, total, idx, term, pos, typ, FORMAT_VERSION, 0, n, bcrc)
        add((head, u32_pack(crc32c(head)), body))
        chain = link(chain, idx, term, typ, n, bcrc) if chain else chain
        ihead = idx_pack(INDEX_MAGIC, total, pos, term, chain, typ)
        iadd((ihead, u32_pack(crc32c(ihead))))
        off += total
        ioff += INDEX_RECORD_SIZE
        i += 1
    return i, term, chain, parts, b"".join(iparts), off


def segments_filled(items: Sequence[Item], off: int, seg_size: int) -> int:
    """How many segments after the active one appending ``items`` at its offset ``off``
    starts (entries never straddle two segments)."""
    count = 0
    for _term, _typ, body in items:
        total = ENTRY_HEADER_SIZE + len(body)
        if off + total > seg_size:
            count += 1
            off = 0
        off += total
    return count
