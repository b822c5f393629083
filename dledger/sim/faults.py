"""Fault schedules: what goes wrong, and when, in one simulated run; and their minimization."""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

# Node ids of a simulated group of n members.
NODE_PREFIX = "n"

# Target that a fault resolves at run time to the current leader (or to nothing).
LEADER = "leader"

PARTITION_SHAPES = ("halves", "isolate", "isolate_leader", "bridge", "ring", "deaf", "mute")

# Messages a hostile peer forges (``forge`` events; see FaultEvent). Each is one that an honest
# member could never send, so a correct core drops it; none is one that no Raft could survive
# (a forged append from the leader of a term that has none yet, say).
FORGERIES = (
    "ack_beyond_last",  # an ack, claiming a follower, of an index beyond the leader's last
    "max_term",  # a heartbeat claiming a member, with term MAX_TERM
    "non_member",  # an ack to the leader from an id that is not a member
    "timeout_now",  # a TimeoutNow claiming a member that is not the target's leader
    "second_leader",  # an append with entries, claiming another member leads a led term
)
# Chance that a seed has forged messages at all, and how many at most.
FORGE_SEED_PCT = 50
FORGE_MAX_EVENTS = 4

# Membership changes (``member`` events): what the operator asks the leader of the moment.
# ``add_learner`` is followed by a ``promote``, ``replace`` is an ``add_voter`` followed by a
# ``remove`` (of the leader, half the time), ``burst`` is two ``add_voter`` at the same
# instant (the second must be refused while the first is uncommitted), ``handover`` crashes
# the leader right after an ``add_voter`` (the change may reach a few members only) and asks
# the next leader for a removal the moment it wins (before it committed in its term).
MEMBER_ACTIONS = (
    "add_learner",
    "add_voter",
    "remove",
    "remove_leader",
    "replace",
    "burst",
    "handover",
)
# Chance that a seed changes its membership at all, and how many actions at most.
MEMBER_SEED_PCT = 50
MEMBER_MAX_ACTIONS = 4

# The group feature level (``feature`` events, docs/RAFT.md section 14): in these seeds one
# node runs the previous release for a while (``old``: restarted with support for level 1
# only; ``upgrade``: restarted with this release's, always before the heal) and the operator
# asks the leader of the moment to raise the level (``raise``) a few times.
FEATURE_SEED_PCT = 30
FEATURE_MAX_RAISES = 3

# Storage faults (``storage`` events, docs/RAFT.md section 11): a disk that forgets. One per
# seed at most, on one node (a fault on a majority is beyond what any replication survives):
STORAGE_SHAPES = (
    "rollback",  # the node's log goes back to an older prefix of itself, its promise survives
    "lose_meta",  # its hard state file is lost; the promise file's copy survives
    # The scenario: a minority is cut off while entries commit, then the follower
    # that acknowledged the most forgets them and the leader crashes at once.
    "forgetful",
    # Its log goes back to an older prefix of itself and both slots of its promise file are
    # damaged (what it acknowledged is unknown; its ``meta`` survives).
    "damage_promise",
)
STORAGE_SEED_PCT = 30
# ``forgetful``: the minority is cut off this long (ms) before the follower forgets.
FORGETFUL_LAG_MS = (80, 400)


def node_ids(n: int) -> tuple[str, ...]:
    return tuple(f"{NODE_PREFIX}{i}" for i in range(n))


