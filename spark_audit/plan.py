"""Driver side: find the replicas' stores, read their checkpoints and file lists, choose the
audited commit index and split the work into index ranges.

Only file names, sizes, checkpoints, the first header of each data segment and a handful of
index records are read here; entries are read by the tasks.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from dledger.core.membership import MAX_REMOVED_IDS, ConfState
from dledger.core.membership import decode as decode_configuration
from dledger.log import FormatTooNewError
from dledger.storage import codec
from dledger.storage.codec import ENTRY_HEADER_SIZE, INDEX_RECORD_SIZE, RecordError
from dledger.storage.files import SEGMENT_NAME_DIGITS
from dledger.storage.promise import FILE_BYTES as PROMISE_FILE_BYTES
from dledger.storage.promise import PROMISE_SUFFIX, PromiseError, decode_promise
from dledger.storage.store import CHECKPOINT_FILE, DATA_DIR, INDEX_DIR
from mqrelease import BASELINE_LEVEL
from spark_audit import fs
from spark_audit.derived import has_derived_state
from spark_audit.errors import AuditError
from spark_audit.merkle import LEAF_ENTRIES
from spark_audit.model import (
    TASK_DERIVED,
    Finding,
    GroupPlan,
    IndexFile,
    ReplicaPlan,
    SegmentFile,
    TaskSpec,
    What,
)

if TYPE_CHECKING:
    from mqsecurity.channels import ClientSecurity

log = logging.getLogger(__name__)

# Bytes of one replica's log that one task scans: big enough that Spark's per-task cost
# (tens of ms) is noise, small enough that 2 cores get a dozen tasks per GiB to balance.
TASK_TARGET_BYTES = 64 << 20
# The directory name of a member's log store inside a broker's storePathRootDir.
STORE_DIR_PREFIX = "dledger-"
# mqcluster's state file: names the group of a local cluster's base directory.
CLUSTER_STATE_FILE = "cluster.json"
DEFAULT_GROUP = "default"
# A cluster.json names a handful of nodes: a larger file is not one.
CLUSTER_STATE_MAX_BYTES = 1 << 20
# The committed configuration a node saves in its store (dledger/server/membership.py
# CONF_FILE) and the largest such file read (CONF_FILE_MAX_BYTES).
MEMBERSHIP_FILE = "membership.json"
MEMBERSHIP_FILE_MAX_BYTES = 64 << 10
# Files the store leaves behind on purpose or deletes on open.
STORE_FILES = frozenset({"commitlog", "index", "checkpoint", "meta", "abort", "lock"})
TRANSIENT_SUFFIXES = (".tmp", ".alloc")
# What a running node that reports no release runs: one before releases were reported.
OLD_RELEASE = "0.2.0 or older"


class InputError(AuditError):
    """Bad usage or unreadable input (exit code 2)."""


@dataclass(frozen=True, slots=True)
class ReplicaSource:
    group: str
    replica: str
    root: str  # the store directory (``dledger-{id}``), a path or a URI
    commit_index: int | None = None  # from a running node; None: read the checkpoint
    # The ``removed`` list of the mqcluster ``cluster.json`` it was found under names it.
    listed_removed: bool = False
    # A running node's report: the highest feature level its release supports (0: not
    # asked; a node of a release before levels reports 0 too, read as level 1) and the release.
    supported_feature_level: int = 0
    release: str = ""


def _is_store(uri: str) -> bool:
    return fs.is_dir(fs.join(uri, DATA_DIR))


def discover(uri: str) -> list[str]:
    """Store directories at ``uri``: the store itself, a broker's storePathRootDir holding
    ``dledger-*``, or a directory of those (an ``mqcluster`` base directory)."""
    if not fs.exists(uri):
        raise InputError(f"{uri}: no such file or directory")
    if _is_store(uri):
        return [uri]
    try:
        entries = fs.list_dir(uri)
    except fs.FsError as exc:
        raise InputError(str(exc)) from None
    found: list[str] = []
    for e in sorted(entries, key=lambda e: e.name):
        if not e.is_dir:
            continue
        child = fs.join(uri, e.name)
        if e.name.startswith(STORE_DIR_PREFIX) and _is_store(child):
            found.append(child)
            continue
        try:
            grand = fs.list_dir(child)
        except fs.FsError:
            continue
        for g in sorted(grand, key=lambda g: g.name):
            path = fs.join(child, g.name)
            if g.is_dir and g.name.startswith(STORE_DIR_PREFIX) and _is_store(path):
                found.append(path)
    if not found:
        raise InputError(
            f"{uri}: not a log store (no {DATA_DIR}/) and no {STORE_DIR_PREFIX}* store under it"
        )
    return found


def _cluster_state(uri: str) -> dict[str, Any] | None:
    """``cluster.json`` of an ``mqcluster`` base directory, if ``uri`` is one (bounded:
    the file names a handful of nodes)."""
    state = fs.join(uri, CLUSTER_STATE_FILE)
    if not fs.exists(state):
        return None
    try:
        raw = fs.read_range(state, 0, CLUSTER_STATE_MAX_BYTES + 1)
        if len(raw) > CLUSTER_STATE_MAX_BYTES:
            return None
        doc = json.loads(raw)
    except (fs.FsError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


def group_name_of(uri: str) -> str | None:
    """The group an ``mqcluster`` base directory was set up with, if ``uri`` is one."""
    doc = _cluster_state(uri)
    group = doc.get("group") if doc else None
    return str(group) if group else None


def removed_ids_of(uri: str) -> frozenset[str]:
    """The ids ``cluster.json`` lists as removed from the group (none if ``uri`` is not an
    mqcluster base directory)."""
    doc = _cluster_state(uri)
    removed = doc.get("removed") if doc else None
    if not isinstance(removed, list):
        return frozenset()
    return frozenset(r for r in removed[:MAX_REMOVED_IDS] if isinstance(r, str))


def replica_name(root: str) -> str:
    name = fs.basename(root)
    return name[len(STORE_DIR_PREFIX) :] if name.startswith(STORE_DIR_PREFIX) else name


def sources_from_paths(group: str, uris: Sequence[str]) -> list[ReplicaSource]:
    roots: list[str] = []
    removed: set[str] = set()
    for uri in uris:
        found = discover(uri)
        roots.extend(found)
        listed = removed_ids_of(uri)
        removed.update(r for r in found if replica_name(r) in listed)
    names = [replica_name(r) for r in roots]
    if len(set(names)) != len(names):  # same member id in two places: name them by path
        names = list(roots)
    if len(set(roots)) != len(roots):
        raise InputError(f"group {group}: the same store is given twice")
    return [
        ReplicaSource(group, n, r, listed_removed=r in removed)
        for n, r in zip(names, roots, strict=True)
    ]


def sources_from_running(
    addrs: Sequence[str], group: str = "", security: ClientSecurity | None = None
) -> list[ReplicaSource]:
    """Ask each node of a running group (client addresses) for its store and commit index,
    reaching them as ``security`` says (TLS, signed calls; None: plaintext). The imports are
    local: Spark's executors load this module and need no gRPC."""
    from dledger.server.client import ClientError
    from mqcluster.cluster import ClusterError, log_client
    from mqsecurity.channels import PLAINTEXT

    out: list[ReplicaSource] = []
    try:
        client = log_client(list(addrs), group, security or PLAINTEXT)
    except ClusterError as exc:
        raise InputError(str(exc)) from None
    with client:
        for addr in addrs:
            try:
                md = client.metadata(addr, timeout_s=5.0)
            except ClientError as exc:
                raise InputError(f"cannot ask node {addr} for its metadata: {exc}") from None
            if not md.store_path:
                raise InputError(f"node {addr} did not report its store path")
            out.append(
                ReplicaSource(
                    md.group or group or DEFAULT_GROUP,
                    md.self_id or addr,
                    md.store_path,
                    int(md.commit_index),
                    supported_feature_level=max(BASELINE_LEVEL, int(md.supported_feature_level)),
                    release=md.release or OLD_RELEASE,
                )
            )
    groups = {s.group for s in out}
    if len(groups) != 1:
        raise InputError(f"the nodes {list(addrs)} belong to different groups: {sorted(groups)}")
    return out


