"""The node's ready loop follows the Ready contract: the persist job runs in the flush thread
(the event loop keeps stepping meanwhile, and the next job writes what arrived: group commit),
and an acknowledgement leaves only once what it acknowledges is in the store."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import os
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from dledger.core import (
    AppendRequest,
    AppendResponse,
    Message,
    Role,
    TimeoutNow,
    VoteRequest,
    VoteResponse,
)
from dledger.core.raft import RaftNode
from dledger.log import Entry, EntryType
from dledger.server import node as node_module
from dledger.server.convert import to_pb
from dledger.server.membership import load_conf
from dledger.server.node import DLedgerNode, NodeConfig
from dledger.server.nodeconfig import LogOnlyStateMachine
from dledger.server.promises import PROMISE_AHEAD_ENTRIES, promise_ahead_entries
from dledger.storage import StoreConfig
from dledger.storage.promise import promise_path_for_store, read_promise
from mqcluster.cluster import _free_ports

DEADLINE_S = 10.0


async def _until(cond: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.005)


def _run_follower(
    tmp_path: Path,
    body: Callable[[DLedgerNode], Awaitable[None]],
    tick_ms: int = 50,
    append_timeout_ms: int = 3000,
) -> None:
    """n0 of {n0, n1}; n1 never runs, so n0 stays a follower of whatever n1 the test plays."""
    n0_port, n1_port, client_port = _free_ports(3)
    peers = {"n0": f"127.0.0.1:{n0_port}", "n1": f"127.0.0.1:{n1_port}"}
    store = StoreConfig(segment_size_bytes=1 << 20, preallocate=False)
    # A long election timeout: n0 never campaigns during the test.
    cfg = NodeConfig("g", "n0", peers, "127.0.0.1", client_port, str(tmp_path / "s"), store)
    cfg = dataclasses.replace(
        cfg,
        election_timeout_ms=60_000,
        heartbeat_interval_ms=max(100, tick_ms),
        tick_ms=tick_ms,
        append_timeout_ms=append_timeout_ms,
    )

    asyncio.run(_with_node(DLedgerNode(cfg, seed=1), body))


async def _with_node(node: DLedgerNode, body: Callable[[DLedgerNode], Awaitable[None]]) -> None:
    await node.start()
    try:
        await body(node)
    finally:
        await node.stop()


def _append(prev: int, n: int) -> AppendRequest:
    entries = tuple(Entry(1, prev + 1 + i, b"e%d" % (prev + 1 + i)) for i in range(n))
    return AppendRequest("n1", "n0", 1, prev, 1 if prev else 0, entries, 0)


def test_persist_runs_off_the_loop_and_acks_follow_it(tmp_path: Path) -> None:
    async def body(node: DLedgerNode) -> None:
        store = node.store
        sent: list[tuple[Message, int]] = []  # each message with the store's last index then
        assert node._transport is not None
        node._transport.send = lambda m: sent.append((m, store.last_index()))  # type: ignore[method-assign]
        gate = threading.Event()
        flush_threads: list[str] = []
        real_flush = store.flush

        def slow_flush() -> int:
            flush_threads.append(threading.current_thread().name)
            assert gate.wait(DEADLINE_S)
            return real_flush()

        store.flush = slow_flush  # type: ignore[method-assign]
        node.on_peer_message("n1", to_pb(_append(0, 1), "g"))
        await _until(lambda: flush_threads, "the first persist job to flush")
        # The job is blocked in the flush thread; the loop still steps new appends.
        node.on_peer_message("n1", to_pb(_append(1, 2), "g"))
        await asyncio.sleep(0.05)
        assert node.core.last_index == 3  # in the core's unstable tail
        assert not [m for m, _ in sent if isinstance(m, AppendResponse)]  # nothing acked yet
        gate.set()
        await _until(
            lambda: any(isinstance(m, AppendResponse) and m.match_index == 3 for m, _ in sent),
            "the ack of index 3",
        )
        assert len(flush_threads) == 2  # 1, then 2..3 in one job: group commit
        assert all(name.startswith("flush-n0") for name in flush_threads)
        for m, stored_last in sent:
            if isinstance(m, AppendResponse) and m.success:
                assert stored_last >= m.match_index, "acked before the entries were stored"
        assert store.flushed_index() == 3

    _run_follower(tmp_path, body)


def test_stored_committed_entries_are_applied_while_the_next_job_flushes(tmp_path: Path) -> None:
    """A Ready that commits stored entries and writes a new one: the stored ones are applied
    while its job waits for the disk; the new one, committed in the same Ready, only after."""

    async def body(node: DLedgerNode) -> None:
        store = node.store
        node.on_peer_message("n1", to_pb(_append(0, 2), "g"))
        await _until(lambda: node.core.stable_index == 2, "entries 1..2 stored")
        assert node._applied == 0
        gate = threading.Event()
        blocked: list[int] = []
        real_flush = store.flush

        def slow_flush() -> int:
            blocked.append(store.last_index())
            gate.wait(2 * DEADLINE_S)  # the test's finally opens it, whatever it found
            return real_flush()

        store.flush = slow_flush  # type: ignore[method-assign]
        entry3 = (Entry(1, 3, b"e3"),)
        node.on_peer_message("n1", to_pb(AppendRequest("n1", "n0", 1, 2, 1, entry3, 3), "g"))
        try:
            await _until(lambda: bool(blocked), "the job of entry 3 to flush")
            await _until(lambda: node._applied == 2, "1..2 applied during the flush")
            await asyncio.sleep(0.05)
            assert node._applied == 2 and store.flushed_index() == 2  # 3 waits for its flush
        finally:
            gate.set()
        await _until(lambda: node._applied == 3, "entry 3 applied after its flush")
        assert store.flushed_index() == 3

    _run_follower(tmp_path, body)


def test_a_full_disk_holds_the_ack_and_the_job_is_retried(tmp_path: Path) -> None:
    from dledger.storage import DiskFullError

    async def body(node: DLedgerNode) -> None:
        store = node.store
        sent: list[Message] = []
        assert node._transport is not None
        node._transport.send = sent.append  # type: ignore[method-assign]
        refusals = [2]
        real_append = store.append

        def full_append(entries: list[Entry]) -> int:
            if refusals[0]:
                refusals[0] -= 1
                raise DiskFullError("no space (test)")
            return real_append(entries)

        store.append = full_append  # type: ignore[method-assign]
        node.on_peer_message("n1", to_pb(_append(0, 2), "g"))
        await _until(lambda: node.dropped().get("disk_full", 0) >= 1, "a refused persist")
        assert not [m for m in sent if isinstance(m, AppendResponse)]
        await _until(lambda: store.last_index() == 2, "the retried job")
        await _until(
            lambda: any(isinstance(m, AppendResponse) and m.match_index == 2 for m in sent),
            "the ack after the retry",
        )
        assert node.dropped()["disk_full"] == 2

    _run_follower(tmp_path, body)


def test_the_leader_releases_held_commit_notices_after_the_linger(tmp_path: Path) -> None:
    """n0 leads (n1, played by the test, hands it leadership and acks its first entry): the
    commit notice the Ready held goes out from the driver's one timer: ticks (which release
    held notices too) and heartbeats come every 20 s here, after the test's deadline."""

    async def body(node: DLedgerNode) -> None:
        sent: list[Message] = []
        assert node._transport is not None
        node._transport.send = sent.append  # type: ignore[method-assign]
        await _lead_with_first_entry_acked(node, sent)
        await _until(
            lambda: any(isinstance(m, AppendRequest) and m.no_reply for m in sent),
            "the released commit notice",
        )
        (notice,) = [m for m in sent if isinstance(m, AppendRequest) and m.no_reply]
        assert notice.to_id == "n1" and notice.entries == () and notice.leader_commit == 1
        assert node._notice_release is None  # the one timer ran and nothing else is held

    _run_follower(tmp_path, body, tick_ms=20_000)


