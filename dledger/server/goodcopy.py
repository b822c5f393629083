"""No good copy: a repairing member that no member can repair stops (docs/STORAGE.md "When it
cannot repair").

A member whose log ends below what it promised (a damage cut at open, a rolled-back store) is
repairing: it waits for a leader to send it the entries ``last + 1 .. target`` it lacks
(docs/RAFT.md section 11). If the same entries were lost on a majority, no leader can ever be
elected that holds them, and every damaged member would wait for ever. Telling that from
"the members that hold them are unreachable" needs the members to say what they hold: every
``GOOD_COPY_INTERVAL_MS`` a repairing member with a needed range asks every other voter of
its configuration (the peer port's ``Holdings``, authenticated as ``Stream``).

**The verdict** (:func:`no_good_copy`). With ``n`` the first index the member needs (its
last index + 1), a good copy *may exist* while any of these holds:

* a voter did not answer, or answered something out of bounds (unreachable, restarting,
  hostile: not known to lack it);
* a voter follows a leader, or is one (a leader repairs this member, or its own term's entry
  ends the repair);
* a voter's log holds ``n`` (``last_index >= n``): repairing or not, its copy was checked at
  its open and survives; if it is repairing only above ``n`` it still holds it.

Otherwise (every voter answered, none follows a leader, none holds ``n``) no member holds the
entry: nothing but an operator's restore can bring it back. The verdict must hold in
``ROUNDS_TO_STOP`` consecutive rounds (a member restarting between two answers); the node
then logs the verdict, keeps answering for ``STOP_GRACE_ROUNDS`` rounds (members in the same
state are still counting theirs: a member that vanished would look unreachable to them and
keep them waiting) and ends with ``FATAL component=repair cause=NO_GOOD_COPY ...`` naming
the range, each member's answer and what to do. A partition that heals therefore never
leaves a member stopped: an unreachable member keeps it waiting.

Answers are bounded (indexes and terms at most ``MAX_INDEX``, ids at most
``MAX_NODE_ID_CHARS``); one out of bounds counts as no answer.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import grpc
from raftmq.dledger.v1 import dledger_pb2 as pb
from raftmq.dledger.v1 import dledger_pb2_grpc as pb_grpc

from dledger.server.convert import MAX_NODE_ID_CHARS
from dledger.storage.store import StoreClosedError
from mqsecurity.channels import open_aio_channel
from prockit.fatal import fatal

if TYPE_CHECKING:
    from dledger.server.node import DLedgerNode

logger = logging.getLogger(__name__)

# A round every 2 s while repairing: one small unary call per member, nothing otherwise.
GOOD_COPY_INTERVAL_MS = 2_000
# Each call's deadline: a member slower than this counts as unreachable for the round.
HOLDINGS_TIMEOUT_MS = 2_000
# Consecutive rounds with the verdict "no good copy" before the node stops: a member that
# restarts between two rounds (its log not open yet) must not end another one.
ROUNDS_TO_STOP = 3
# Rounds a member that reached the verdict keeps answering before it ends: members in the
# same state that started up to this many rounds later still see its answer to the end.
STOP_GRACE_ROUNDS = ROUNDS_TO_STOP + 1
# Indexes and terms are int64 in the core: larger answers are out of bounds.
MAX_INDEX = (1 << 63) - 1
# Where the operator reads what to do.
DOCS = 'docs/STORAGE.md "When it cannot repair"'


@dataclass(frozen=True, slots=True)
class Holding:
    """One member's answer: what its log holds."""

    member: str
    first_index: int
    last_index: int
    last_term: int
    term: int
    repairing: bool
    repair_target: int
    cut_from: int
    leader_id: str

    def describe(self) -> str:
        """Short (the FATAL line keeps 500 characters): ``n1: log 1..673 t1 repairing to 726
        cut 674``."""
        state = f"repairing to {self.repair_target}" if self.repairing else "voting"
        cut = f" cut {self.cut_from}" if self.cut_from else ""
        leader = f" leader {self.leader_id}" if self.leader_id else ""
        return (
            f"{self.member}: log {self.first_index}..{self.last_index} t{self.term} "
            f"{state}{cut}{leader}"
        )


def holding_from(member: str, resp: pb.HoldingsResponse) -> Holding | None:
    """The answer, or None when a field is out of bounds (counted as no answer)."""
    ints = (resp.first_index, resp.last_index, resp.last_term, resp.term, resp.repair_target)
    if any(v > MAX_INDEX for v in (*ints, resp.cut_from)):
        return None
    if resp.first_index > resp.last_index + 1 or len(resp.leader_id) > MAX_NODE_ID_CHARS:
        return None
    return Holding(
        member,
        resp.first_index,
        resp.last_index,
        resp.last_term,
        resp.term,
        resp.repairing,
        resp.repair_target if resp.repairing else 0,
        resp.cut_from,
        resp.leader_id,
    )


def needed_range(last_index: int, repair_target: int) -> tuple[int, int] | None:
    """The entries a repairing member lacks, ``(first, last)``; None when it lacks none (an
    unknown promise waits for a leader, not for entries)."""
    if repair_target <= last_index:
        return None
    return last_index + 1, repair_target


def no_good_copy(
    needed_first: int, voters: Sequence[str], answers: Mapping[str, Holding | None]
) -> bool:
    """Whether no voter can supply entry ``needed_first``: every voter answered, none follows
    or is a leader, and none holds the entry (module docstring)."""
    for v in voters:
        h = answers.get(v)
        if h is None or h.leader_id or h.last_index >= needed_first:
            return False
    return True