# ---------------------------------------------------------------------------------------
# One replica
# ---------------------------------------------------------------------------------------


def _numbered_files(
    src: ReplicaSource, directory: str, findings: list[Finding]
) -> list[tuple[int, str, int]]:
    """(start, name, size) of the segment-named files of ``directory``."""
    try:
        entries = fs.list_dir(directory)
    except fs.FsError as exc:
        raise InputError(str(exc)) from None
    out = []
    for e in entries:
        if e.is_dir or e.name.endswith(TRANSIENT_SUFFIXES):
            continue
        if len(e.name) != SEGMENT_NAME_DIGITS or not e.name.isdigit():
            findings.append(
                Finding(What.UNEXPECTED_FILE, src.group, src.replica, e.name,
                        fs.join(directory, e.name), detail="not a segment file name")
            )  # fmt: skip
            continue
        out.append((int(e.name), e.name, e.size_bytes))
    return sorted(out)


def _segments(
    src: ReplicaSource,
    data_dir: str,
    data: list[tuple[int, str, int]],
    seg_size: int,
    findings: list[Finding],
) -> list[SegmentFile]:
    """The data segments (each one's first index from its first header), with a finding for
    each file that is short or missing between two others."""
    g, r = src.group, src.replica
    segments: list[SegmentFile] = []
    for start, name, size in data:
        uri = fs.join(data_dir, name)
        if seg_size and start % seg_size:
            raise InputError(
                f"{uri}: does not start at a multiple of the segment size {seg_size}; "
                "pass --segment-bytes"
            )
        if size < seg_size:
            findings.append(
                Finding(What.SHORT_SEGMENT, g, r, name, uri, offset=size,
                        detail=f"the file is {size} bytes, the segment size is {seg_size}")
            )  # fmt: skip
        first = 0
        try:
            h = codec.decode_header(fs.read_range(uri, 0, ENTRY_HEADER_SIZE))
            if h.position == start:
                first = h.index
        except RecordError:
            pass
        except fs.FsError as exc:
            raise InputError(str(exc)) from None
        segments.append(SegmentFile(name, uri, start, size, first))
    for a, b in itertools.pairwise(segments):
        if b.start != a.start + seg_size:
            missing = a.start + seg_size
            findings.append(
                Finding(What.MISSING_SEGMENT, g, r, f"{missing:0{SEGMENT_NAME_DIGITS}d}",
                        fs.join(data_dir, f"{missing:0{SEGMENT_NAME_DIGITS}d}"), offset=0,
                        detail=f"data segments {a.name} and {b.name} are not adjacent")
            )  # fmt: skip
    return segments


