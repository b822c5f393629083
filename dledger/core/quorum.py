"""Majority arithmetic over a set of voters (etcd's ``quorum`` package), pure and small.

A configuration is the set of its voters (learners count towards nothing). Membership
changes add or remove one server at a time (docs/RAFT.md section 9), so that any two
consecutive configurations share a majority and no joint configuration exists: every rule
here is over one voter set.

* :func:`majority`: the least number of voters that is a majority.
* :func:`committed_index`: the largest index that a majority of voters holds, given each
  voter's match.
* :func:`vote_result`: whether an election is won, lost or still open.
* :func:`has_quorum`: whether the voters in a set (the ones recently heard) are a majority.
"""

from __future__ import annotations

import enum
from collections.abc import Collection, Mapping

__all__ = ["VoteResult", "committed_index", "has_quorum", "majority", "vote_result"]


class VoteResult(enum.Enum):
    PENDING = "pending"  # neither a majority granted nor a majority refused yet
    WON = "won"
    LOST = "lost"


def majority(voters: int) -> int:
    """The least number of ``voters`` (at least 1) that is a majority of them."""
    assert voters >= 1, f"a configuration of {voters} voters"
    return voters // 2 + 1


def committed_index(matches: list[int]) -> int:
    """The largest index at or below which a majority of the voters holds the log, given
    one match per voter (an index each holds, in any order). Sorts ``matches`` in place:
    the caller hands a list built for the call (one allocation per commit check)."""
    matches.sort(reverse=True)
    return matches[majority(len(matches)) - 1]


def vote_result(voters: Collection[str], votes: Mapping[str, bool]) -> VoteResult:
    """The outcome of an election among ``voters``, given the answers so far (``votes``:
    voter id to granted). Answers of non-voters count for nothing."""
    need = majority(len(voters))
    granted = rejected = 0
    for voter, grant in votes.items():
        if voter in voters:
            if grant:
                granted += 1
            else:
                rejected += 1
    if granted >= need:
        return VoteResult.WON
    if rejected >= need:
        return VoteResult.LOST
    return VoteResult.PENDING


def has_quorum(voters: Collection[str], members: Collection[str]) -> bool:
    """Whether the voters among ``members`` are a majority of ``voters``."""
    return sum(1 for m in members if m in voters) >= majority(len(voters))