@dataclass(frozen=True, slots=True)
class FaultEvent:
    """One fault at ``at_ms`` of simulated time.

    kind:
      ``partition``: ``shape`` in PARTITION_SHAPES; ``groups`` lists the sides (``bridge``:
        two sides then the bridge node; ``ring``: the ring order; ``isolate``/``deaf``/
        ``mute``: one node, or ``leader`` resolved at run time);
      ``heal``: every link works again;
      ``crash``/``restart``: ``target`` is a node id or ``leader``;
      ``loss``: drop each message with probability ``loss_pct``/100;
      ``isolate_next_leader``: the next member to win an election is isolated at once
        (before its first append leaves), which strands entries of several terms;
      ``crash_next_voter``: the next member to send a granted vote crashes right after
        sending it and restarts a few ms later (does it remember its vote?);
      ``forge``: a hostile peer's message of kind ``shape`` (one of FORGERIES) is delivered
        to ``target`` (a node id or ``leader``) at once, whatever the partitions;
      ``member``: the leader of the moment is asked for the membership change ``shape``
        (``add_learner``, ``add_voter``: a new node with an empty log; ``promote``: a
        learner; ``remove``: ``target``, a node id, ``leader``, or any voter when empty);
      ``member_next_leader``: the next member to win an election is asked for that change
        the moment it wins;
      ``storage``: a disk that forgets (``shape`` in STORAGE_SHAPES, or ``forgetful_lag``,
        the first half of ``forgetful``), on ``target`` or on nodes chosen at run time;
      ``feature``: ``old`` restarts ``target`` on the previous release (support for feature
        level 1), ``upgrade`` restarts it on this one, ``raise`` asks the leader of the moment
        to raise the group's feature level.
    """

    at_ms: int
    kind: str
    shape: str = ""
    groups: tuple[tuple[str, ...], ...] = ()
    target: str = ""
    loss_pct: int = 0

    def describe(self) -> str:
        if self.kind == "partition":
            sides = " | ".join(",".join(g) for g in self.groups)
            return f"t={self.at_ms}ms partition {self.shape} [{sides}]"
        if self.kind in ("crash", "restart"):
            return f"t={self.at_ms}ms {self.kind} {self.target}"
        if self.kind == "loss":
            return f"t={self.at_ms}ms loss {self.loss_pct}%"
        if self.kind == "forge":
            return f"t={self.at_ms}ms forge {self.shape} to {self.target}"
        if self.kind == "storage":
            return f"t={self.at_ms}ms storage {self.shape} {self.target}".rstrip()
        if self.kind in ("member", "feature"):
            return f"t={self.at_ms}ms {self.kind} {self.shape} {self.target}".rstrip()
        return f"t={self.at_ms}ms {self.kind}"


def generate_schedule(
    rng: random.Random, nodes: Sequence[str], fault_phase_ms: int
) -> list[FaultEvent]:
    """A random fault schedule over ``[0, fault_phase_ms)``, sorted by time."""
    events: list[FaultEvent] = []
    n_events = rng.randint(3, 10)
    for _ in range(n_events):
        at = rng.randrange(50, fault_phase_ms)
        r = rng.random()
        if r < 0.40:
            events.append(_random_partition(rng, nodes, at))
            if rng.random() < 0.7:
                heal_at = min(fault_phase_ms - 1, at + rng.randint(100, 800))
                events.append(FaultEvent(heal_at, "heal"))
        elif r < 0.75:
            target = LEADER if rng.random() < 0.5 else rng.choice(nodes)
            events.append(FaultEvent(at, "crash", target=target))
            if rng.random() < 0.85:
                down_ms = rng.choice((rng.randint(1, 30), rng.randint(30, 600)))
                restart_target = "all" if target == LEADER else target
                events.append(
                    FaultEvent(
                        min(fault_phase_ms - 1, at + down_ms), "restart", target=restart_target
                    )
                )
        elif r < 0.8:
            events.append(FaultEvent(at, "loss", loss_pct=rng.choice((5, 20, 50))))
            events.append(FaultEvent(min(fault_phase_ms - 1, at + rng.randint(50, 500)), "loss"))
        elif r < 0.86:
            events.append(FaultEvent(at, "heal"))
        elif r < 0.94:
            events.append(FaultEvent(at, "isolate_next_leader"))
            heal_at = min(fault_phase_ms - 1, at + rng.randint(150, 700))
            events.append(FaultEvent(heal_at, "heal"))
        else:
            events.append(FaultEvent(at, "crash_next_voter"))
    events.sort(key=lambda e: e.at_ms)
    return events