def _unit(files: list[tuple[int, str, int]], override: int | None) -> int:
    """The segment size: every file is that long except a damaged one, so the largest."""
    if override:
        return override
    return max((size for _, _, size in files), default=0)


def plan_replica(
    src: ReplicaSource, *, segment_size_bytes: int | None = None
) -> tuple[ReplicaPlan, list[Finding]]:
    findings: list[Finding] = []
    g, r = src.group, src.replica
    # Checkpoint: commit index and the first index retention kept.
    ckpt_uri = fs.join(src.root, CHECKPOINT_FILE)
    ckpt = codec.Checkpoint()
    commit_known = src.commit_index is not None
    if fs.exists(ckpt_uri):
        try:
            ckpt = codec.decode_checkpoint(fs.read_all(ckpt_uri))
            commit_known = True
        except RecordError as exc:
            findings.append(
                Finding(What.BAD_CHECKPOINT, g, r, CHECKPOINT_FILE, ckpt_uri, offset=exc.offset,
                        detail=exc.reason)
            )  # fmt: skip
        except (fs.FsError, FormatTooNewError) as exc:  # a newer release's store: not damage
            raise InputError(str(exc)) from None
    commit_index = src.commit_index if src.commit_index is not None else ckpt.commit_index

    data_dir = fs.join(src.root, DATA_DIR)
    data = _numbered_files(src, data_dir, findings)
    seg_size = _unit(data, segment_size_bytes)
    segments = _segments(src, data_dir, data, seg_size, findings)

    index_dir = fs.join(src.root, INDEX_DIR)
    index_files_raw = _numbered_files(src, index_dir, findings) if fs.exists(index_dir) else []
    idx_size = _unit(index_files_raw, None) or INDEX_RECORD_SIZE
    index_files = tuple(
        IndexFile(name, fs.join(index_dir, name), start, size)
        for start, name, size in index_files_raw
    )
    rp = ReplicaPlan(
        group=g,
        replica=r,
        root=src.root,
        segment_size_bytes=seg_size or 1,
        index_segment_size_bytes=idx_size,
        segments=tuple(segments),
        index_files=index_files,
        first_index=ckpt.base_index + 1,
        commit_index=commit_index,
        commit_known=commit_known,
        est_last_index=0,
        est_end_position=segments[0].start if segments else 0,
    )
    last, end = _estimate_last(rp)
    promised, promise_uri = _read_promise(src, findings)
    rp = dataclasses.replace(
        rp,
        est_last_index=last,
        est_end_position=end,
        derived=has_derived_state(src.root),
        promised_index=promised,
        promise_uri=promise_uri,
        feature_level=_store_level(src, ckpt),
        supported_feature_level=src.supported_feature_level,
        release=src.release,
    )
    return rp, findings


