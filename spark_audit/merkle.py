"""Digests of fixed ranges of Raft indexes and the tree above them (a Merkle-style tree).

A **leaf** is a fixed range of ``LEAF_ENTRIES`` Raft indexes: leaf ``k`` holds indexes
``[k * LEAF_ENTRIES + 1, (k + 1) * LEAF_ENTRIES]``. Its digest on a replica is the pair
``(count, sum)``: how many of the leaf's audited indexes the replica holds readably, and the
sum mod 2^64 of ``entry_mix(index, term, entry_digest)`` over them (``entry_digest`` covers
the type, body size and body CRC: ``model.entry_digest``). Nothing in it depends on where the
entries lie on disk, so replicas whose segments are cut at different indexes (another
segment size, another retention point) have equal leaves when they hold equal entries. The
sum is additive: the tasks of an audit that split a leaf report partial sums the driver adds.

Above the leaves, a node of level ``L`` covers ``FANOUT`` nodes of level ``L - 1``; its
digest is a 64-bit BLAKE2b of its children's digests, in order (a leaf's digest there is
its count and sum). Comparing replicas starts at the root and descends only into the
children whose digests differ, so a divergence is pinned to a leaf in ``levels`` rounds of
at most ``FANOUT`` comparisons, whatever the log's length.

Like the rest of the audit, the digests find replication bugs and disk damage, not an
attacker who forges entries to collide on purpose (the mix is not a cryptographic hash).
"""

from __future__ import annotations

import hashlib
import struct
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

U64 = npt.NDArray[np.uint64]

# Raft indexes per leaf: 4,096 entries are 0.5 to 64 MiB of log (128 B to 16 KiB bodies),
# small enough that a divergence is pinned to a range a person can read entry by entry,
# large enough that a 1 GiB replica of 128 B entries has about 1,400 leaves (a few KB).
LEAF_ENTRIES = 4096
# The smallest and largest leaf a user may choose (--leaf-entries; tests use small leaves).
MIN_LEAF_ENTRIES = 1
MAX_LEAF_ENTRIES = 1 << 24
# Children per inner node: 16 keeps the tree at 3 levels above the leaves up to 16.7 M
# entries (4,096 leaves) and a round's comparison at 16 digests per differing node.
FANOUT = 16
# Bytes of an inner node's digest (BLAKE2b output size).
NODE_DIGEST_BYTES = 8
_LEAF_PACK = struct.Struct(">QQQ")  # leaf number, count, sum
_U64_MASK = (1 << 64) - 1
# splitmix64's constants (Steele, Lea, Flood 2014): a fast 64-bit mix with full avalanche.
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)


def leaf_of(index: int, leaf_entries: int = LEAF_ENTRIES) -> int:
    assert index >= 1 and leaf_entries >= 1, (index, leaf_entries)
    return (index - 1) // leaf_entries


def leaf_span(leaf: int, leaf_entries: int = LEAF_ENTRIES) -> tuple[int, int]:
    """First and last Raft index of ``leaf`` (inclusive)."""
    return leaf * leaf_entries + 1, (leaf + 1) * leaf_entries


def _splitmix(x: U64) -> U64:
    with np.errstate(over="ignore"):
        z = x + _GOLDEN
        z = (z ^ (z >> np.uint64(30))) * _MIX1
        z = (z ^ (z >> np.uint64(27))) * _MIX2
        out: U64 = z ^ (z >> np.uint64(31))
    return out


def entry_mix(indexes: U64, terms: U64, digests: U64) -> U64:
    """One 64-bit value per entry from its (index, term, content digest): each input goes
    through a full-avalanche mix before the next is folded in, so any change to any of the
    three changes the value like a random draw."""
    return _splitmix(digests ^ _splitmix(terms ^ _splitmix(indexes)))


def leaf_sums(
    first_index: int,
    terms: U64,
    digests: U64,
    held: npt.NDArray[np.bool_],
    leaf_entries: int = LEAF_ENTRIES,
) -> list[tuple[int, int, int]]:
    """``(leaf, count, sum)`` of consecutive indexes from ``first_index`` (only the held
    ones count), one tuple per leaf they touch, in order."""
    n = len(terms)
    if n == 0:
        return []
    indexes = np.arange(first_index, first_index + n, dtype=np.uint64)
    mixes = np.where(held, entry_mix(indexes, terms, digests), np.uint64(0))
    leaves = (indexes - np.uint64(1)) // np.uint64(leaf_entries)
    starts = np.concatenate(([0], np.flatnonzero(leaves[1:] != leaves[:-1]) + 1))
    sums = np.add.reduceat(mixes, starts, dtype=np.uint64)
    counts = np.add.reduceat(held.astype(np.int64), starts)
    return [
        (int(leaves[s]), int(c), int(v))
        for s, c, v in zip(starts.tolist(), counts.tolist(), sums.tolist(), strict=True)
    ]


