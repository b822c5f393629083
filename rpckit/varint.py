"""Protobuf base-128 varints, for the wire encodings written by hand (the peers' appends,
``dledger.server.peerwire``; the pull answers, ``broker.frontends.v1.pullwire``)."""

from __future__ import annotations

# Varints below this are one byte: precomputed.
_ONE_BYTE = [bytes((n,)) for n in range(0x80)]
_U64 = 1 << 64


def varint(n: int) -> bytes:
    """``n`` as a protobuf varint, as the runtime writes an int64 or uint64 field: a negative
    int64 is ten bytes (two's complement in 64 bits)."""
    assert -(1 << 63) <= n < _U64, n
    if 0 <= n < 0x80:
        return _ONE_BYTE[n]
    n %= _U64
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)
