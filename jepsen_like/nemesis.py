"""The nemesis: a seeded random schedule of faults, each followed by its heal.

The schedule alternates a fault window and a healthy window, both ``interval_s`` long, until
the deadline; it always ends with everything healed (:meth:`Nemesis.heal_all`). Choices (which
fault, which shape, which node) come from one ``random.Random(seed)``; the nodes a choice
depends on (the leader) are looked up when the fault starts.
"""

from __future__ import annotations

import contextlib
import logging
import random
import shutil
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from jepsen_like import disk
from jepsen_like.cluster import CLIENT, JepsenCluster, link_name
from jepsen_like.history import NEMESIS, History
from jepsen_like.proxy import LinkFaults
from jepsen_like.workloads import TOPIC

logger = logging.getLogger(__name__)

NEMESES = (
    "partition",
    "kill",
    "pause",
    "disk",
    "latency",
    "bandwidth",
    "rolling",
    "membership",
    "storage",
)
# What the storage nemesis does to one node of its damaged minority (docs/JEPSEN.md "The
# storage nemesis"); ``--storage-faults`` picks some. The faults come from a shuffled deck,
# so that every kind happens once in each run of as many storage windows.
STORAGE_FAULTS = ("bitflip", "truncate", "rollback", "hardstate", "derived")
# The storage faults on the broker's own files: a ``log`` workload has no ConsumeQueues.
BROKER_STORAGE_FAULTS = ("derived",)
# What a rollback puts back: the Raft store only (``dledger-{id}/``: the log, checkpoint and
# hard state; the broker's state stays ahead of it), or everything in the node's store
# directory (a restored volume snapshot). The promise file is never rolled back: it stands
# for a file on another volume (``dLegerPromisePath``), the one thing a forgetful store
# cannot take back with it (docs/RAFT.md section 11 "What is not").
ROLLBACK_SCOPES = ("log", "node")
# Entries a node must have acknowledged (its promised index) beyond its copy before it is
# rolled back to it (a rollback that forgets nothing tests nothing), and the seconds it gets
# to do so under the workload's load (a few hundred entries a second).
ROLLBACK_MIN_ENTRIES = 100
ROLLBACK_GROW_S = 15.0
# Where the run keeps a node's copy until it is put back (beside the cluster's directory;
# removed right after).
ROLLBACK_COPIES_DIR = "rollback-copies"
# Seconds the storage nemesis waits for the nodes it damaged to end their repair before it
# damages one again (each repair then has its own measured time; a node still repairing
# after this is damaged anyway, and the report says so).
REPAIR_WAIT_S = 30.0
# The membership nemesis keeps the group between these sizes (voters): it adds a new node,
# removes one (the leader half the time: it hands over first) or replaces one (add, then
# remove), under the workload's load.
MEMBERSHIP_MIN_NODES = 3
MEMBERSHIP_MAX_NODES = 5
# Nemeses that shape traffic rather than cut it: only the proxy backend has them.
SHAPING_NEMESES = ("latency", "bandwidth")
PARTITION_SHAPES = (
    "random-halves",
    "isolate-leader",
    "bridge",
    "majorities-ring",
    "one-way",
    "client-leader",
)
# Link delay of the latency fault (per directed link, each way): base and uniform jitter.
LATENCY_MS = 50.0
JITTER_MS = 50.0
# Peer link rate of the bandwidth fault (a send load of a few hundred small messages per
# second needs tens of KiB/s of replication).
BANDWIDTH_BYTES_PER_S = 64 * 1024
# Chance that a process fault (kill, pause, one-way cut) targets the leader.
LEADER_TARGET_PROBABILITY = 0.5
# Seconds a rolling restart waits for a leader after restarting each node.
ROLL_LEADER_WAIT_S = 10.0
# What a node logs when recovery cuts off a torn tail (dledger/storage/store.py).
TORN_TAIL_LOG_MARK = "torn tail"
# Seconds between checks of the stop flag while waiting inside a window.
POLL_S = 0.1
# Asking every node for the leader can miss it (a metadata call timing out under load, an
# election in progress); a fault aimed at the leader asks again this many times, POLL_S
# apart, before it picks a node at random.
LEADER_LOOKUP_ATTEMPTS = 10


@dataclass(slots=True)
class FaultWindow:
    kind: str
    detail: str
    start_s: float
    end_s: float | None = None