def verdict(
    me: Holding, needed: tuple[int, int], voters: Sequence[str], answers: Mapping[str, Holding]
) -> str:
    """The FATAL cause: the range, every member's answer and what the operator can do."""
    lines = "; ".join(answers[v].describe() for v in voters if v in answers)
    return (
        f"NO_GOOD_COPY indexes={needed[0]}..{needed[1]} no member holds them, all answered: "
        f"{me.describe()}; {lines}. Restore a good copy of the log on one member (a backup, "
        f"or a store from before the damage), then start the members: {DOCS}"
    )


Ask = Callable[[str], Awaitable[Holding | None]]


class GoodCopyCheck:
    """The rounds of one repairing member (``DLedgerNode``'s task ``good-copy``)."""

    def __init__(
        self,
        me: Callable[[], Holding],
        voters: Callable[[], Sequence[str]],
        ask: Ask,
        interval_ms: int = GOOD_COPY_INTERVAL_MS,
    ) -> None:
        assert interval_ms > 0
        self._me = me
        self._voters = voters
        self._ask = ask
        self._interval_s = interval_ms / 1000
        self.rounds = 0  # rounds made (each asked every other voter)
        self._strikes = 0  # consecutive rounds with the verdict "no good copy"
        self._last_note = ""

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self._interval_s)
            cause = await self.round()
            if cause is not None:
                break
        # Other members in the same state are still counting their rounds: an answer that
        # stops now would look unreachable to them and keep them waiting for ever. Answer
        # (repairing, as before: no vote, no quorum) for as long as their rounds take.
        grace_s = STOP_GRACE_ROUNDS * self._interval_s + HOLDINGS_TIMEOUT_MS / 1000
        logger.error("%s (stopping in %.0f s)", cause, grace_s)
        await asyncio.sleep(grace_s)
        fatal("repair", cause)

    async def round(self) -> str | None:
        """One round; the FATAL cause when the verdict held ``ROUNDS_TO_STOP`` times."""
        try:
            me = self._me()
        except StoreClosedError:
            return None  # a snapshot install is replacing the store: the next round asks
        needed = needed_range(me.last_index, me.repair_target) if me.repairing else None
        if needed is None:
            self._strikes = 0
            return None
        others = [v for v in self._voters() if v != me.member]
        got = await asyncio.gather(*(self._ask(v) for v in others))
        answers = {v: h for v, h in zip(others, got, strict=True)}
        self.rounds += 1
        if not no_good_copy(needed[0], others, answers):
            self._strikes = 0
            self._note(me, needed, others, answers)
            return None
        self._strikes += 1
        full = {v: h for v, h in answers.items() if h is not None}
        logger.error(
            "node=%s good copy check %d/%d: no member holds indexes %d..%d",
            me.member,
            self._strikes,
            ROUNDS_TO_STOP,
            needed[0],
            needed[1],
        )
        if self._strikes < ROUNDS_TO_STOP:
            return None
        return verdict(me, needed, others, full)

    def _note(
        self,
        me: Holding,
        needed: tuple[int, int],
        others: Sequence[str],
        answers: Mapping[str, Holding | None],
    ) -> None:
        """One WARNING line when what keeps it waiting changes (not one per round)."""
        silent = sorted(v for v in others if answers.get(v) is None)
        note = f"no answer from {','.join(silent)}" if silent else "a member may supply them"
        if note == self._last_note:
            return
        self._last_note = note
        logger.warning(
            "node=%s good copy check: repairing indexes %d..%d, waiting: %s",
            me.member,
            needed[0],
            needed[1],
            note,
        )


def holdings_of(node: DLedgerNode) -> Holding:
    """What this node's log holds (its answer to ``Holdings``, and its own side)."""
    core = node.core
    store = node.store
    last = store.last_index()
    damage = store.damage
    return Holding(
        node.cfg.self_id,
        store.first_index(),
        last,
        store.term_at(last) if last >= store.first_index() - 1 else 0,
        core.term,
        core.repairing,
        core.repair_target,
        damage.first_index if damage is not None else 0,
        core.leader_id or "",
    )


def to_response(h: Holding, chain: int) -> pb.HoldingsResponse:
    return pb.HoldingsResponse(
        first_index=h.first_index,
        last_index=h.last_index,
        last_term=h.last_term,
        last_chain=chain,
        term=h.term,
        repairing=h.repairing,
        repair_target=h.repair_target,
        cut_from=h.cut_from,
        leader_id=h.leader_id,
    )


def holdings_asker(node: DLedgerNode) -> Ask:
    """Ask a member's peer port for its holdings (None: no address, no answer in time, a
    refusal, or an answer out of bounds)."""
    metadata = node.peer_metadata()

    async def ask(member: str) -> Holding | None:
        addr = node.peer_addr(member)
        if not addr:
            return None
        req = pb.HoldingsRequest(group=node.cfg.group)
        try:
            async with open_aio_channel(addr, node.cfg.client_security) as channel:
                resp = await pb_grpc.DLedgerPeerStub(channel).Holdings(
                    req, metadata=metadata, timeout=HOLDINGS_TIMEOUT_MS / 1000
                )
        except (grpc.aio.AioRpcError, OSError):
            return None
        return holding_from(member, resp)

    return ask


__all__ = [
    "GOOD_COPY_INTERVAL_MS",
    "GoodCopyCheck",
    "Holding",
    "holding_from",
    "holdings_asker",
    "holdings_of",
    "needed_range",
    "no_good_copy",
    "to_response",
    "verdict",
]
