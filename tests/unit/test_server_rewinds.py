"""The node's side of a rewind its state machine cannot do in place (dledger.server.rewinds):
the promise raised and a marker written before the process restarts itself, and the next
start counting the rebuild and, for a snapshot, dropping the log (the promise file and the
hard state kept, so the member comes back repairing)."""

from __future__ import annotations

import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from dledger.log import Entry, HardState
from dledger.rewind import RewindOutcome
from dledger.server import node as node_mod
from dledger.server import rewinds
from dledger.server.node import DLedgerNode
from dledger.storage.promise import promise_path_for_store, read_promise
from dledger.storage.store import SegmentedLogStore, StoreConfig
from prockit import fatal as fatal_mod

SEG = 64 * 1024
CFG = StoreConfig(segment_size_bytes=SEG, index_segment_size_bytes=SEG)


class _Restarted(Exception):
    pass


def _node(store_dir: Path, store: SegmentedLogStore) -> SimpleNamespace:
    node = SimpleNamespace(
        cfg=SimpleNamespace(store_dir=str(store_dir), promise_path="", group="g", self_id="n0"),
        core=SimpleNamespace(leader_id="n1", commit_index=40),
        store=store,
        _applied=40,
        state_rebuilds={},
        rewind_restarts_recent=0,
    )
    node._mark_rebuild = DLedgerNode._mark_rebuild.__get__(node)
    node._restart_to_rebuild = DLedgerNode._restart_to_rebuild.__get__(node)
    node._carry_out_rebuild = DLedgerNode._carry_out_rebuild.__get__(node)
    node._stop_rewind_repeats = DLedgerNode._stop_rewind_repeats.__get__(node)
    return node


