"""The chained checksum of a Raft log: an entry's identity includes its content.

``chain(i) = H(chain(i - 1), index, term, type, body length, CRC32C of the body)`` and
``chain(0) = CHAIN_ORIGIN``. Equal chains at index ``i`` on two members mean (up to the
collision bound in docs/FORMAT.md, "Chained checksum") that their entries ``1..i`` are the
same entries with the same content, so a single value summarises a whole prefix: Raft's log
matching compares it where it compared the term (docs/RAFT.md, section 13).

``H`` is BLAKE2b with an 8-byte digest over a fixed 37-byte record (every field big-endian)::

    prev_chain u64 | index u64 | term u64 | type u8 | body_size u32 | body_crc32c u32 | b"RMQC"

A digest of 0 is mapped to 1: the value 0 is reserved for "unknown" (``CHAIN_UNKNOWN``: a
store migrated from a release without chains whose prefix was already deleted, or a peer
that carries no chain), and an unknown value agrees with every value (``agree``).

This module is the one place the function lives: the Raft core, the log store, the
simulator's in-memory log and the audit all call it. Pure computation, no I/O.
"""

from __future__ import annotations

import struct
from hashlib import blake2b

import crc32c as _crc32c

# chain(0): the empty prefix. b"raftmqC0" as a big-endian u64; any fixed non-zero value works,
# this one is recognisable in a hex dump.
CHAIN_ORIGIN = 0x7261_6674_6D71_4330
# "No chain known here" (never the output of the function).
CHAIN_UNKNOWN = 0
CHAIN_BITS = 64
CHAIN_MAX = (1 << CHAIN_BITS) - 1
# The record hashed per entry (see the module docstring); the tag separates it from any other
# use of BLAKE2b-64 over 37 bytes.
_RECORD = struct.Struct(">QQQBII4s")
_TAG = b"RMQC"
CHAIN_RECORD_SIZE = _RECORD.size
assert CHAIN_RECORD_SIZE == 37

crc32c = _crc32c.crc32c


def link(prev: int, index: int, term: int, type: int, body_size: int, body_crc: int) -> int:
    """The chain at ``index`` from the chain at ``index - 1`` and the entry's fields (the
    store calls this with the body CRC it computes anyway)."""
    digest = blake2b(
        _RECORD.pack(prev, index, term, type, body_size, body_crc, _TAG), digest_size=8
    ).digest()
    value = int.from_bytes(digest, "big")
    return value if value != CHAIN_UNKNOWN else 1


def next_chain(prev: int, index: int, term: int, type: int, body: bytes | memoryview) -> int:
    """The chain at ``index`` for an entry with this body; unknown stays unknown."""
    if prev == CHAIN_UNKNOWN:
        return CHAIN_UNKNOWN
    return link(prev, index, term, type, len(body), crc32c(body))


def agree(a: int, b: int) -> bool:
    """Whether two chain values may belong to the same prefix: equal, or one is unknown."""
    return a == b or CHAIN_UNKNOWN in (a, b)


def fmt(value: int) -> str:
    """A chain value as log lines and errors show it (16 hex digits; "unknown" for 0)."""
    return "unknown" if value == CHAIN_UNKNOWN else f"{value:016x}"
