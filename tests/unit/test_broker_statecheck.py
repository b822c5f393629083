"""Replicated broker state against the commitlog (broker.state.statecheck): POP in-flight records
and positions, delay and timer levels, pending transaction halves. A snapshot row that disagrees
with the log makes the open rebuild the whole state from the log (or refuse to start when
retention deleted the log's start); the scrubber finds a row changed at run time and marks
the node for that rebuild."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from broker_world import MemoryLog, outgoing, world

from broker.components.pop import Pops, ReceiveQuery
from broker.components.retry import Retries
from broker.components.scrubber import Scrubber
from broker.components.sending import SendPath
from broker.components.transactions import Transactions
from broker.metrics import scrub_families
from broker.state import derived, statecheck
from broker.state.machine import BrokerStateMachine
from dledger.core import Role
from dledger.rewind import NeedsSnapshotError

GROUP = "G"


async def _busy(root: Path) -> tuple[MemoryLog, BrokerStateMachine]:
    """A leader with messages in T's two queues, 4 of queue 0 received by POP (in flight),
    one delayed message (level 3) and one pending transaction half."""
    node, sm, topics, applied = world(root)
    await topics.upsert("T", 2, 2, 6)
    txns = Transactions(applied)
    sender = SendPath(
        topics.ctx, topics, halves=txns.prepare
    )  # sends of half messages go through it
    await sender.send("T", [outgoing(i % 2, i) for i in range(12)])
    await sender.send("T", [outgoing(1, 100, DELAY="3")])
    await sender.send("T", [outgoing(1, 101, TRAN_MSG="true")])
    pops = Pops(topics, applied, Retries(topics, applied, sender), 2, 10_000)
    got = await pops.receive(ReceiveQuery(GROUP, "T", 0, 4, 60_000))
    assert len(got) == 4
    assert sm.pop.get((GROUP, "T", 0)) is not None and len(sm.txn.pending) == 1
    sm.schedule_offsets[3] = 1  # as a delivery of the delayed message would leave it
    return node.store, sm


def _stopped(root: Path) -> MemoryLog:
    """``_busy``, then a clean stop (its snapshot written)."""
    log, sm = asyncio.run(_busy(root))
    sm.close()
    return log


def _edit_snapshot(root: Path, change: Callable[[dict[str, Any]], None]) -> None:
    path = root / "config" / "snapshot.json"
    data = json.loads(path.read_bytes())
    change(data)
    path.write_text(json.dumps(data))


def _open(root: Path, log: MemoryLog) -> BrokerStateMachine:
    sm = BrokerStateMachine(root, hash_slots=1000, max_index_records=5000)
    sm.attach(log)
    sm.on_role_change(Role.LEADER, 1, "n0")
    sm.applied_index()
    return sm


def _rebuilt_right(sm: BrokerStateMachine, log: MemoryLog, want: dict[str, Any]) -> None:
    """The state was rebuilt from the log: applying it gives the state before the damage."""
    assert sm.last_applied == 0
    sm.apply(log.entries)
    sm.schedule_offsets[3] = 1  # (set by hand in _busy, not by an entry)
    assert json.loads(json.dumps(sm.pop.capture())) == want["pop"]
    assert json.loads(json.dumps(sm.txn.capture())) == want["txn"]
    assert not (sm.config_dir / derived.REBUILD_MARKER).exists()


def test_right_state_passes_the_open_check_and_a_scrub_pass(tmp_path: Path) -> None:
    log = _stopped(tmp_path)
    sm = _open(tmp_path, log)
    try:
        assert sm.last_applied == len(log.entries)  # no rebuild
        # 1 POP position + 4 in flight, 1 level, 1 half
        assert sm.derived.checked["pop"] == 5
        assert sm.derived.checked["level"] == 1
        assert sm.derived.checked["transaction"] == 1
        asyncio.run(Scrubber(sm, 100_000).one_pass())
        assert sm.derived.checked["pop"] == 10 and sm.derived.checked["transaction"] == 2
        assert not sm.derived.mismatches and sm.derived.unrepaired == 0
    finally:
        sm.close()


def test_a_pop_record_at_the_wrong_position_rebuilds_the_state_at_open(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    log = _stopped(tmp_path)
    want = json.loads((tmp_path / "config" / "snapshot.json").read_bytes())
    other = next(r for r in want["pop"][0][4] if r[0] == 2)[1]

    def point_elsewhere(data: dict[str, Any]) -> None:
        record = next(r for r in data["pop"][0][4] if r[0] == 1)
        record[1] = other  # offset 1 in flight at offset 2's message

    _edit_snapshot(tmp_path, point_elsewhere)
    sm = _open(tmp_path, log)
    try:
        assert sm.derived.mismatches == {("pop", "open"): 1}
        assert "derived state: pop record wrong where=open" in caplog.text
        assert "rebuilding broker state from the commitlog" in caplog.text
        _rebuilt_right(sm, log, want)
    finally:
        sm.close()


def test_a_pop_position_beyond_its_queue_rebuilds_the_state_at_open(tmp_path: Path) -> None:
    log = _stopped(tmp_path)
    want = json.loads((tmp_path / "config" / "snapshot.json").read_bytes())
    _edit_snapshot(tmp_path, lambda data: data["pop"][0].__setitem__(3, 7))  # queue holds 6
    sm = _open(tmp_path, log)
    try:
        assert sm.derived.mismatches == {("pop", "open"): 1}
        _rebuilt_right(sm, log, want)
    finally:
        sm.close()


@pytest.mark.parametrize("table", ["schedule", "timer"])
def test_a_level_beyond_its_queue_rebuilds_the_state_at_open(tmp_path: Path, table: str) -> None:
    log = _stopped(tmp_path)
    want = json.loads((tmp_path / "config" / "snapshot.json").read_bytes())
    # Delay level 3's queue holds 1 message; timer level 5's queue holds none.
    _edit_snapshot(
        tmp_path, lambda data: data[table].update({"3" if table == "schedule" else "5": 2})
    )
    sm = _open(tmp_path, log)
    try:
        assert sm.derived.mismatches == {("level", "open"): 1}
        _rebuilt_right(sm, log, want)
        assert sm.timer_offsets == {}
    finally:
        sm.close()


@pytest.mark.parametrize("column", [2, 1, 3, 4])  # uniq id, size, topic, queue id
def test_a_transaction_half_that_differs_rebuilds_the_state_at_open(
    tmp_path: Path, column: int
) -> None:
    log = _stopped(tmp_path)
    want = json.loads((tmp_path / "config" / "snapshot.json").read_bytes())
    row = want["txn"]["pending"][0]
    changed = {2: "0" * 32, 1: row[1] - 1, 3: "U", 4: 0 if row[4] else 1}[column]

    def change(data: dict[str, Any]) -> None:
        data["txn"]["pending"][0][column] = changed

    _edit_snapshot(tmp_path, change)
    sm = _open(tmp_path, log)
    try:
        assert sm.derived.mismatches == {("transaction", "open"): 1}
        _rebuilt_right(sm, log, want)
    finally:
        sm.close()


class _Trimmed(MemoryLog):
    """The log after retention deleted its first entry (nothing before the rest is read)."""

    def __init__(self, log: MemoryLog) -> None:
        super().__init__()
        self.entries, self.positions, self.data = log.entries, log.positions, log.data

    def first_index(self) -> int:
        return 2


def test_a_wrong_row_when_the_log_lost_its_start_asks_for_a_snapshot(tmp_path: Path) -> None:
    """A replay would drop what the deleted entries made (the topic T itself): the state
    machine asks the node for a snapshot (NeedsSnapshotError), and its files are left as they
    were."""
    log = _stopped(tmp_path)
    _edit_snapshot(tmp_path, lambda data: data["txn"]["pending"][0].__setitem__(2, "0" * 32))
    before = (tmp_path / "config" / "snapshot.json").read_bytes()
    sm = BrokerStateMachine(tmp_path, hash_slots=1000, max_index_records=5000)
    sm.attach(_Trimmed(log))
    with pytest.raises(NeedsSnapshotError, match="retention deleted the entries before"):
        sm.applied_index()
    assert (tmp_path / "config" / "snapshot.json").read_bytes() == before


def test_the_scrubber_finds_a_row_changed_at_run_time_and_the_next_start_rebuilds(
    tmp_path: Path,
) -> None:
    async def body() -> tuple[MemoryLog, BrokerStateMachine, list[Any]]:
        log, sm = await _busy(tmp_path)
        want = sm.pop.capture()
        q = sm.pop.get((GROUP, "T", 0))
        assert q is not None
        q.inflight[0].position += 1  # in memory (a bit flip, a bug)
        await Scrubber(sm, 100_000).one_pass()
        assert sm.derived.mismatches == {("pop", "scrub"): 1} and sm.derived.unrepaired == 1
        return log, sm, want

    log, sm, want = asyncio.run(body())
    marker = tmp_path / "config" / derived.REBUILD_MARKER
    assert marker.read_text().startswith(statecheck.MARKER_PREFIX)
    sm.close()  # its snapshot holds the wrong row too
    again = _open(tmp_path, log)
    try:
        assert again.last_applied == 0  # rebuilt from the log
        again.apply(log.entries)
        assert again.pop.capture() == want and not marker.exists()
    finally:
        again.close()


def test_a_run_time_mark_when_the_log_lost_its_start_asks_for_a_snapshot(tmp_path: Path) -> None:
    log = _stopped(tmp_path)
    (tmp_path / "config" / derived.REBUILD_MARKER).write_text(
        f"{statecheck.MARKER_PREFIX}G@T/0 offset 0 in flight at position 1"
    )
    sm = BrokerStateMachine(tmp_path, hash_slots=1000, max_index_records=5000)
    sm.attach(_Trimmed(log))
    with pytest.raises(NeedsSnapshotError):
        sm.applied_index()


def test_rows_changed_between_slices_are_looked_up_again(tmp_path: Path) -> None:
    """The scrubber lists rows at the start of its pass; one acknowledged (gone) or moved
    on since is skipped or checked as it stands, never taken for damage."""

    async def body() -> None:
        _log, sm = await _busy(tmp_path)
        rows = statecheck.rows_of(sm)
        q = sm.pop.get((GROUP, "T", 0))
        assert q is not None
        del q.inflight[0]
        sm.txn.pending.clear()
        assert statecheck.check_rows(sm, rows, "scrub") == []
        assert sm.derived.checked["pop"] == 4 and sm.derived.checked["transaction"] == 0

    asyncio.run(body())


def test_the_scrub_metrics_have_the_replicated_stores() -> None:
    c = derived.DerivedCounters()
    c.checked["transaction"] = 3
    c.wrong("pop", "open")
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in scrub_families(c)
        for s in family.samples
    }
    assert samples[("raftmq_scrub_records_checked_total", (("store", "transaction"),))] == 3
    assert samples[("raftmq_scrub_records_checked_total", (("store", "level"),))] == 0
    key = ("raftmq_scrub_mismatches_total", (("found", "open"), ("store", "pop")))
    assert samples[key] == 1
