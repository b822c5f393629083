"""Checks of many entries at once: the audit's fast path (see ``ReplicaScanner._fast``).

Header fields, index records and the keys the audit checksums are decoded as numpy
structured arrays over the mapped files (big-endian dtypes that mirror the ``struct`` formats
of ``dledger.storage.codec`` and ``spark_audit.model``; the asserts below keep them equal).
The CRC32C of a short fixed-size record (a 44-byte header, a 28-byte index record, a 17-byte
content key) is computed for a whole column of records with per-byte-position tables: CRC32C
is affine in its input for a fixed length, so ``crc(d) = crc(0^n) ^ T[0][d[0]] ^ ... ^
T[n-1][d[n-1]]`` where ``T[j][b]`` is what byte ``b`` at position ``j`` adds. Bodies have
every size, so their CRC32C stays one call of the hardware-accelerated ``crc32c`` per entry:
the only per-entry Python work of the fast path.
"""

from __future__ import annotations

from functools import cache, lru_cache

import numpy as np
import numpy.typing as npt

from dledger.storage.codec import (
    ENTRY_HEADER_SIZE,
    HEADER,
    HEADER_CRC_OFFSET,
    INDEX_CRC_OFFSET,
    INDEX_RECORD,
    INDEX_RECORD_SIZE,
    crc32c,
)
from spark_audit.model import CONTENT_KEY, ORDERED_KEY

U8 = npt.NDArray[np.uint8]
U32 = npt.NDArray[np.uint32]
U64 = npt.NDArray[np.uint64]

# One entry header (codec.HEADER, ">IIQQQBBHIII").
HEADER_DTYPE = np.dtype(
    {
        "names": [
            "magic", "total", "index", "term", "position", "type", "version", "reserved",
            "body_size", "body_crc", "header_crc",
        ],
        "formats": [">u4", ">u4", ">u8", ">u8", ">u8", "u1", "u1", ">u2", ">u4", ">u4", ">u4"],
        "offsets": [0, 4, 8, 16, 24, 32, 33, 34, 36, 40, 44],
        "itemsize": ENTRY_HEADER_SIZE,
    }
)  # fmt: skip
# One index record (codec.INDEX_RECORD, ">IIQQQB27xI"); the 27 reserved bytes as pad0..pad3.
INDEX_DTYPE = np.dtype(
    {
        "names": [
            "magic", "size", "position", "term", "chain", "type", "pad0", "pad1", "pad2",
            "pad3", "crc",
        ],
        "formats": [
            ">u4", ">u4", ">u8", ">u8", ">u8", "u1", ">u8", ">u8", ">u2", "u1", ">u4",
        ],
        "offsets": [0, 4, 8, 16, 24, 32, 33, 41, 49, 51, 60],
        "itemsize": INDEX_RECORD_SIZE,
    }
)  # fmt: skip
# model.CONTENT_KEY (">QBII"): what the entry digest is the CRC32C of.
CONTENT_DTYPE = np.dtype(
    {
        "names": ["term", "type", "body_size", "body_crc"],
        "formats": [">u8", "u1", ">u4", ">u4"],
        "offsets": [0, 8, 9, 13],
        "itemsize": CONTENT_KEY.size,
    }
)
# model.ORDERED_KEY (">QQBII"): what the order-dependent checksum runs over.
ORDERED_DTYPE = np.dtype(
    {
        "names": ["index", "term", "type", "body_size", "body_crc"],
        "formats": [">u8", ">u8", "u1", ">u4", ">u4"],
        "offsets": [0, 8, 16, 17, 21],
        "itemsize": ORDERED_KEY.size,
    }
)
assert HEADER_DTYPE.itemsize == HEADER.size
assert INDEX_DTYPE.itemsize == INDEX_RECORD.size

_BITS_PER_BYTE = 8
_BYTE_VALUES = 256


@cache
def _tables(length: int) -> tuple[int, U32]:
    """``(crc32c(bytes(length)), T)`` with ``T[j][b]`` the change byte ``b`` at position ``j``
    makes to the CRC32C of ``length`` bytes (linear in ``b``: built from its 8 bits)."""
    zero = crc32c(bytes(length))
    basis = np.zeros((length, _BITS_PER_BYTE), dtype=np.uint32)
    probe = bytearray(length)
    for j in range(length):
        for bit in range(_BITS_PER_BYTE):
            probe[j] = 1 << bit
            basis[j, bit] = crc32c(bytes(probe)) ^ zero
        probe[j] = 0
    values = np.arange(_BYTE_VALUES, dtype=np.uint32)
    bits = ((values[:, None] >> np.arange(_BITS_PER_BYTE, dtype=np.uint32)) & 1).astype(bool)
    tables = np.zeros((length, _BYTE_VALUES), dtype=np.uint32)
    for j in range(length):
        tables[j] = np.bitwise_xor.reduce(np.where(bits, basis[j][None, :], 0), axis=1)
    return zero, tables


