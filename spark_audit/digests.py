"""The digest store: what an audit learned about clean committed ranges, kept in a file so
that the next audit reuses it instead of reading those ranges again (``--digests FILE``).

A range ``[lo, hi)`` of a group is stored when its task found nothing (no finding of any
kind, no divergence) and every replica held every index of it. Stored with it: the task's
output rows (the per-segment checksum pieces and the leaf digests) and, per replica, the
**stamp** of every file the range was read from (its data segments, named by the rows, and
its log index files, by arithmetic): size, modification time, change time, device and
inode for a local file (size and modification time on another filesystem), taken *before*
the audit ran.

A later audit reuses a stored range, without running its task, when the plan has a task for
exactly that range, the range is still at or below the audited commit index, the leaf size
is the same, the group has the same replicas at the same store paths, every replica's log
still starts at or before ``lo``, and every stamp is the same now. Anything that writes,
replaces or truncates one of those files (the store's own writes, a restore, a copy, a
truncation) changes its stamp, and the range is read again. Damage that changes no stamp (a
bit that rots on the medium) is found only by an audit that reads the range: run one without
``--digests`` now and then (and it rewrites the store).
"""

from __future__ import annotations

import json
import logging
import os
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from dledger.storage.codec import INDEX_RECORD_SIZE
from spark_audit import fs
from spark_audit.model import TASK_LOG, GroupPlan, ReplicaPlan, TaskSpec

log = logging.getLogger(__name__)

DIGESTS_VERSION = 1
# A digest store larger than this is not read (it would hold far more ranges than any
# audit plans: about 1 KB per range and replica).
MAX_DIGESTS_BYTES = 256 << 20
# Rows of a task that keep it from being stored: something was found in it.
_FINDING_KINDS = frozenset({"finding", "pair", "mismatch", "end"})


def _key(task: TaskSpec) -> str:
    return f"{task.lo}-{task.hi}"


@dataclass(slots=True)
class Reuse:
    """What the digest store gives an audit: the rows of the reused ranges, the tasks still
    to run, and counts for the report."""

    rows: list[dict[str, Any]] = field(default_factory=list)
    to_run: list[TaskSpec] = field(default_factory=list)
    reused_ids: set[int] = field(default_factory=set)  # task ids answered from the store
    reused_ranges: int = 0
    reused_entries: int = 0
    reused_bytes: int = 0


def _range_files(rp: ReplicaPlan, lo: int, hi: int, segments: set[str]) -> list[str]:
    """The files entries ``[lo, hi)`` of ``rp`` were read from: the named data segments and
    the index files holding their records."""
    uris = [s.uri for s in rp.segments if s.name in segments]
    first_byte, last_byte = lo * INDEX_RECORD_SIZE, (hi - 1) * INDEX_RECORD_SIZE
    size = rp.index_segment_size_bytes
    uris.extend(
        f.uri for f in rp.index_files if f.start <= last_byte and f.start + size > first_byte
    )
    return uris


