"""The repair state: a member whose log ends below what it promised (docs/RAFT.md section 11).

A member acknowledges entries as durable (a follower's success answer; a leader's own copy,
which it counts towards a commit) and its driver keeps the highest such index, the
*promise*, in a file apart from the log (``dledger.storage.promise``), made durable before
the acknowledgement leaves (``Ready.promise``). At start the driver hands the core what it
read (:class:`Promised`). A log that ends below the promise was rolled back, cut or replaced
under this member: it lacks entries its acknowledgements counted on, possibly committed
ones that only a minority now holds. Such a member is *repairing*:

* it does not campaign and grants no vote or pre-vote (``REJECT_REPAIRING``): its log would
  make it vote for a candidate that lacks committed entries;
* its append answers say ``repairing``, and a leader counts it towards no commit quorum;
* it follows a leader and takes its appends as usual, and leaves the state by itself once its
  durable log, verified against the leader of its current term, holds the promised index, or
  holds an entry of a term above the term it started in (that leader was elected without
  this member's vote, so its log holds every committed entry, all below its first entry of
  its own term).

A member whose promise is unknown (``vote_lost``: the promise file is damaged in both of its
slots, or neither ``meta`` nor the promise file's copy survived and the store holds entries)
is repairing too, and takes the term of the first leader it hears from as the term it voted
in (for that leader): it never votes again in that term. It cannot know what it
acknowledged, so its repair ends only once its verified log holds both the commit index the
leader of its current term announced in the first append it accepted from it, and an entry
of that leader's term (docs/RAFT.md section 11, "An unknown promise", gives the argument).
"""

from __future__ import annotations

from dataclasses import dataclass

from dledger.log import HardState

__all__ = ["Promised", "Repair", "newer_hard_state", "start_repair"]


@dataclass(frozen=True, slots=True)
class Promised:
    """What the driver read at start. ``index``: the highest index this member acknowledged
    as durable before (0: nothing, or no promise file). ``vote_lost``: the promise is unknown
    and the vote may be: the promise file is damaged in both slots, or neither the hard state
    nor its copy survived and the store holds entries (a member that existed before)."""

    index: int = 0
    vote_lost: bool = False


@dataclass(slots=True)
class Repair:
    """An ongoing repair. A known promise: done when the durable log, verified against the
    current leader, reaches ``target`` or holds an entry of a term above ``term``. An unknown
    one (``vote_lost``): done when it reaches ``target``, raised to the commit index of the
    first append it accepted from the current term's leader (``leader_term``), and holds an
    entry of that term."""

    target: int
    term: int
    vote_lost: bool
    # The term whose leader's commit index was taken into ``target`` (-1: none yet).
    leader_term: int = -1

    def learn_leader(self, term: int, leader_commit: int) -> None:
        """An append of the leader of ``term``, announcing ``leader_commit``, was accepted.
        An unknown promise takes the commit index of each term's first accepted append as
        the least it may have acknowledged (only the first: chasing a growing commit index
        would never end under load; docs/RAFT.md section 11 says why the first suffices)."""
        if self.vote_lost and term != self.leader_term:
            self.leader_term = term
            self.target = max(self.target, leader_commit)

    def done(self, verified_upto: int, term_there: int, term: int) -> bool:
        """``verified_upto``: the highest index that is durable here and known to match the
        current leader's log; ``term_there``: its term; ``term``: the current term."""
        if self.vote_lost:
            return self.leader_term == term and verified_upto >= self.target and term_there == term
        return verified_upto >= self.target or (verified_upto > 0 and term_there > self.term)


def start_repair(
    promised: Promised, last_index: int, last_term: int, term: int, *, forget: bool
) -> Repair | None:
    """The repair a member starts in (None: it is a voter as usual). ``term``: its current
    term at start; ``forget``: the test-only mutation ``forget_promise`` (never repairs)."""
    if forget:
        return None
    if promised.vote_lost:
        # The promise is unknown too: at least what the log holds (it may have been
        # acknowledged). With an empty log the repair ends at the first leader's append.
        return Repair(
            target=max(last_index, promised.index), term=max(term, last_term), vote_lost=True
        )
    if last_index < promised.index:
        return Repair(target=promised.index, term=term, vote_lost=False)
    return None


def newer_hard_state(meta: HardState | None, copy: HardState | None) -> HardState | None:
    """The hard state to start from, out of the store's ``meta`` and the promise file's copy
    (None: missing or damaged). The higher term wins; on equal terms the one with a vote
    (the copy is written after ``meta`` in the same persist job, so a crash between them
    leaves the copy one vote behind; never ahead). None when both are missing."""
    if meta is None or copy is None:
        return meta if copy is None else copy
    if copy.term != meta.term:
        return copy if copy.term > meta.term else meta
    return meta if meta.voted_for is not None or copy.voted_for is None else copy