def test_a_hold_that_an_append_ended_is_not_released_by_its_timer(tmp_path: Path) -> None:
    """The leader holds a notice (its timer armed), then a proposal's append carries the
    commit: the hold is over, and the next commit's notice lingers its whole time instead of
    leaving with the first hold's timer (one notice per send at 1 in flight before the
    linger was timed from each hold)."""
    # Long enough that every step below happens well inside one linger, even on a busy host.
    linger_ms = 1000

    async def body(node: DLedgerNode) -> None:
        sent: list[Message] = []
        assert node._transport is not None
        node._transport.send = sent.append  # type: ignore[method-assign]
        await _lead_with_first_entry_acked(node, sent)
        await _until(lambda: node._notice_release is not None, "the armed release timer")
        task = asyncio.create_task(node.propose([b"x"], int(EntryType.NORMAL)))

        def appends_of_2() -> list[AppendRequest]:
            return [m for m in sent if isinstance(m, AppendRequest) and m.prev_log_index == 1]

        await _until(appends_of_2, "the append of entry 2")
        (append,) = appends_of_2()
        assert append.leader_commit == 1
        # The append carried the commit: the hold is over once the Ready is carried out.
        await _until(lambda: node._notice_hold_since is None, "the hold ended")
        held_at = time.monotonic()
        ack = AppendResponse("n1", "n0", 2, True, match_index=2, last_log_index=2)
        node.on_peer_message("n1", to_pb(ack, "g"))
        await task
        await _until(lambda: _notices(sent), "the notice of commit 2")
        released_after_s = time.monotonic() - held_at
        assert released_after_s >= linger_ms / 1000 * 0.9  # a whole linger
        assert [m.leader_commit for m in _notices(sent)] == [2]  # the first hold sent none

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(node_module, "COMMIT_NOTICE_LINGER_MS", linger_ms)
        _run_follower(tmp_path, body, tick_ms=20_000)