def crc32c_rows(rows: U8) -> U32:
    """CRC32C of every row of a 2-D uint8 array (rows of one fixed length)."""
    n, length = rows.shape
    zero, tables = _tables(length)
    acc = np.full(n, zero, dtype=np.uint32)
    for j in range(length):
        acc ^= tables[j].take(rows[:, j])
    return acc


def warm() -> None:
    """Build the tables the fast path uses (a few ms; done once per Python worker)."""
    for length in (HEADER_CRC_OFFSET, INDEX_CRC_OFFSET, CONTENT_KEY.size):
        _tables(length)


def content_digests(terms: U64, types: U8, body_sizes: U64, body_crcs: U64) -> U64:
    """``model.entry_digest`` of many entries: CRC32C of the content key, then the body CRC."""
    keys = np.empty(len(terms), dtype=CONTENT_DTYPE)
    keys["term"] = terms
    keys["type"] = types
    keys["body_size"] = body_sizes
    keys["body_crc"] = body_crcs
    raw = keys.view(np.uint8).reshape(len(terms), CONTENT_KEY.size)
    crcs = crc32c_rows(raw).astype(np.uint64)
    out: U64 = (crcs << np.uint64(32)) | body_crcs
    return out


def ordered_crc(
    first_index: int, terms: U64, types: U8, body_sizes: U64, body_crcs: U64, crc: int
) -> int:
    """The order-dependent checksum (``model.ORDERED_KEY`` of each entry in index order)
    carried on from ``crc`` over consecutive indexes from ``first_index``: one CRC call."""
    n = len(terms)
    keys = np.empty(n, dtype=ORDERED_DTYPE)
    keys["index"] = np.arange(first_index, first_index + n, dtype=np.uint64)
    keys["term"] = terms
    keys["type"] = types
    keys["body_size"] = body_sizes
    keys["body_crc"] = body_crcs
    return int(crc32c(keys.tobytes(), crc))


# ---------------------------------------------------------------------------------------
# Body CRCs of a run of equal-sized entries with one CRC32C call
# ---------------------------------------------------------------------------------------
#
# ``lin(m) = crc32c(m, 0xFFFFFFFF) ^ 0xFFFFFFFF`` is the CRC register run from 0 over ``m``:
# linear in ``m`` and ``lin(a + b) = Z^len(b)(lin(a)) ^ lin(b)``, with ``Z^d`` the (linear)
# effect of ``d`` zero bytes on the register. For an entry ``r = h44 + be32(hcrc) + body`` of
# ``L = 48 + B`` bytes whose header CRC is right, ``lin(r) = A_B(hcrc) ^ body_crc ^ K_B``
# (``A_B`` linear, ``K_B`` a constant, both fixed by B) exactly when its body CRC is right
# too. The entries of a run of equal size lie end to end, so the register over the whole
# run is the fold ``Z^L(...Z^L(lin(r0)) ^ lin(r1)...) ^ lin(r_n-1)``, computed as a tree
# (level k shifts by ``L * 2^k``) over numpy arrays; one hardware CRC32C call over the run
# gives the real register. They differ when any body of the run is corrupt: then every entry
# of the run is checked on its own. Two corrupt bodies in one run escape only if their
# effects cancel, with odds like those of a CRC collision (2^-32).

_MASK32 = 0xFFFFFFFF
_U32_BITS = 32
# Distinct body sizes whose run matrices are kept (each a few KB, a few ms to build).
RUN_MATRIX_CACHE = 256
# Shorter runs of equal-sized entries are checked one entry at a time (the fold's numpy
# calls cost more than that for a few entries).
MIN_RUN_ENTRIES = 256


def _lin(data: bytes | memoryview) -> int:
    return int(crc32c(data, _MASK32)) ^ _MASK32


def _apply_cols(cols: tuple[int, ...], x: int) -> int:
    out = 0
    k = 0
    while x:
        if x & 1:
            out ^= cols[k]
        x >>= 1
        k += 1
    return out


def _compose(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...]:
    """Columns of ``a`` after ``b`` (apply b, then a)."""
    return tuple(_apply_cols(a, c) for c in b)


@cache
def _zeros_pow2(log2_bytes: int) -> tuple[int, ...]:
    """Columns of ``Z^(2^log2_bytes)``."""
    if log2_bytes == 0:
        return tuple(_MASK32 ^ int(crc32c(b"\0", _MASK32 ^ (1 << k))) for k in range(_U32_BITS))
    half = _zeros_pow2(log2_bytes - 1)
    return _compose(half, half)


def _zeros(nbytes: int) -> tuple[int, ...]:
    """Columns of ``Z^nbytes`` (the identity for 0)."""
    cols = tuple(1 << k for k in range(_U32_BITS))
    bit = 0
    while nbytes:
        if nbytes & 1:
            cols = _compose(_zeros_pow2(bit), cols)
        nbytes >>= 1
        bit += 1
    return cols


