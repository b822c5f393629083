"""CRC32C helpers the audit needs beyond ``dledger.storage.codec.crc32c``.

``crc32c_combine`` joins the CRCs of two byte strings into the CRC of their concatenation
without the bytes (zlib's ``crc32_combine`` for the Castagnoli polynomial): the audit computes
an order-dependent checksum per piece of a segment in parallel and joins the pieces in index
order on the driver, so replicas that cut their segments at different indexes still compare.
"""

from __future__ import annotations

# Castagnoli polynomial 0x1EDC6F41, bit-reflected (the form the CRC is computed in).
CRC32C_POLY_REFLECTED = 0x82F63B78
_BITS = 32


def _gf2_times(matrix: list[int], vector: int) -> int:
    total = 0
    i = 0
    while vector:
        if vector & 1:
            total ^= matrix[i]
        vector >>= 1
        i += 1
    return total


def _gf2_square(matrix: list[int]) -> list[int]:
    return [_gf2_times(matrix, matrix[n]) for n in range(_BITS)]


def crc32c_combine(crc1: int, crc2: int, len2_bytes: int) -> int:
    """CRC32C of ``a + b`` given ``crc1 = crc32c(a)``, ``crc2 = crc32c(b)``, ``len(b)``."""
    if len2_bytes < 0:
        raise ValueError(f"len2_bytes={len2_bytes} < 0")
    if len2_bytes == 0:
        return crc1
    # Operator for one zero bit, then squared to 2 and 4 bits; the loop squares on to bytes.
    odd = [CRC32C_POLY_REFLECTED] + [1 << n for n in range(_BITS - 1)]
    even = _gf2_square(odd)
    odd = _gf2_square(even)
    while True:
        even = _gf2_square(odd)
        if len2_bytes & 1:
            crc1 = _gf2_times(even, crc1)
        len2_bytes >>= 1
        if not len2_bytes:
            break
        odd = _gf2_square(even)
        if len2_bytes & 1:
            crc1 = _gf2_times(odd, crc1)
        len2_bytes >>= 1
        if not len2_bytes:
            break
    return crc1 ^ crc2