def _restart_raises(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    lines: list[str] = []

    def restart() -> None:
        raise _Restarted

    monkeypatch.setattr(fatal_mod, "_restart", restart)
    monkeypatch.setattr(fatal_mod.logger, "error", lambda line, *a: lines.append(line % a))
    return lines


def test_a_snapshot_rebuild_raises_the_promise_restarts_and_drops_the_log_at_the_next_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "dledger-n0"
    store = SegmentedLogStore(root, CFG)
    store.append([Entry(2, i, b"entry-%d" % i) for i in range(1, 51)])
    store.flush()
    store.save_hard_state(HardState(term=2, voted_for="n1"))
    lines = _restart_raises(monkeypatch)
    node = _node(root, store)
    # Before the Ready's job (its entries up to 52): the promise and the marker, durably.
    node._mark_rebuild(30, RewindOutcome.NEEDS_SNAPSHOT, 52)
    promise = read_promise(promise_path_for_store(root))
    assert promise is not None and promise.promised_index == 52
    marker = rewinds.read_marker(root)
    assert marker is not None and (marker.how, marker.index, marker.leader) == (
        "snapshot",
        30,
        "n1",
    )
    assert marker.restarts == 1
    with pytest.raises(_Restarted):  # after the job
        node._restart_to_rebuild(30, RewindOutcome.NEEDS_SNAPSHOT)
    store.close()
    assert len(lines) == 1 and lines[0].startswith("RESTART component=rewind cause=")
    assert "REBUILD_STATE how=snapshot index=30 applied=40 leader=n1" in lines[0]
    # The next start: the log dropped, the hard state kept, the rebuild counted.
    node._carry_out_rebuild()
    assert node.state_rebuilds == {"snapshot": 1}
    assert node.rewind_restarts_recent == 1
    # Only the count is kept (within its window): a later start carries nothing out.
    kept = rewinds.read_marker(root)
    assert kept is not None and kept.how == rewinds.DONE and kept.restarts == 1
    again = SegmentedLogStore(root, CFG)
    assert again.last_index() == 0
    assert again.load_hard_state() == HardState(term=2, voted_for="n1")
    again.close()
    assert read_promise(promise_path_for_store(root)) == promise


def test_a_replay_rebuild_keeps_the_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "dledger-n0"
    store = SegmentedLogStore(root, CFG)
    store.append([Entry(1, i, b"entry-%d" % i) for i in range(1, 11)])
    store.flush()
    lines = _restart_raises(monkeypatch)
    node = _node(root, store)
    node._mark_rebuild(5, RewindOutcome.REPLAY_AT_START, 10)
    with pytest.raises(_Restarted):
        node._restart_to_rebuild(5, RewindOutcome.REPLAY_AT_START)
    store.close()
    assert "how=replay index=5" in lines[0]
    assert read_promise(promise_path_for_store(root)) is None  # nothing dropped: not raised
    node._carry_out_rebuild()
    assert node.state_rebuilds == {"replay": 1}
    again = SegmentedLogStore(root, CFG)
    assert again.last_index() == 10
    again.close()


def test_a_marker_that_does_not_parse_drops_nothing(tmp_path: Path) -> None:
    root = tmp_path / "s"
    root.mkdir()
    for junk in (b"how=snapshot index=x leader=n1\n", b"\xff" * 300, b"how=wipe index=1 leader=n1"):
        (root / rewinds.REWOUND_FILE).write_bytes(junk)
        marker = rewinds.read_marker(root)
        assert marker is not None
        assert (marker.how, marker.index, marker.leader, marker.restarts) == ("replay", 0, "-", 1)


class _Stopped(Exception):
    pass


def _fatal_raises(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    causes: list[str] = []

    def stop(component: str, cause: object) -> None:
        causes.append(f"{component}: {cause}")
        raise _Stopped

    monkeypatch.setattr(node_mod, "fatal", stop)
    return causes


def test_a_member_made_to_rebuild_again_and_again_stops_naming_the_leader(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A peer that keeps forging: each repair restarts the member to rebuild; past the limit
    within the window it stops (REWIND_REPEATS) before it marks or raises anything."""
    root = tmp_path / "dledger-n0"
    store = SegmentedLogStore(root, CFG)
    store.append([Entry(1, i, b"entry-%d" % i) for i in range(1, 51)])
    store.flush()
    _restart_raises(monkeypatch)
    causes = _fatal_raises(monkeypatch)
    node = _node(root, store)
    for n in range(1, rewinds.MAX_REWIND_RESTARTS + 1):
        node._mark_rebuild(30, RewindOutcome.REPLAY_AT_START, 50)
        node._carry_out_rebuild()  # the restarted process
        assert node.rewind_restarts_recent == n
    assert node.state_rebuilds == {"replay": rewinds.MAX_REWIND_RESTARTS}
    before = (root / rewinds.REWOUND_FILE).read_bytes()
    with pytest.raises(_Stopped):
        node._mark_rebuild(30, RewindOutcome.NEEDS_SNAPSHOT, 50)
    store.close()
    assert len(causes) == 1 and causes[0].startswith("rewind: REWIND_REPEATS 4 restarts")
    assert "leader n1's copy" in causes[0] and "mTLS" in causes[0]
    # Nothing marked: no drop of the log, no raised promise; the count dropped, so that a
    # start by a person repairs once more instead of stopping at its first repair.
    assert before.startswith(b"how=done")
    assert rewinds.read_marker(root) is None
    assert read_promise(promise_path_for_store(root)) is None


def test_the_count_starts_again_after_a_quiet_window(tmp_path: Path) -> None:
    root = tmp_path / "s"
    root.mkdir()
    old_s = time.time() - rewinds.REWIND_RESTART_WINDOW_S - 5
    marker = rewinds.RewoundMarker(rewinds.DONE, 3, "n1", rewinds.MAX_REWIND_RESTARTS, old_s)
    rewinds.write_marker(root, marker)
    assert rewinds.recent_restarts(root, time.time()) == 0
    fresh = rewinds.next_restart(root, "replay", 9, "n2", time.time())
    assert fresh.restarts == 1 and fresh.since_s > old_s
    # Within the window the count goes on; a start carrying out an old one removes it.
    rewinds.write_marker(root, fresh)
    assert rewinds.next_restart(root, "replay", 9, "n2", time.time()).restarts == 2
    rewinds.carried_out(root, marker)
    assert rewinds.read_marker(root) is None


def test_a_marker_from_before_the_count_reads_as_the_first_restart(tmp_path: Path) -> None:
    root = tmp_path / "s"
    root.mkdir()
    (root / rewinds.REWOUND_FILE).write_bytes(b"how=snapshot index=7 leader=n2\n")
    marker = rewinds.read_marker(root)
    assert marker is not None and (marker.how, marker.index, marker.restarts) == ("snapshot", 7, 1)
    for junk in (
        b"how=done index=1 leader=n1 restarts=0 since_s=1",
        b"how=done index=1 leader=n1 restarts=1 since_s=nan",
    ):
        (root / rewinds.REWOUND_FILE).write_bytes(junk)
        bad = rewinds.read_marker(root)
        assert bad is not None and bad.how == "replay"