def generate_forgeries(
    rng: random.Random, nodes: Sequence[str], fault_phase_ms: int
) -> list[FaultEvent]:
    """Forged messages over ``[0, fault_phase_ms)``, from their own PRNG so that adding them
    left every seed's other faults as they were."""
    if rng.randrange(100) >= FORGE_SEED_PCT:
        return []
    events = []
    for _ in range(rng.randint(1, FORGE_MAX_EVENTS)):
        kind = rng.choice(FORGERIES)
        target = LEADER if kind == "ack_beyond_last" else rng.choice(nodes)
        events.append(FaultEvent(rng.randrange(50, fault_phase_ms), "forge", kind, target=target))
    events.sort(key=lambda e: e.at_ms)
    return events


def generate_storage(
    rng: random.Random, nodes: Sequence[str], fault_phase_ms: int
) -> list[FaultEvent]:
    """At most one storage fault over ``[0, fault_phase_ms)``, from its own PRNG (as
    forgeries): ``rollback``, ``lose_meta`` or ``damage_promise`` of a random node (it
    restarts 1-30 ms later), or the ``forgetful`` pair (``forgetful_lag`` cuts a minority
    off; ``forgetful`` rolls back the follower that acknowledged the most and crashes the
    leader)."""
    if rng.randrange(100) >= STORAGE_SEED_PCT:
        return []
    shape = rng.choice(STORAGE_SHAPES)
    last = fault_phase_ms - 1
    at = rng.randrange(50, max(51, fault_phase_ms - FORGETFUL_LAG_MS[1]))
    if shape != "forgetful":
        return [FaultEvent(at, "storage", shape, target=rng.choice(nodes))]
    later = min(last, at + rng.randint(*FORGETFUL_LAG_MS))
    return [FaultEvent(at, "storage", "forgetful_lag"), FaultEvent(later, "storage", "forgetful")]


def generate_membership(
    rng: random.Random, nodes: Sequence[str], fault_phase_ms: int
) -> list[FaultEvent]:
    """Membership changes over ``[0, fault_phase_ms)``, from their own PRNG (as forgeries)."""
    if rng.randrange(100) >= MEMBER_SEED_PCT:
        return []
    events = []
    last = fault_phase_ms - 1
    for _ in range(rng.randint(1, MEMBER_MAX_ACTIONS)):
        action = rng.choice(MEMBER_ACTIONS)
        at = rng.randrange(50, fault_phase_ms)
        if action == "add_learner":
            events.append(FaultEvent(at, "member", "add_learner"))
            events.append(FaultEvent(min(last, at + rng.randint(30, 400)), "member", "promote"))
        elif action == "add_voter":
            events.append(FaultEvent(at, "member", "add_voter"))
        elif action == "remove":
            events.append(FaultEvent(at, "member", "remove", target=rng.choice(("", *nodes))))
        elif action == "remove_leader":
            events.append(FaultEvent(at, "member", "remove", target=LEADER))
        elif action == "replace":
            events.append(FaultEvent(at, "member", "add_voter"))
            target = LEADER if rng.random() < 0.5 else rng.choice(nodes)
            later = min(last, at + rng.randint(10, 300))
            events.append(FaultEvent(later, "member", "remove", target=target))
        elif action == "burst":
            events.append(FaultEvent(at, "member", "add_voter"))
            events.append(FaultEvent(at, "member", "add_voter"))
        else:
            events.append(FaultEvent(at, "member", "add_voter"))
            crash_at = min(last, at + rng.randint(1, 4))
            events.append(FaultEvent(crash_at, "crash", target=LEADER))
            events.append(FaultEvent(crash_at, "member_next_leader", "remove"))
            events.append(
                FaultEvent(min(last, crash_at + rng.randint(20, 400)), "restart", target="all")
            )
    events.sort(key=lambda e: e.at_ms)
    return events