@dataclass(frozen=True, slots=True)
class Leaf:
    count: int
    sum: int

    def add(self, count: int, value: int) -> Leaf:
        return Leaf(self.count + count, (self.sum + value) & _U64_MASK)


def node_digest(children: Iterable[bytes]) -> bytes:
    h = hashlib.blake2b(digest_size=NODE_DIGEST_BYTES)
    for c in children:
        h.update(c)
    return h.digest()


@dataclass(slots=True)
class Tree:
    """One replica's tree over leaves ``0 .. n_leaves - 1`` (a leaf it has no digest of is
    empty: count 0, sum 0)."""

    leaves: dict[int, Leaf]
    n_leaves: int
    levels: list[list[bytes]] = field(default_factory=list)  # levels[0]: leaf digests

    def __post_init__(self) -> None:
        level = [_LEAF_PACK.pack(k, *_leaf_tuple(self.leaves.get(k))) for k in range(self.n_leaves)]
        self.levels = [level]
        while len(level) > 1:
            level = [node_digest(level[i : i + FANOUT]) for i in range(0, len(level), FANOUT)]
            self.levels.append(level)

    @property
    def root(self) -> bytes:
        return self.levels[-1][0] if self.levels and self.levels[-1] else b""


def _leaf_tuple(leaf: Leaf | None) -> tuple[int, int]:
    return (0, 0) if leaf is None else (leaf.count, leaf.sum)


@dataclass(frozen=True, slots=True)
class Descent:
    """What comparing the trees found: the leaves that differ and what it cost."""

    differing_leaves: tuple[int, ...]
    rounds: int  # levels descended (root to leaves)
    nodes_compared: int  # node digests compared, over all rounds


def descend(trees: Mapping[str, Tree]) -> Descent:
    """Leaves where the replicas' digests differ, found from the root down, looking only
    into children of nodes that differ."""
    if not trees:
        return Descent((), 0, 0)
    any_tree = next(iter(trees.values()))
    depth = len(any_tree.levels)
    assert all(len(t.levels) == depth for t in trees.values()), "trees of different heights"
    if depth == 0 or not any_tree.levels[0]:
        return Descent((), 0, 0)
    frontier = [0]
    compared = 0
    rounds = 0
    for level in range(depth - 1, -1, -1):
        compared += len(frontier)
        differing = [k for k in frontier if len({t.levels[level][k] for t in trees.values()}) > 1]
        rounds += 1
        if level == 0 or not differing:
            return Descent(tuple(differing) if level == 0 else (), rounds, compared)
        width = len(any_tree.levels[level - 1])
        frontier = [c for k in differing for c in range(k * FANOUT, min((k + 1) * FANOUT, width))]
    return Descent((), rounds, compared)  # pragma: no cover (the loop returns at level 0)


@dataclass(frozen=True, slots=True)
class LeafVerdict:
    """One differing leaf: the digest a strict majority of the comparable replicas hold (if
    any), who holds it, and who disagrees with it."""

    leaf: int
    majority: Leaf | None
    agreeing: tuple[str, ...]
    disagreeing: tuple[str, ...]


def judge_leaf(leaf: int, digests: Mapping[str, Leaf]) -> LeafVerdict:
    """The verdict over the replicas in ``digests`` (those expected to hold the whole leaf):
    a replica is damaged on the leaf when a strict majority of them holds another digest."""
    counts = Counter(digests.values())
    top, top_n = counts.most_common(1)[0] if counts else (None, 0)
    if top is None or top_n * 2 <= len(digests):
        return LeafVerdict(leaf, None, (), tuple(sorted(digests)))
    agreeing = tuple(sorted(r for r, d in digests.items() if d == top))
    disagreeing = tuple(sorted(r for r, d in digests.items() if d != top))
    return LeafVerdict(leaf, top, agreeing, disagreeing)
