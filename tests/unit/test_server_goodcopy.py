"""The good copy check of a repairing member (dledger/server/goodcopy.py, docs/STORAGE.md
"When it cannot repair"): it stops only when every member answered and none can supply the
entries it lacks; an unreachable member, a leader or a holder keeps it waiting."""

from __future__ import annotations

import asyncio

from raftmq.dledger.v1 import dledger_pb2 as pb

from dledger.server.goodcopy import (
    MAX_INDEX,
    ROUNDS_TO_STOP,
    GoodCopyCheck,
    Holding,
    holding_from,
    needed_range,
    no_good_copy,
    to_response,
)
from dledger.storage.store import StoreClosedError


def _h(
    member: str, last: int, *, repairing: bool = False, target: int = 0, leader: str = ""
) -> Holding:
    return Holding(member, 1, last, 1, 1, repairing, target if repairing else 0, 0, leader)


ME = _h("n1", 673, repairing=True, target=726)


def test_the_needed_range_is_what_the_repair_lacks() -> None:
    assert needed_range(673, 726) == (674, 726)
    assert needed_range(673, 673) is None  # an unknown promise waits for a leader
    assert needed_range(673, 0) is None


def test_no_good_copy_only_when_all_answered_and_none_holds_or_leads() -> None:
    voters = ["n0", "n2"]
    lacking = {"n0": _h("n0", 341), "n2": _h("n2", 673, repairing=True, target=726)}
    assert no_good_copy(674, voters, lacking)
    # A member that does not answer (unreachable, restarting, out of bounds): wait.
    assert not no_good_copy(674, voters, {**lacking, "n0": None})
    assert not no_good_copy(674, voters, {"n2": lacking["n2"]})
    # A member that holds the entry, repairing (above it) or not: wait.
    assert not no_good_copy(674, voters, {**lacking, "n0": _h("n0", 674)})
    assert not no_good_copy(
        674, voters, {**lacking, "n2": _h("n2", 700, repairing=True, target=726)}
    )
    # A member that follows a leader: the leader repairs (or its term's entry ends the repair).
    assert not no_good_copy(674, voters, {**lacking, "n0": _h("n0", 341, leader="n0")})


def test_answers_out_of_bounds_count_as_no_answer() -> None:
    good = to_response(_h("n0", 10), chain=7)
    assert holding_from("n0", good) == _h("n0", 10)
    for bad in (
        pb.HoldingsResponse(first_index=MAX_INDEX + 1, last_index=10),
        pb.HoldingsResponse(first_index=1, last_index=MAX_INDEX + 1),
        pb.HoldingsResponse(first_index=20, last_index=10),
        pb.HoldingsResponse(first_index=1, last_index=10, cut_from=MAX_INDEX + 1),
        pb.HoldingsResponse(first_index=1, last_index=10, leader_id="x" * 1000),
    ):
        assert holding_from("n0", bad) is None


def _check(answers: dict[str, Holding | None]) -> GoodCopyCheck:
    async def ask(member: str) -> Holding | None:
        return answers[member]

    return GoodCopyCheck(lambda: ME, lambda: ["n0", "n1", "n2"], ask)


def test_the_verdict_must_hold_in_consecutive_rounds_and_names_everything() -> None:
    answers: dict[str, Holding | None] = {
        "n0": _h("n0", 341),
        "n2": _h("n2", 673, repairing=True, target=726),
    }
    check = _check(answers)
    causes = [asyncio.run(check.round()) for _ in range(ROUNDS_TO_STOP - 1)]
    assert causes == [None] * (ROUNDS_TO_STOP - 1)
    # One round with a member unreachable starts the count again.
    answers["n0"] = None
    assert asyncio.run(check.round()) is None
    answers["n0"] = _h("n0", 341)
    causes = [asyncio.run(check.round()) for _ in range(ROUNDS_TO_STOP)]
    cause = causes[-1]
    assert causes[:-1] == [None] * (ROUNDS_TO_STOP - 1) and cause is not None
    assert cause.startswith("NO_GOOD_COPY indexes=674..726")
    for m in ("n0: log 1..341", "n1: log 1..673", "n2: log 1..673", "Restore a good copy"):
        assert m in cause
    assert len(cause) <= 500  # the FATAL line keeps it whole


def test_a_member_not_repairing_never_asks() -> None:
    asked: list[str] = []

    async def ask(member: str) -> Holding | None:
        asked.append(member)
        return None

    check = GoodCopyCheck(lambda: _h("n1", 10), lambda: ["n0", "n1"], ask)
    assert asyncio.run(check.round()) is None and asked == [] and check.rounds == 0


def test_a_store_being_replaced_skips_the_round() -> None:
    """A snapshot install closes the store under the check (it once ended the process with
    FATAL component=good-copy cause=StoreClosedError): that round is skipped."""
    asked: list[str] = []

    async def ask(member: str) -> Holding | None:
        asked.append(member)
        return None

    def closed() -> Holding:
        raise StoreClosedError("store s is closed")

    check = GoodCopyCheck(closed, lambda: ["n0", "n1"], ask)
    assert asyncio.run(check.round()) is None and asked == [] and check.rounds == 0
