"""Majority arithmetic (dledger.core.quorum) against brute-force definitions, for random
configurations of 1 to MAX_GROUP_SIZE voters."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dledger.core import MAX_GROUP_SIZE
from dledger.core.quorum import VoteResult, committed_index, has_quorum, majority, vote_result

IDS = [f"n{i}" for i in range(MAX_GROUP_SIZE + 3)]
voter_sets = st.sets(st.sampled_from(IDS[:MAX_GROUP_SIZE]), min_size=1)
indexes = st.integers(min_value=0, max_value=1 << 40)


@pytest.mark.parametrize(("n", "need"), [(1, 1), (2, 2), (3, 2), (4, 3), (5, 3), (7, 4)])
def test_majority_is_more_than_half(n: int, need: int) -> None:
    assert majority(n) == need


@given(st.lists(indexes, min_size=1, max_size=MAX_GROUP_SIZE))
def test_committed_index_is_the_largest_index_a_majority_holds(matches: list[int]) -> None:
    got = committed_index(list(matches))
    holders = sum(1 for m in matches if m >= got)
    assert holders >= majority(len(matches))  # a majority holds it ...
    # ... and no larger index is held by a majority (the next candidate is the next match).
    larger = [m for m in matches if m > got]
    for candidate in larger:
        assert sum(1 for m in matches if m >= candidate) < majority(len(matches))


@given(st.lists(indexes, min_size=1, max_size=MAX_GROUP_SIZE), st.randoms())
def test_committed_index_does_not_depend_on_the_order(
    matches: list[int], rnd: random.Random
) -> None:
    shuffled = list(matches)
    rnd.shuffle(shuffled)
    assert committed_index(shuffled) == committed_index(list(matches))


@given(st.lists(indexes, min_size=1, max_size=MAX_GROUP_SIZE), st.integers(0, MAX_GROUP_SIZE))
def test_committed_index_never_falls_when_a_match_grows(matches: list[int], which: int) -> None:
    before = committed_index(list(matches))
    grown = list(matches)
    grown[which % len(grown)] += 1
    assert committed_index(grown) >= before


@given(voter_sets, st.dictionaries(st.sampled_from(IDS), st.booleans()))
def test_vote_result_counts_voters_only(voters: set[str], votes: dict[str, bool]) -> None:
    granted = sum(1 for v, g in votes.items() if g and v in voters)
    rejected = sum(1 for v, g in votes.items() if not g and v in voters)
    result = vote_result(voters, votes)
    need = majority(len(voters))
    assert (result is VoteResult.WON) == (granted >= need)
    assert (result is VoteResult.LOST) == (rejected >= need)
    # Two majorities of one voter set intersect: never both.
    assert not (granted >= need and rejected >= need)


def test_answers_of_non_voters_do_not_win_an_election() -> None:
    voters = {"n0", "n1", "n2"}
    votes = {"n0": True, "n7": True, "n8": True, "n9": True}  # learners or removed members
    assert vote_result(voters, votes) is VoteResult.PENDING
    assert vote_result(voters, {**votes, "n1": True}) is VoteResult.WON
    assert vote_result(voters, {"n1": False, "n2": False}) is VoteResult.LOST


@given(voter_sets, st.sets(st.sampled_from(IDS)))
def test_has_quorum_counts_voters_among_the_members(voters: set[str], members: set[str]) -> None:
    assert has_quorum(voters, members) == (len(voters & members) >= majority(len(voters)))


@given(voter_sets, st.sets(st.sampled_from(IDS)), st.sets(st.sampled_from(IDS)))
def test_two_quorums_of_one_configuration_share_a_voter(
    voters: set[str], a: set[str], b: set[str]
) -> None:
    if has_quorum(voters, a) and has_quorum(voters, b):
        assert voters & a & b