def _store_level(src: ReplicaSource, ckpt: codec.Checkpoint) -> int:
    """The group feature level the store reached: its checkpoint's (format 3 carries it) or
    its saved committed configuration's, the higher (either may lag the other by a round)."""
    conf = saved_configuration(src)
    return max(ckpt.feature_level, conf.features if conf is not None else BASELINE_LEVEL)


def _read_promise(src: ReplicaSource, findings: list[Finding]) -> tuple[int, str]:
    """(promised index, promise file) of the store: the sibling ``dledger-{id}.promise``
    (dledger/storage/promise.py); (0, "") when there is none."""
    uri = fs.join(fs.dirname(src.root), fs.basename(src.root) + PROMISE_SUFFIX)
    if not fs.exists(uri):
        return 0, ""
    try:
        promise = decode_promise(fs.read_range(uri, 0, PROMISE_FILE_BYTES + 1))
    except (PromiseError, fs.FsError) as exc:
        findings.append(
            Finding(What.BAD_PROMISE, src.group, src.replica, fs.basename(uri), uri, offset=0,
                    detail=f"{exc}: the index this node promised is unknown")
        )  # fmt: skip
        return 0, uri
    if promise.node_id != replica_name(src.root):
        findings.append(
            Finding(What.BAD_PROMISE, src.group, src.replica, fs.basename(uri), uri, offset=0,
                    detail=f"the promise file is member {promise.node_id}'s")
        )  # fmt: skip
        return 0, uri
    return promise.promised_index, uri


def _index_record(rp: ReplicaPlan, index: int) -> codec.IndexRecord | None:
    f = rp.index_file_for(index)
    if f is None:
        return None
    off = index * INDEX_RECORD_SIZE - f.start
    raw = fs.read_range(f.uri, off, INDEX_RECORD_SIZE)
    if len(raw) < INDEX_RECORD_SIZE:
        return None
    try:
        return codec.decode_index_record(raw, 0)
    except RecordError:
        return None