def partition_links(
    shape: str, ids: Sequence[str], leader: str | None, rng: random.Random
) -> tuple[list[str], str]:
    """Directed peer links to cut for ``shape``, and a description."""
    nodes = list(ids)
    rng.shuffle(nodes)
    n = len(nodes)

    def between(a: Sequence[str], b: Sequence[str]) -> list[str]:
        return [link_name(x, y) for x in a for y in b] + [link_name(y, x) for x in a for y in b]

    if shape == "random-halves":
        small, big = nodes[: n // 2], nodes[n // 2 :]
        return between(small, big), f"halves {sorted(small)} | {sorted(big)}"
    if shape == "isolate-leader":
        target = leader if leader in nodes else nodes[0]
        rest = [x for x in nodes if x != target]
        return between([target], rest), f"isolated {target} (leader={leader}) from {sorted(rest)}"
    if shape == "bridge":
        half = (n - 1) // 2
        a, bridge, b = nodes[:half], nodes[half], nodes[half + 1 :]
        return between(a, b), f"bridge {bridge} between {sorted(a)} and {sorted(b)}"
    if shape == "majorities-ring":
        if n <= 3:  # each node hears from exactly one other: a directed ring
            cut = [link_name(nodes[i], nodes[(i + 1) % n]) for i in range(n)]
            return cut, f"one-way ring {' -> '.join(nodes)} cut"
        reach = (n // 2 + 1) // 2  # 2 * reach + 1 >= a majority: itself and its neighbours
        links = []
        for i, x in enumerate(nodes):
            for j, y in enumerate(nodes):
                d = min((i - j) % n, (j - i) % n)
                if x != y and d > reach:
                    links.append(link_name(x, y))
        return links, f"majorities ring {' - '.join(nodes)}"
    if shape == "one-way":
        target = leader if leader and rng.random() < LEADER_TARGET_PROBABILITY else nodes[0]
        rest = [x for x in nodes if x != target]
        if rng.random() < 0.5:
            return [link_name(target, y) for y in rest], f"{target} cannot send to peers"
        return [link_name(y, target) for y in rest], f"{target} cannot hear from peers"
    if shape == "client-leader":  # the peers are fine; the clients cannot reach the leader
        target = leader if leader in nodes else nodes[0]
        return [link_name(CLIENT, target)], f"clients cut from {target} (leader={leader})"
    raise ValueError(f"unknown partition shape {shape!r}")


class Nemesis:
    def __init__(
        self,
        cluster: JepsenCluster,
        history: History,
        kinds: Sequence[str],
        seed: int,
        interval_s: float,
        shapes: Sequence[str] = PARTITION_SHAPES,
        storage_faults: Sequence[str] = STORAGE_FAULTS,
        max_faults: int = 0,
    ) -> None:
        self.cluster = cluster
        self.history = history
        self.kinds = list(kinds)
        self.shapes = list(shapes)
        self.rng = random.Random(seed)
        self.interval_s = interval_s
        self.windows: list[FaultWindow] = []
        self.refusals: list[str] = []
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._down: set[str] = set()
        self._torn: dict[str, int] = {}  # node -> its log's size when its tail was torn
        self._lock = threading.Lock()
        self.storage_faults = list(storage_faults)
        self._storage_deck: list[str] = []
        # The minority the storage nemesis damages, drawn at its first fault.
        self._victims: list[str] = []
        # With max_faults > 0 the schedule ends after that many faults (healed); finished_at
        # (monotonic) tells the run when, so that it ends after its quiet period.
        self.max_faults = max_faults
        self.faults_done = 0
        self.finished_at: float | None = None

    # ------------------------------------------------------------------ thread

    def start(self, deadline_mono: float) -> None:
        self._thread = threading.Thread(
            target=self._run, args=(deadline_mono,), name="nemesis", daemon=True
        )
        self._thread.start()

    def stop(self, timeout_s: float) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)

    def _sleep_until(self, t: float) -> bool:
        """Wait until monotonic ``t``; False if told to stop first."""
        while time.monotonic() < t:
            if self._stop.wait(min(POLL_S, max(0.0, t - time.monotonic()))):
                return False
        return True

    def _run(self, deadline: float) -> None:
        max_windows = int((deadline - time.monotonic()) / max(self.interval_s, POLL_S)) + 2
        try:
            # a healthy start, so that the workload is running before the first fault
            if not self._sleep_until(min(deadline, time.monotonic() + self.interval_s)):
                return
            for _ in range(max_windows):
                if time.monotonic() + self.interval_s > deadline or not self.kinds:
                    return
                kind = self.rng.choice(self.kinds)
                try:
                    self._fault(kind, min(deadline, time.monotonic() + self.interval_s))
                except Exception as exc:  # a fault that could not be applied is reported
                    logger.exception("nemesis %s failed", kind)
                    self.errors.append(f"{kind}: {exc}")
                finally:
                    self.heal_all()
                    self.faults_done += 1
                if self.max_faults and self.faults_done >= self.max_faults:
                    self.finished_at = time.monotonic()
                    return
                if not self._sleep_until(min(deadline, time.monotonic() + self.interval_s)):
                    return
        finally:
            self.heal_all()

    # ------------------------------------------------------------------ faults

    def _begin(self, kind: str, detail: str, facts: dict[str, Any] | None = None) -> FaultWindow:
        w = FaultWindow(kind, detail, self.history.now())
        with self._lock:
            self.windows.append(w)
        value = {"fault": kind, "detail": detail, **(facts or {})}
        self.history.add(NEMESIS, "info", "start", value)
        logger.info("nemesis start %s: %s", kind, detail)
        return w

    def _leader(self) -> str | None:
        with self.cluster.direct_client() as c:
            for attempt in range(LEADER_LOOKUP_ATTEMPTS):
                leader = self.cluster.leader(c)
                if leader is not None:
                    return leader
                if attempt + 1 < LEADER_LOOKUP_ATTEMPTS:
                    time.sleep(POLL_S)
        logger.warning("nemesis: no leader found in %d attempts", LEADER_LOOKUP_ATTEMPTS)
        return None

    def _pick(self, k: int = 1) -> list[str]:
        ids = self.cluster.ids
        leader = self._leader()
        if leader and self.rng.random() < LEADER_TARGET_PROBABILITY:
            others = [x for x in ids if x != leader]
            return [leader, *self.rng.sample(others, k - 1)]
        return self.rng.sample(ids, k)

    def _fault(self, kind: str, until: float) -> None:
        c = self.cluster
        n = len(c.ids)
        if kind == "partition":
            shape = self.rng.choice(self.shapes)
            links, detail = partition_links(shape, c.ids, self._leader(), self.rng)
            # A node the membership nemesis added has no links of its own (docs/JEPSEN.md):
            # a partition cuts it only along the links that exist.
            cut = [name for name in links if name in c.net.links]
            if len(cut) < len(links):
                detail += f" ({len(links) - len(cut)} links of added nodes do not exist)"
            self._begin(kind, f"{shape}: {detail}")
            c.net.cut(cut)
        elif kind == "kill":
            targets = self._pick(self.rng.randint(1, max(1, (n - 1) // 2)))
            self._begin(kind, f"SIGKILL {targets}")
            for t in targets:
                c.kill(t)
                self._down.add(t)
        elif kind == "pause":
            targets = self._pick(self.rng.randint(1, max(1, (n - 1) // 2)))
            self._begin(kind, f"SIGSTOP {targets}")
            for t in targets:
                c.pause(t)
        elif kind == "disk":
            (target,) = self._pick(1)
            c.kill(target)
            self._down.add(target)
            fault = self.rng.choice(["torn-tail", "bit-flip"])
            d = c.dledger_dir(target)
            try:
                if fault == "torn-tail":
                    what = disk.tear_tail(d, self.rng)
                    self._torn[target] = c.log_size(target)
                else:
                    what = disk.flip_bit(d, self.rng)
            except disk.DiskFaultError as exc:
                what = f"skipped: {exc}"
            self._begin(kind, f"{fault} on {target} (SIGKILLed): {what}")
        elif kind == "latency":
            links = [name for name in c.net.links if not name.startswith("client")]
            self._begin(kind, f"{LATENCY_MS:.0f} ms + up to {JITTER_MS:.0f} ms on every peer link")
            c.net.set_faults(links, LinkFaults(latency_ms=LATENCY_MS, jitter_ms=JITTER_MS))
        elif kind == "bandwidth":
            links = [name for name in c.net.links if not name.startswith("client")]
            self._begin(kind, f"{BANDWIDTH_BYTES_PER_S} bytes/s on every peer link")
            c.net.set_faults(links, LinkFaults(bandwidth_bytes_per_s=BANDWIDTH_BYTES_PER_S))
        elif kind == "membership":
            self._membership()
        elif kind == "storage":
            self._storage()
        elif kind == "rolling":
            order = list(c.ids)
            self.rng.shuffle(order)
            self._begin(kind, f"rolling restart {order} (SIGTERM, start)")
            for nid in order:
                if self._stop.is_set():
                    break
                c.stop(nid)
                reason = c.start(nid)
                if reason:
                    self.refusals.append(f"{nid}: {reason}")
                with c.direct_client() as client:
                    wait_end = time.monotonic() + ROLL_LEADER_WAIT_S
                    while time.monotonic() < wait_end and c.leader(client) is None:
                        time.sleep(POLL_S)
        else:
            raise ValueError(f"unknown nemesis {kind!r}")
        self._sleep_until(until)

    def _membership(self) -> None:
        """One change of the group's members; it is not undone at the heal (the next
        membership fault may change it again). A change the group refuses is reported."""
        c = self.cluster
        n = len(c.ids)
        actions = ["add"] if n < MEMBERSHIP_MIN_NODES else ["replace"]
        if n < MEMBERSHIP_MAX_NODES:
            actions.append("add")
        if n > MEMBERSHIP_MIN_NODES:
            actions.append("remove")
        action = self.rng.choice(actions)
        leader = self._leader()
        victim = leader if leader and self.rng.random() < LEADER_TARGET_PROBABILITY else None
        victim = victim or self.rng.choice(c.ids)
        self._begin("membership", f"{action} (group {sorted(c.ids)}, leader {leader})")
        if action in ("add", "replace"):
            added = c.add_member()
            c.events.append(f"membership: added {added}")
        if action in ("remove", "replace"):
            c.remove_member(victim)
            self._down.discard(victim)
            c.events.append(f"membership: removed {victim} (leader was {leader})")

    # ------------------------------------------------------------------ storage

    def _storage_victim(self) -> str:
        """A node of the damaged minority: drawn once per run ((n - 1) // 2 nodes), so that
        damage never reaches a majority, even damage a node has not found yet. A member the
        membership nemesis removed is replaced by another member."""
        ids = self.cluster.ids
        self._victims = [v for v in self._victims if v in ids]
        want = max(1, (len(ids) - 1) // 2)
        if not self._victims:
            self._victims = sorted(self.rng.sample(ids, want))
            self.cluster.events.append(f"storage nemesis: damages {self._victims} only")
        return self.rng.choice(self._victims)

    def _storage(self) -> None:
        """One storage fault on one node of the minority, under load: stop it, damage its
        store, start it again; it must repair itself (the checker's ``repaired``)."""
        if not self._storage_deck:
            self._storage_deck = list(self.storage_faults)
            self.rng.shuffle(self._storage_deck)
        fault = self._storage_deck.pop()
        target = self._storage_victim()
        c = self.cluster
        still = c.wait_not_repairing(self._victims, REPAIR_WAIT_S)
        if still:
            c.events.append(
                f"storage nemesis: {still} still repairing after {REPAIR_WAIT_S:.0f} s; "
                f"damaging {target} anyway"
            )
        try:
            if fault == "rollback":
                damage = self._rollback(target)
            else:
                if fault == "derived":
                    c.stop(target)  # a clean stop: the damaged record is behind the snapshot
                c.kill_and_wait(target)  # (after a clean stop: only if it outlived the grace)
                damage = self._damage(fault, target)
        except disk.DiskFaultError as exc:
            damage = disk.Damage(f"skipped: {exc}", {"skipped": True})
        how = "SIGTERM" if fault == "derived" else "SIGKILL"
        self._begin(
            "storage",
            f"{fault} on {target} ({how}): {damage.what}",
            {"node": target, "damage": fault, **damage.facts},
        )
        self._restart_damaged(target, fault)

    def _damage(self, fault: str, target: str) -> disk.Damage:
        c = self.cluster
        d = c.dledger_dir(target)
        if fault == "bitflip":
            return disk.flip_committed_bit(d, self.rng)
        if fault == "truncate":
            return disk.cut_committed(d, self.rng)
        if fault == "hardstate":
            return disk.damage_hard_state(d, self.rng)
        if fault == "derived":
            return disk.damage_cq_record(c.store_root(target), TOPIC, self.rng)
        raise ValueError(f"unknown storage fault {fault!r}")

    def _restart_damaged(self, target: str, fault: str) -> None:
        """Start the damaged node; a refusal is in the history (the checker fails the run:
        the harness's wipe of a refused store stands for a person's manual step)."""
        reason = self.cluster.start(target)
        if reason:
            self.refusals.append(f"{target}: {reason}")
            self.history.add(
                NEMESIS,
                "info",
                "refused",
                {"fault": "storage", "node": target, "damage": fault, "reason": reason},
            )

    def _rollback(self, target: str) -> disk.Damage:
        """Copy the stopped node's store, let it acknowledge more entries under load, stop it
        and put the copy back: a store that forgot writes it had acknowledged."""
        c = self.cluster
        scope = self.rng.choice(ROLLBACK_SCOPES)
        log_dir = c.dledger_dir(target)
        root: Path = log_dir
        keep: tuple[str, ...] = ()
        if scope == "node":
            root, keep = c.store_root(target), c.promise_names(target)
        copy = c.base.parent / ROLLBACK_COPIES_DIR / f"{target}-{len(self.windows)}"
        shutil.rmtree(copy, ignore_errors=True)
        c.kill_and_wait(target)
        copied_last = disk.last_entry_index(log_dir)
        disk.copy_store(root, copy, keep)
        try:
            self._restart_damaged(target, "rollback")
            want = copied_last + ROLLBACK_MIN_ENTRIES
            promised = c.wait_promised(target, want, ROLLBACK_GROW_S)
            c.kill_and_wait(target)
            on_disk = disk.last_entry_index(log_dir)
            disk.restore_store(copy, root, keep)
        finally:
            shutil.rmtree(copy, ignore_errors=True)
        if promised < want:
            c.events.append(
                f"storage nemesis: {target} acknowledged up to {promised}, not {want}, in "
                f"{ROLLBACK_GROW_S:.0f} s; rolled back anyway"
            )
        what = "its Raft store" if scope == "log" else "its whole store directory"
        forgot_to = max(on_disk, promised)
        return disk.Damage(
            f"{what} put back to a copy taken while it was stopped: entries up to {copied_last} "
            f"on disk again, where it had {on_disk} on disk and had acknowledged {promised}",
            {
                "file": str(root),
                "scope": scope,
                "indexes": [copied_last + 1, forgot_to],
                "promised": promised,
                "on_disk": on_disk,
            },
        )

    def heal_all(self) -> None:
        """Heal every link and process fault, end the open window (idempotent)."""
        c = self.cluster
        with contextlib.suppress(Exception):
            c.net.heal_all()
        for nid in list(c.paused):
            c.resume(nid)
        down = sorted(self._down | {i for i in c.ids if not c.running(i)})
        try:
            reasons = c.start_many(down)
        except Exception as exc:  # reported; the run's final heal tries again
            logger.exception("nemesis could not restart %s", down)
            self.errors.append(f"restart {down}: {exc}")
        else:
            self.refusals += [f"{nid}: {r}" for nid, r in reasons.items()]
            self._down.clear()
        for nid, offset in self._torn.items():
            line = c.log_line(nid, offset, TORN_TAIL_LOG_MARK)
            c.events.append(
                f"{nid} recovered its torn tail: {line}"
                if line
                else f"{nid}: no torn-tail truncation in its log after the torn write"
            )
        self._torn.clear()
        with self._lock:
            open_windows = [w for w in self.windows if w.end_s is None]
            for w in open_windows:
                w.end_s = self.history.now()
        for w in open_windows:
            self.history.add(NEMESIS, "info", "stop", {"fault": w.kind, "detail": w.detail})
            logger.info("nemesis heal %s", w.kind)


def parse_nemeses(text: str) -> list[str]:
    """``partition,kill`` or ``all`` or ``none``; raises ValueError naming a bad one."""
    if text.strip() in ("", "none"):
        return []
    if text.strip() == "all":
        return list(NEMESES)
    kinds = [k.strip() for k in text.split(",") if k.strip()]
    bad = [k for k in kinds if k not in NEMESES]
    if bad:
        raise ValueError(f"unknown nemesis {bad[0]!r}; choose from {', '.join(NEMESES)}, all")
    return kinds


def parse_shapes(text: str) -> list[str]:
    if text.strip() == "all":
        return list(PARTITION_SHAPES)
    shapes = [k.strip() for k in text.split(",") if k.strip()]
    bad = [k for k in shapes if k not in PARTITION_SHAPES]
    if bad or not shapes:
        raise ValueError(
            f"unknown partition shape {bad[0] if bad else text!r}; "
            f"choose from {', '.join(PARTITION_SHAPES)}, all"
        )
    return shapes


def parse_storage_faults(text: str) -> list[str]:
    """``bitflip,rollback`` or ``all``; raises ValueError naming a bad one."""
    if text.strip() == "all":
        return list(STORAGE_FAULTS)
    faults = [k.strip() for k in text.split(",") if k.strip()]
    bad = [k for k in faults if k not in STORAGE_FAULTS]
    if bad or not faults:
        raise ValueError(
            f"unknown storage fault {bad[0] if bad else text!r}; "
            f"choose from {', '.join(STORAGE_FAULTS)}, all"
        )
    return faults