def generate_features(
    rng: random.Random, nodes: Sequence[str], fault_phase_ms: int
) -> list[FaultEvent]:
    """The feature-level fault over ``[0, fault_phase_ms)``, from its own PRNG: one node on
    the previous release for a while (upgraded before the heal), and a few raises, some of
    them while it is old."""
    if rng.randrange(100) >= FEATURE_SEED_PCT:
        return []
    old = rng.choice(list(nodes))
    old_at = rng.randrange(10, fault_phase_ms // 3)
    upgrade_at = rng.randrange(old_at + 1, fault_phase_ms)
    events = [
        FaultEvent(old_at, "feature", "old", target=old),
        FaultEvent(upgrade_at, "feature", "upgrade", target=old),
    ]
    for _ in range(rng.randint(1, FEATURE_MAX_RAISES)):
        events.append(FaultEvent(rng.randrange(old_at, fault_phase_ms), "feature", "raise"))
    events.sort(key=lambda e: e.at_ms)
    return events


def _random_partition(rng: random.Random, nodes: Sequence[str], at: int) -> FaultEvent:
    shape = rng.choice(PARTITION_SHAPES)
    shuffled = list(nodes)
    rng.shuffle(shuffled)
    n = len(shuffled)
    groups: tuple[tuple[str, ...], ...]
    if shape == "halves":
        cut = rng.randint(1, n - 1)
        groups = (tuple(sorted(shuffled[:cut])), tuple(sorted(shuffled[cut:])))
    elif shape == "bridge" and n >= 3:
        bridge = shuffled[0]
        rest = shuffled[1:]
        cut = rng.randint(1, len(rest) - 1)
        groups = (tuple(sorted(rest[:cut])), tuple(sorted(rest[cut:])), (bridge,))
    elif shape == "ring":
        groups = (tuple(shuffled),)
    elif shape == "isolate_leader":
        shape = "isolate"
        groups = ((LEADER,),)
    elif shape in ("isolate", "deaf", "mute"):
        groups = ((LEADER if rng.random() < 0.5 else shuffled[0],),)
    else:
        shape = "isolate"
        groups = ((shuffled[0],),)
    return FaultEvent(at, "partition", shape=shape, groups=groups)


def blocked_links(
    shape: str, groups: tuple[tuple[str, ...], ...], nodes: Sequence[str]
) -> set[tuple[str, str]]:
    """Directed (from, to) pairs that drop every message under this partition."""
    blocked: set[tuple[str, str]] = set()
    if shape == "halves":
        side = {x: i for i, g in enumerate(groups) for x in g}
        for a in nodes:
            for b in nodes:
                if a != b and side.get(a) != side.get(b):
                    blocked.add((a, b))
    elif shape == "bridge":
        left, right, (bridge,) = groups
        for a in left:
            for b in right:
                blocked.add((a, b))
                blocked.add((b, a))
        _ = bridge  # the bridge node keeps every link
    elif shape == "ring":
        ring = groups[0]
        n = len(ring)
        allowed = set()
        for i, a in enumerate(ring):
            allowed.add((a, ring[(i + 1) % n]))
            allowed.add((ring[(i + 1) % n], a))
        for a in nodes:
            for b in nodes:
                if a != b and (a, b) not in allowed:
                    blocked.add((a, b))
    else:
        (x,) = groups[0]
        for other in nodes:
            if other == x:
                continue
            if shape in ("isolate", "deaf"):
                blocked.add((other, x))
            if shape in ("isolate", "mute"):
                blocked.add((x, other))
    return blocked


def minimize(
    events: Sequence[FaultEvent], still_fails: Callable[[list[FaultEvent]], bool]
) -> list[FaultEvent]:
    """Delta debugging (ddmin): a 1-minimal sub-list of ``events`` for which the run still
    fails. ``still_fails`` re-runs the simulation (same seed) with a candidate schedule."""
    current = list(events)
    n = 2
    while len(current) >= 2:
        chunk = max(1, len(current) // n)
        subsets = [current[i : i + chunk] for i in range(0, len(current), chunk)]
        reduced = False
        for i in range(len(subsets)):
            complement = [e for j, s in enumerate(subsets) if j != i for e in s]
            if still_fails(complement):
                current = complement
                n = max(n - 1, 2)
                reduced = True
                break
        if not reduced:
            if n >= len(current):
                break
            n = min(len(current), n * 2)
    if len(current) == 1 and still_fails([]):
        return []
    return current