def _estimate_last(rp: ReplicaPlan) -> tuple[int, int]:
    """Last index and end position per the index files (binary search over the dense
    records): an estimate used to size the tasks, never trusted for the audit itself."""
    if not rp.index_files:
        return rp.first_index - 1, rp.est_end_position
    top = (rp.index_files[-1].start + rp.index_files[-1].size_bytes) // INDEX_RECORD_SIZE - 1
    lo, hi = rp.first_index - 1, top  # invariant: record lo present (or lo = first - 1)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if _index_record(rp, mid) is not None:
            lo = mid
        else:
            hi = mid - 1
    rec = _index_record(rp, lo) if lo >= rp.first_index else None
    end = rec.position + rec.size if rec is not None else rp.est_end_position
    return lo, end


# ---------------------------------------------------------------------------------------
# A group and its tasks
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Members:
    """The group's current members, and where that came from."""

    ids: frozenset[str]
    index: int  # the CONFIG entry that set it (0: not from the log)
    source: str


def saved_configuration(src: ReplicaSource) -> ConfState | None:
    """The committed configuration the node saved in its store (``membership.json``, written
    when it applies a CONFIG entry); None when it saved none or the file is unreadable."""
    path = fs.join(src.root, MEMBERSHIP_FILE)
    if not fs.exists(path):
        return None
    try:
        raw = fs.read_range(path, 0, MEMBERSHIP_FILE_MAX_BYTES + 1)
        if len(raw) > MEMBERSHIP_FILE_MAX_BYTES:
            return None
        doc = json.loads(raw)
        if not isinstance(doc, dict) or doc.get("joining") is True:
            return None
        index = doc.get("index")
        if not isinstance(index, int) or index < 1:
            return None
        return decode_configuration(json.dumps(doc.get("config")).encode(), index)
    except (fs.FsError, ValueError):
        return None


def current_members(sources: Sequence[ReplicaSource]) -> Members | None:
    """The latest committed configuration any replica saved (configurations are committed
    in log order, so the highest index is the newest); None when no replica saved one."""
    best: ConfState | None = None
    holder = ""
    for src in sources:
        conf = saved_configuration(src)
        if conf is not None and (best is None or conf.index > best.index):
            best, holder = conf, src.replica
    if best is None:
        return None
    return Members(
        best.voters | best.learners,
        best.index,
        f"the committed configuration of index {best.index} ({holder}'s {MEMBERSHIP_FILE})",
    )


def _members_only(
    group: str, sources: Sequence[ReplicaSource]
) -> tuple[list[ReplicaSource], list[Finding]]:
    """The sources of current members, and a finding for each store left out. Trusted
    first: the latest committed configuration the replicas saved (what the nodes act on);
    without one (a group never changed), the ``removed`` list of ``cluster.json``."""
    members = current_members(sources)
    keep: list[ReplicaSource] = []
    out: list[Finding] = []
    for src in sources:
        if members is not None:
            gone = src.replica not in members.ids and "/" not in src.replica
            why = f"not a member in {members.source}"
        else:
            gone = src.listed_removed
            why = f"listed as removed in {CLUSTER_STATE_FILE}"
        if not gone:
            keep.append(src)
            continue
        out.append(
            Finding(What.NOT_A_MEMBER, group, src.replica, "", src.root,
                    detail=f"{why}: its store is a removed member's leftover, not audited")
        )  # fmt: skip
    if not keep:
        raise InputError(f"group {group}: none of the stores belongs to a current member")
    return keep, out


def plan_group(
    group: str,
    sources: Sequence[ReplicaSource],
    *,
    upto: int | None = None,
    segment_size_bytes: int | None = None,
    leaf_entries: int = LEAF_ENTRIES,
) -> GroupPlan:
    if not sources:
        raise InputError(f"group {group}: no replicas")
    sources, findings = _members_only(group, sources)
    replicas: list[ReplicaPlan] = []
    for src in sources:
        rp, found = plan_replica(src, segment_size_bytes=segment_size_bytes)
        replicas.append(rp)
        findings.extend(found)
    if upto is not None:
        audited, origin = upto, "--upto"
    else:
        # A replica whose log ends below its promise was rolled back (an older copy of its
        # store): its checkpoint is as old, and would lower the audited index.
        whole = [rp for rp in replicas if rp.est_last_index >= rp.promised_index] or replicas
        known = [rp.commit_index for rp in whole if rp.commit_known]
        from_rpc = all(s.commit_index is not None for s in sources)
        audited = min(known) if known else 0
        origin = "metadata" if from_rpc else "checkpoints"
    first = min(rp.first_index for rp in replicas)
    level = max(rp.feature_level for rp in replicas)
    findings.extend(_below_level(group, replicas, level))
    log.info(
        "planned group=%s replicas=%d audited_index=%d from=%s first_index=%d",
        group,
        len(replicas),
        audited,
        origin,
        first,
    )
    return GroupPlan(
        group, tuple(replicas), audited, origin, first, tuple(findings), leaf_entries, level
    )