def test_one_release_timer_per_linger_not_per_send(tmp_path: Path) -> None:
    """At one send in flight each commit's Ready holds a notice and the next send's append
    ends the hold: the release timer is armed once per linger (and finds the latest hold),
    not armed and cancelled once per send."""
    linger_ms = 1000
    rounds = 20

    async def body(node: DLedgerNode) -> None:
        sent: list[Message] = []
        assert node._transport is not None
        node._transport.send = sent.append  # type: ignore[method-assign]
        await _lead_with_first_entry_acked(node, sent)
        loop = asyncio.get_running_loop()
        armed: list[float] = []
        real_at = loop.call_at  # the standard loop's call_later goes through it too

        def at(when: float, cb: Any, *args: Any, **kw: Any) -> asyncio.TimerHandle:
            if getattr(cb, "__name__", "") == "_release_notices":
                armed.append(when)
            return real_at(when, cb, *args, **kw)

        loop.call_at = at  # type: ignore[method-assign,assignment]
        started = time.monotonic()
        for i in range(2, rounds + 2):
            task = asyncio.create_task(node.propose([b"x"], int(EntryType.NORMAL)))
            await _until(
                lambda i=i: any(
                    isinstance(m, AppendRequest) and m.prev_log_index == i - 1 for m in sent
                ),
                f"the append of entry {i}",
            )
            ack = AppendResponse("n1", "n0", 2, True, match_index=i, last_log_index=i)
            node.on_peer_message("n1", to_pb(ack, "g"))
            await task
        lingers = int((time.monotonic() - started) * 1000 // linger_ms) + 1
        assert 1 <= len(armed) <= lingers + 1 < rounds
        assert _notices(sent) == []  # every commit went with the next send's append

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(node_module, "COMMIT_NOTICE_LINGER_MS", linger_ms)
        _run_follower(tmp_path, body, tick_ms=20_000)


def test_a_proposal_not_applied_in_time_raises_timeout_and_a_late_ack_is_harmless(
    tmp_path: Path,
) -> None:
    """The proposal's future is awaited under a timer of its own: with no ack it raises
    TimeoutError after append_timeout_ms; the ack that comes later commits and applies the
    entry without touching the settled future, and the next proposal is answered."""
    timeout_ms = 300

    async def body(node: DLedgerNode) -> None:
        sent: list[Message] = []
        assert node._transport is not None
        node._transport.send = sent.append  # type: ignore[method-assign]
        await _lead_with_first_entry_acked(node, sent)
        started = time.monotonic()
        with pytest.raises(TimeoutError):
            await node.propose([b"late"], int(EntryType.NORMAL))
        assert time.monotonic() - started >= timeout_ms / 1000 * 0.9
        ack = AppendResponse("n1", "n0", 2, True, match_index=2, last_log_index=2)
        node.on_peer_message("n1", to_pb(ack, "g"))
        await _until(lambda: node.applied == 2, "the late entry applied")
        assert node._waiters == []
        task = asyncio.create_task(node.propose([b"next"], int(EntryType.NORMAL)))
        await _until(
            lambda: any(isinstance(m, AppendRequest) and m.prev_log_index == 2 for m in sent),
            "the append of entry 3",
        )
        ack = AppendResponse("n1", "n0", 2, True, match_index=3, last_log_index=3)
        node.on_peer_message("n1", to_pb(ack, "g"))
        assert (await task)[:2] == (3, 3)

    _run_follower(tmp_path, body, tick_ms=20_000, append_timeout_ms=timeout_ms)


def _notices(sent: list[Message]) -> list[AppendRequest]:
    return [m for m in sent if isinstance(m, AppendRequest) and m.no_reply]


async def _lead_with_first_entry_acked(node: DLedgerNode, sent: list[Message]) -> None:
    """n1 hands n0 leadership in term 2 and acks its first entry: commit 1."""
    node.on_peer_message("n1", to_pb(AppendRequest("n1", "n0", 1, 0, 0, (), 0), "g"))
    node.on_peer_message("n1", to_pb(TimeoutNow("n1", "n0", 1), "g"))
    await _until(lambda: any(isinstance(m, VoteRequest) for m in sent), "a vote request")
    node.on_peer_message("n1", to_pb(VoteResponse("n1", "n0", 2, granted=True), "g"))
    await _until(lambda: node.core.role is Role.LEADER, "leadership")
    await _until(lambda: node.core.stable_index == 1, "the leader's entry on disk")
    ack = AppendResponse("n1", "n0", 2, True, match_index=1, last_log_index=1)
    node.on_peer_message("n1", to_pb(ack, "g"))
    await _until(lambda: node.core.commit_index == 1, "the commit")


def test_metadata_reports_the_stores_file_system(tmp_path: Path) -> None:
    from dledger.server.client_service import disk_space

    st = os.statvfs(tmp_path)
    total, free = disk_space(tmp_path)
    assert total == st.f_blocks * st.f_frsize > 0
    assert 0 < free <= total
    assert disk_space(tmp_path / "gone") == (0, 0)


def _promise_fsyncs_per_round(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """SYNC_FLUSH, one entry per round on a follower: each ack is exact in the promise file
    when its answer leaves; returns the promise file's fdatasync count after each of the
    rounds that follow the first two (a new term's, then the first written ahead)."""
    path = promise_path_for_store(tmp_path / "s")
    real = os.fdatasync
    promise_syncs: list[int] = []

    def counting(fd: int) -> None:
        if os.readlink(f"/proc/self/fd/{fd}") == str(path):
            promise_syncs.append(fd)
        real(fd)

    monkeypatch.setattr(os, "fdatasync", counting)
    # No checkpoint during the test (each one makes the last refresh durable).
    monkeypatch.setattr(node_module, "CHECKPOINT_INTERVAL_MS", 3_600_000)
    rounds = 20
    counts: list[int] = []

    async def body(node: DLedgerNode) -> None:
        acked: list[tuple[int, int]] = []

        def send(m: Message) -> None:
            if isinstance(m, AppendResponse) and m.success:
                got = read_promise(path)
                acked.append((m.match_index, got.promised_index if got else -1))

        assert node._transport is not None
        node._transport.send = send  # type: ignore[method-assign]
        # The first append carries a new term: its job writes the hard state and the exact
        # promise durably; the second one's promise is written ahead, durably.
        node.on_peer_message("n1", to_pb(_append(0, 1), "g"))
        await _until(lambda: len(acked) == 1, "the first ack")
        node.on_peer_message("n1", to_pb(_append(1, 1), "g"))
        await _until(lambda: len(acked) == 2, "the second ack")
        counts.append(len(promise_syncs))
        for prev in range(2, rounds):
            node.on_peer_message("n1", to_pb(_append(prev, 1), "g"))
            want = prev + 1
            await _until(lambda w=want: len(acked) == w, f"the ack of {want}")
            counts.append(len(promise_syncs))
        assert acked == [(i, i) for i in range(1, rounds + 1)]

    _run_follower(tmp_path, body)
    return counts


def test_acks_under_a_durable_promise_do_not_fsync_the_promise_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 36: an ack writes the promise durably PROMISE_AHEAD_ENTRIES ahead, the next
    ones only refresh it, so the rounds fsync the log and not the promise file."""
    counts = _promise_fsyncs_per_round(tmp_path, monkeypatch)
    assert len(set(counts)) == 1  # no fdatasync of the promise after the first


def test_a_promise_on_a_device_of_its_own_is_durable_every_round(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A promise file on another device than its store (dLegerPromisePath) is there to
    outlive the store's disk: no promise ahead, every ack's promise fsynced before it
    leaves (docs/RAFT.md section 11)."""
    monkeypatch.setattr(node_module, "promise_ahead_entries", lambda *_: 0)
    counts = _promise_fsyncs_per_round(tmp_path, monkeypatch)
    assert all(b > a for a, b in itertools.pairwise(counts))


def test_the_promise_runs_ahead_only_beside_its_store(tmp_path: Path) -> None:
    """One device: PROMISE_AHEAD_ENTRIES; another device (tmpfs), or one that cannot be
    read: 0."""
    store = tmp_path / "s"
    store.mkdir()
    beside = promise_path_for_store(store)
    assert promise_ahead_entries(str(store), beside) == PROMISE_AHEAD_ENTRIES
    assert promise_ahead_entries(str(store), tmp_path / "gone" / "p.promise") == 0
    shm = Path("/dev/shm")
    if not shm.is_dir() or os.stat(shm).st_dev == os.stat(store).st_dev:
        pytest.skip("no second file system here")
    assert promise_ahead_entries(str(store), shm / "p.promise") == 0


def test_the_promise_file_holds_each_ack_before_it_leaves(tmp_path: Path) -> None:
    """docs/RAFT.md section 11: the persist job writes the promise after the entries and
    before the answer; a heartbeat's answer (nothing new promised) writes nothing."""

    async def body(node: DLedgerNode) -> None:
        path = promise_path_for_store(tmp_path / "s")  # beside the store directory "s"
        promised_when_sent: list[tuple[int, int]] = []

        def send(m: Message) -> None:
            if isinstance(m, AppendResponse) and m.success:
                got = read_promise(path)
                promised_when_sent.append((m.match_index, got.promised_index if got else -1))

        assert node._transport is not None
        node._transport.send = send  # type: ignore[method-assign]
        node.on_peer_message("n1", to_pb(_append(0, 2), "g"))
        await _until(lambda: promised_when_sent, "the ack of index 2")
        writes = node._persister.promises.writes
        node.on_peer_message("n1", to_pb(AppendRequest("n1", "n0", 1, 2, 1, (), 2), "g"))
        await _until(lambda: len(promised_when_sent) == 2, "the heartbeat's answer")
        assert promised_when_sent == [(2, 2), (2, 2)]
        assert node._persister.promises.writes == writes  # nothing new: no write, no fsync
        got = read_promise(path)
        assert got is not None and got.hard_state.term == 1

    _run_follower(tmp_path, body)


class _AppliedUpTo(LogOnlyStateMachine):
    """A state machine that says it applied up to ``applied`` (a broker's snapshot does)."""

    def __init__(self, applied: int) -> None:
        super().__init__()
        self._applied = applied

    def applied_index(self) -> int:
        return self._applied


def test_a_static_group_reads_its_log_for_config_entries_at_one_start_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A member of a dLegerPeers group that never changed its membership had no membership
    file, and every start replayed the CONFIG entries of its whole log: every stored byte read
    before it served (20 s at 30,000,000 messages). The first start now saves the
    configuration, so the next one reads only above the applied index."""
    replayed: list[tuple[int, int]] = []
    real_replay = RaftNode._replay_config_entries

    def replay(self: RaftNode, start: int, last: int) -> None:
        replayed.append((start, last))
        real_replay(self, start, last)

    monkeypatch.setattr(RaftNode, "_replay_config_entries", replay)
    n0_port, n1_port, client_port = _free_ports(3)
    peers = {"n0": f"127.0.0.1:{n0_port}", "n1": f"127.0.0.1:{n1_port}"}
    store = StoreConfig(segment_size_bytes=1 << 20, preallocate=False)
    cfg = NodeConfig("g", "n0", peers, "127.0.0.1", client_port, str(tmp_path / "s"), store)
    cfg = dataclasses.replace(cfg, election_timeout_ms=60_000, heartbeat_interval_ms=100)

    async def fill(node: DLedgerNode) -> None:
        node.on_peer_message("n1", to_pb(_append(0, 30), "g"))
        await _until(lambda: node.core.stable_index == 30, "entries 1..30 stored")

    asyncio.run(_with_node(DLedgerNode(cfg, seed=1), fill))
    saved = load_conf(cfg.store_dir, "n0")
    assert saved is not None and saved.index == 0 and saved.voters == {"n0", "n1"}

    async def nothing(node: DLedgerNode) -> None:
        assert node.core.conf_state.voters == {"n0", "n1"}

    replayed.clear()
    asyncio.run(_with_node(DLedgerNode(cfg, seed=1, state_machine=_AppliedUpTo(30)), nothing))
    assert replayed == [(31, 30)], replayed  # nothing at or below the applied index is read