class DigestStore:
    """The stored ranges of every group, read from and written to one JSON file."""

    def __init__(self, path: str, leaf_entries: int) -> None:
        self.path = path
        self.leaf_entries = leaf_entries
        self.groups: dict[str, dict[str, Any]] = {}
        self._load()

    def _load(self) -> None:
        try:
            size = os.path.getsize(self.path)
        except OSError:
            return  # no store yet: everything is read
        try:
            if size > MAX_DIGESTS_BYTES:
                raise ValueError(f"larger than {MAX_DIGESTS_BYTES} bytes")
            with open(self.path, encoding="utf-8") as f:
                doc = json.load(f)
            if not isinstance(doc, dict) or doc.get("version") != DIGESTS_VERSION:
                raise ValueError("not a digest store of this version")
            if doc.get("leaf_entries") != self.leaf_entries:
                log.warning("digest store %s has leaves of %s indexes, not %d: not reused",
                            self.path, doc.get("leaf_entries"), self.leaf_entries)  # fmt: skip
                return
            groups = doc.get("groups")
            if not isinstance(groups, dict):
                raise ValueError("no groups")
            self.groups = groups
        except (OSError, ValueError) as exc:
            log.warning("digest store %s is unreadable (%s): every range is read", self.path, exc)

    def _valid(self, plan: GroupPlan, task: TaskSpec, stored: Any) -> bool:
        if not isinstance(stored, dict) or not isinstance(stored.get("replicas"), dict):
            return False
        reps = stored["replicas"]
        if sorted(reps) != sorted(rp.replica for rp in plan.replicas):
            return False
        for rp in plan.replicas:
            mine = reps[rp.replica]
            if not isinstance(mine, dict) or mine.get("root") != rp.root:
                return False
            if rp.first_index > task.lo or not isinstance(mine.get("files"), dict):
                return False
            for uri, st in mine["files"].items():
                now = fs.stamp(uri)
                if now is None or list(now) != st:
                    return False
        return isinstance(stored.get("rows"), list)

    def split(self, plans: Sequence[GroupPlan], tasks: Sequence[TaskSpec]) -> Reuse:
        """The stored ranges still valid for ``tasks``, and the tasks to run."""
        by_group = {p.group: p for p in plans}
        out = Reuse()
        for task in tasks:
            plan = by_group[task.group]
            stored = self.groups.get(task.group, {}).get(_key(task))
            committed = task.kind == TASK_LOG and task.hi and task.hi - 1 <= plan.audited_index
            if not committed or stored is None or not self._valid(plan, task, stored):
                out.to_run.append(task)
                continue
            for row in stored["rows"]:
                out.rows.append({**row, "task": task.task_id})
                if row.get("kind") == "part":
                    out.reused_bytes += int(row.get("bytes") or 0)
            out.reused_ids.add(task.task_id)
            out.reused_ranges += 1
            out.reused_entries += task.hi - task.lo
        return out

    def update(
        self,
        plans: Sequence[GroupPlan],
        tasks: Sequence[TaskSpec],
        rows: Sequence[dict[str, Any]],
        stamps: dict[str, tuple[int, ...] | None],
        reused: Reuse,
    ) -> None:
        """Keep the reused ranges, add the clean committed ranges that ran (``rows``: the
        job's), drop the rest, and write the file (a temporary file renamed over it)."""
        by_group = {p.group: p for p in plans}
        by_task: dict[int, list[dict[str, Any]]] = defaultdict(list)
        for r in rows:
            by_task[int(r["task"])].append(r)
        kept: dict[str, dict[str, Any]] = defaultdict(dict)
        for task in tasks:
            plan = by_group[task.group]
            if task.task_id in reused.reused_ids:
                kept[task.group][_key(task)] = self.groups[task.group][_key(task)]
                continue
            entry = self._entry(plan, task, by_task.get(task.task_id, []), stamps)
            if entry is not None:
                kept[task.group][_key(task)] = entry
        self.groups = dict(kept)
        doc = {"version": DIGESTS_VERSION, "leaf_entries": self.leaf_entries, "groups": kept}
        tmp = f"{self.path}.tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(doc, f, separators=(",", ":"))
        os.replace(tmp, self.path)

    def _entry(
        self,
        plan: GroupPlan,
        task: TaskSpec,
        rows: list[dict[str, Any]],
        stamps: dict[str, tuple[int, ...] | None],
    ) -> dict[str, Any] | None:
        """What to store of a task that ran, or None when it is not a clean full range."""
        if task.kind != TASK_LOG or not task.hi or task.hi - 1 > plan.audited_index:
            return None
        if any(r["kind"] in _FINDING_KINDS for r in rows):
            return None
        kept = [{k: v for k, v in r.items() if v is not None} for r in rows if r["kind"] != "task"]
        replicas: dict[str, Any] = {}
        for rp in plan.replicas:
            mine = [r for r in kept if r.get("replica") == rp.replica]
            held = sum(int(r["count"]) for r in mine if r["kind"] == "leaf")
            if held != task.hi - task.lo or rp.first_index > task.lo:
                return None
            segs = {str(r["file"]) for r in mine if r["kind"] == "part"}
            files = {}
            for uri in _range_files(rp, task.lo, task.hi, segs):
                st = stamps.get(uri)
                if st is None:
                    return None
                files[uri] = list(st)
            replicas[rp.replica] = {"root": rp.root, "files": files}
        return {"replicas": replicas, "rows": kept}


def stamp_all(plans: Sequence[GroupPlan]) -> dict[str, tuple[int, ...] | None]:
    """The stamp of every data segment and index file of every replica (taken before the
    job: a file written while it runs shows a newer stamp at the next audit)."""
    out: dict[str, tuple[int, ...] | None] = {}
    for plan in plans:
        for rp in plan.replicas:
            for s in rp.segments:
                out[s.uri] = fs.stamp(s.uri)
            for f in rp.index_files:
                out[f.uri] = fs.stamp(f.uri)
    return out