def _below_level(group: str, replicas: Sequence[ReplicaPlan], level: int) -> list[Finding]:
    """Members below the group's feature level ``level`` (the highest any store reached: a
    raise is committed before a store records it). A running node that reports a lower
    support gets nothing from its leader (docs/RAFT.md section 14); offline, a store that
    has not reached the level is either behind or such a member, which the store cannot tell."""
    out = []
    for rp in replicas:
        supported = rp.supported_feature_level
        if supported and supported < level:
            detail = (
                f"runs {rp.release}, which supports feature levels up to {supported}, below "
                f"the group's level {level}: its leader sends it no entries until it is "
                "upgraded; upgrade it"
            )
        elif not supported and rp.feature_level < level:
            detail = (
                f"its store is at feature level {rp.feature_level}, below the group's level "
                f"{level}: it is behind, or runs a release that supports less, which its "
                "leader sends no entries; ask the running group (mqaudit --connect, mqadmin "
                "replicaStatus)"
            )
        else:
            continue
        out.append(Finding(What.BELOW_FEATURE_LEVEL, group, rp.replica, "", rp.root, detail=detail))
    return out


def plan_tasks(
    plans: Sequence[GroupPlan],
    *,
    task_bytes: int = TASK_TARGET_BYTES,
    first_id: int = 0,
    derived: bool = True,
) -> list[TaskSpec]:
    """Index ranges of about ``task_bytes`` of each replica's log, cut along the segments of
    the replica that holds the most; every replica's first index and the audited index + 1
    are cut points too, so that no range mixes committed entries with the uncommitted tail.
    With ``derived``, one more task per replica that has a broker's derived state."""
    tasks: list[TaskSpec] = []
    next_id = first_id
    for plan in plans:
        if derived:
            for rp in plan.replicas:
                if rp.derived:
                    tasks.append(TaskSpec(next_id, plan.group, 0, 0, 0, TASK_DERIVED, rp.replica))
                    next_id += 1
        ref = max(plan.replicas, key=lambda rp: rp.est_end_position - _data_start(rp))
        points = {plan.first_index, plan.audited_index + 1}
        points.update(rp.first_index for rp in plan.replicas)
        sizes: dict[int, int] = {}
        segs = [s for s in ref.segments if s.first_index]
        for k, s in enumerate(segs):
            if k + 1 < len(segs):
                nxt, nbytes = segs[k + 1].first_index, ref.segment_size_bytes
            else:
                nxt = ref.est_last_index + 1
                nbytes = max(ref.est_end_position - s.start, 0)
            n = max(1, math.ceil(nbytes / task_bytes))
            span = max(nxt - s.first_index, 0)
            for j in range(n):
                p = s.first_index + (span * j) // n
                points.add(p)
                sizes[p] = nbytes // n
        cuts = sorted(p for p in points if p >= max(plan.first_index, 1))
        for i, lo in enumerate(cuts):
            hi = cuts[i + 1] if i + 1 < len(cuts) else 0
            tasks.append(TaskSpec(next_id, plan.group, lo, hi, sizes.get(lo, 0)))
            next_id += 1
    return tasks


def _data_start(rp: ReplicaPlan) -> int:
    return rp.segments[0].start if rp.segments else 0
