"""The node's side of a rewind its state machine cannot do in place (dledger.server.rewinds):
the promise raised and a marker written before the process restarts itself, and the next
start counting the rebuild and, for a snapshot, dropping the log (the promise file and the
hard state kept, so the member comes back repairing)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from dledger.log import Entry, HardState
from dledger.rewind import RewindOutcome
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
    )
    node._mark_rebuild = DLedgerNode._mark_rebuild.__get__(node)
    node._restart_to_rebuild = DLedgerNode._restart_to_rebuild.__get__(node)
    node._carry_out_rebuild = DLedgerNode._carry_out_rebuild.__get__(node)
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
    assert rewinds.read_marker(root) == rewinds.RewoundMarker("snapshot", 30, "n1")
    with pytest.raises(_Restarted):  # after the job
        node._restart_to_rebuild(30, RewindOutcome.NEEDS_SNAPSHOT)
    store.close()
    assert len(lines) == 1 and lines[0].startswith("RESTART component=rewind cause=")
    assert "REBUILD_STATE how=snapshot index=30 applied=40 leader=n1" in lines[0]
    # The next start: the log dropped, the hard state kept, the rebuild counted.
    node._carry_out_rebuild()
    assert node.state_rebuilds == {"snapshot": 1}
    assert rewinds.read_marker(root) is None
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
        assert rewinds.read_marker(root) == rewinds.RewoundMarker("replay", 0, "-")