def _byte_tables(cols: tuple[int, ...]) -> U32:
    """4 x 256 tables: ``x -> t[0][x & 255] ^ t[1][x >> 8 & 255] ^ ...`` applies ``cols``."""
    col = np.array(cols, dtype=np.uint32).reshape(4, _BITS_PER_BYTE)
    values = np.arange(_BYTE_VALUES, dtype=np.uint32)
    bits = ((values[:, None] >> np.arange(_BITS_PER_BYTE, dtype=np.uint32)) & 1).astype(bool)
    out = np.zeros((4, _BYTE_VALUES), dtype=np.uint32)
    for q in range(4):
        out[q] = np.bitwise_xor.reduce(np.where(bits, col[q][None, :], 0), axis=1)
    return out


def _apply(tables: U32, x: U32) -> U32:
    out: U32 = tables[0].take(x & 0xFF)
    out ^= tables[1].take((x >> 8) & 0xFF)
    out ^= tables[2].take((x >> 16) & 0xFF)
    out ^= tables[3].take(x >> 24)
    return out


@lru_cache(maxsize=RUN_MATRIX_CACHE)
def _run_matrices(body_bytes: int) -> tuple[U32, int, U32]:
    """(tables of A_B, K_B, tables of Z^L) for entries of ``body_bytes`` (see above)."""
    z4 = _zeros(4)
    zb = _zeros(body_bytes)
    # A_B(x) = Z^B(Z^4(x) ^ lin(be32(x)))
    inner = tuple(_apply_cols(z4, 1 << k) ^ _lin((1 << k).to_bytes(4, "big"))
                  for k in range(_U32_BITS))  # fmt: skip
    a_b = _compose(zb, inner)
    zero44 = int(crc32c(bytes(HEADER_CRC_OFFSET)))
    k_b = _apply_cols(zb, _apply_cols(z4, zero44)) ^ _zero_crc(body_bytes, zb)
    return _byte_tables(a_b), k_b, _byte_tables(_zeros(ENTRY_HEADER_SIZE + body_bytes))


def _zero_crc(nbytes: int, zn: tuple[int, ...]) -> int:
    """``crc32c(bytes(nbytes))`` without the bytes: ``~Z^n(~0)``."""
    return _MASK32 ^ _apply_cols(zn, _MASK32)


@lru_cache(maxsize=RUN_MATRIX_CACHE)
def _shift_tables(entry_bytes: int, level: int) -> U32:
    """Tables of ``Z^(entry_bytes * 2^level)``."""
    return _byte_tables(_zeros(entry_bytes << level))


def run_bodies_ok(buf: bytes | memoryview, start: int, body_bytes: int, hcrc: U64,
                  body_crc: U64) -> bool:  # fmt: skip
    """True when every entry of the run of ``len(hcrc)`` entries of ``body_bytes`` from byte
    ``start`` of ``buf`` (their header CRCs already checked) has the body CRC its header
    says (one CRC32C call over the run, see above)."""
    n = len(hcrc)
    entry = ENTRY_HEADER_SIZE + body_bytes
    a_b, k_b, _ = _run_matrices(body_bytes)
    lin = _apply(a_b, hcrc.astype(np.uint32)) ^ body_crc.astype(np.uint32) ^ np.uint32(k_b)
    size = 1 << max(n - 1, 0).bit_length()
    fold = np.zeros(size, dtype=np.uint32)
    fold[size - n :] = lin  # zero entries in front add nothing
    level = 0
    while len(fold) > 1:
        fold = _apply(_shift_tables(entry, level), fold[0::2]) ^ fold[1::2]
        level += 1
    return int(fold[0]) == _lin(memoryview(buf)[start : start + n * entry])


def bodies_ok(
    buf: bytes | memoryview, offs: npt.NDArray[np.intp], sizes: U64, hcrc: U64, body_crc: U64
) -> npt.NDArray[np.bool_]:
    """Per entry (at ``offs``, ``sizes`` bytes each, end to end, header CRCs right): is its
    body CRC right? Runs of at least MIN_RUN_ENTRIES equal sizes take one CRC32C call each;
    other entries (and the entries of a run that fails) take one call per entry."""
    n = len(offs)
    ok = np.zeros(n, dtype=np.bool_)
    done = np.zeros(n, dtype=np.bool_)
    if n >= MIN_RUN_ENTRIES:
        bounds = np.concatenate(([0], np.flatnonzero(sizes[1:] != sizes[:-1]) + 1, [n]))
        for r in np.flatnonzero(np.diff(bounds) >= MIN_RUN_ENTRIES).tolist():
            a, b = int(bounds[r]), int(bounds[r + 1])
            body = int(sizes[a]) - ENTRY_HEADER_SIZE
            if run_bodies_ok(buf, int(offs[a]), body, hcrc[a:b], body_crc[a:b]):
                ok[a:b] = True
                done[a:b] = True
    rest = np.flatnonzero(~done)
    if len(rest):
        mv = memoryview(buf)
        starts = (offs[rest] + ENTRY_HEADER_SIZE).tolist()
        ends = (offs[rest] + sizes[rest].astype(np.intp)).tolist()
        crcs = np.fromiter(
            (crc32c(mv[a:b]) for a, b in zip(starts, ends, strict=True)),
            dtype=np.uint64,
            count=len(rest),
        )
        ok[rest] = crcs == body_crc[rest]
    return ok
