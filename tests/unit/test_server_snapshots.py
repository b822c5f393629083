"""Snapshots on the server (dledger.server.snapshots).

A transfer is as hostile as any peer input: the receiver's checks refuse bad headers, names,
offsets, sizes and checksums before anything reaches the core. An install a crash stopped is
finished at the next start with the snapshot's log and membership configuration, never a mix.
The sender paces its transfers and backs off a follower that keeps failing."""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from raftmq.dledger.v1 import dledger_pb2 as pb

from dledger.appsnapshot import AppSnapshot
from dledger.core import ConfState, Role, SnapshotRequest
from dledger.core.membership import MemberAddr, joining
from dledger.log import CorruptLogError, DLedgerError, Entry
from dledger.server import snapshots
from dledger.server.membership import load_conf, save_conf
from dledger.server.node import DLedgerNode, LogOnlyStateMachine, NodeConfig
from dledger.server.snapshots import (
    INSTALL_MARKER,
    MAX_SNAPSHOT_BYTES_PER_S,
    MIN_SNAPSHOT_BYTES_PER_S,
    SNAPSHOT_CHUNK_BYTES,
    STAGING_DIR,
    Pacer,
    SnapshotReceiver,
    SnapshotRefused,
    SnapshotSender,
    _check_header,
    _check_name,
    _chunks,
    _digest_update,
    _log_pieces,
    _Staging,
    clear_staging,
    finish_install,
    install_app,
    make_ready,
    pending_install,
)
from dledger.storage import codec
from dledger.storage.files import atomic_write
from dledger.storage.store import SegmentedLogStore, StoreConfig
from mqcluster.cluster import _free_ports

SEG = 64 * 1024


def _header(**kw: int) -> pb.SnapshotHeader:
    fields = dict(
        term=3,
        snapshot_index=100,
        snapshot_term=2,
        base_index=40,
        base_term=1,
        start_position=2 * SEG,
        segment_size_bytes=SEG,
    )
    fields.update(kw)
    return pb.SnapshotHeader(**fields)


def test_good_header_and_names_pass() -> None:
    _check_header(_header(), SEG)
    for name in (
        "log/00000000000000131072",
        "app/consumequeue/T%RETRY%g/0/00000000000000000000",
        "app/config/snapshot.json",
        "app/index/20261124230000000",
    ):
        _check_name(name)


@pytest.mark.parametrize(
    "bad",
    [
        {"snapshot_index": 0},
        {"snapshot_term": 4},  # above the leader's term
        {"snapshot_term": 0},
        {"base_index": 101},
        {"base_term": 3},
        {"segment_size_bytes": 2 * SEG},  # not this store's
        {"start_position": SEG + 1},
        {"snapshot_index": 1 << 63},
    ],
)
def test_bad_headers_are_refused(bad: dict[str, int]) -> None:
    with pytest.raises(SnapshotRefused):
        _check_header(_header(**bad), SEG)


@pytest.mark.parametrize(
    "name",
    [
        "log/../../etc",
        "log/123",
        "app/../x",
        "app/a/./b",
        "app//x",
        "app/x\x00y",
        "/etc/passwd",
        "other/x",
        "app/" + "a" * 2000,
    ],
)
def test_bad_names_are_refused(name: str) -> None:
    with pytest.raises(SnapshotRefused):
        _check_name(name)


def test_staging_checks_order_size_and_digest(tmp_path: Path) -> None:
    st = _Staging(tmp_path)
    st.write(pb.SnapshotData(name="app/a", offset=0, data=b"xy"))
    st.write(pb.SnapshotData(name="app/a", offset=2, zeros=3))
    st.write(pb.SnapshotData(name="log/00000000000000000000", offset=0, zeros=4))
    assert (tmp_path / "app" / "a").read_bytes() == b"xy\0\0\0"
    assert (tmp_path / "log" / "00000000000000000000").read_bytes() == b"\0" * 4
    expected = hashlib.sha256()
    _digest_update(expected, "app/a", 0, b"xy", 0)
    _digest_update(expected, "app/a", 2, b"", 3)
    _digest_update(expected, "log/00000000000000000000", 0, b"", 4)
    assert st.digest.digest() == expected.digest() and st.total == 9
    for bad in (
        pb.SnapshotData(name="app/a", offset=0, data=b"again"),  # a file seen before
        pb.SnapshotData(name="app/b", offset=5, data=b"gap"),  # not at its end
        pb.SnapshotData(name="app/c", offset=0, data=b"x" * (SNAPSHOT_CHUNK_BYTES + 1)),
        pb.SnapshotData(name="app/d", offset=0, data=b"x", zeros=1),  # both
        pb.SnapshotData(name="app/e", offset=0, zeros=SNAPSHOT_CHUNK_BYTES + 1),
    ):
        with pytest.raises(SnapshotRefused):
            st.write(bad)
    assert not (tmp_path / "app" / "b").exists()


# ---------------------------------------------------------------- an install a crash stopped

CFG = StoreConfig(segment_size_bytes=SEG, index_segment_size_bytes=SEG)
SNAP_INDEX = 250
FIRST_INDEX = 102  # the first entry of the leader's second segment (600-byte bodies)
# The configuration at the snapshot's index: the node (n3) was added, promoted, n1 removed.
CONF = ConfState(
    voters=frozenset({"n0", "n2", "n3"}),
    removed=("n1",),
    addrs=(MemberAddr("n3", "127.0.0.1:40914", "127.0.0.1:10914"),),
)


def _sent_check(store: SegmentedLogStore, base_index: int, last_index: int) -> Any:
    check = snapshots._SentLogCheck()
    check.start(store, base_index, last_index)
    return check


def test_the_sender_checks_what_it_sends_and_keeps_the_damage(tmp_path: Path) -> None:
    src = SegmentedLogStore(tmp_path / "leader", CFG)
    src.append([Entry(1, i, bytes([i % 251]) * 3000) for i in range(1, 60)])
    src.flush()
    ext = src.snapshot_extent(59)
    pos = src.body_position(30) + 5
    seg = src.root / "commitlog" / f"{pos - pos % SEG:020d}"
    with open(seg, "r+b") as f:  # through the page cache: the store's mapping sees it
        f.seek(pos % SEG)
        f.write(b"\xff")
    check = _sent_check(src, 0, 59)
    pieces = list(_log_pieces(_Sender(src), 0, ext.end_position, SEG, check))  # type: ignore[arg-type]
    with pytest.raises(CorruptLogError):
        for _name, _offset, read in pieces:
            read()  # type: ignore[operator]
    assert check.damage is not None and check.damage.index == 30
    src.close()


class _Sender:
    def __init__(self, store: SegmentedLogStore) -> None:
        self.store = store


def _stage_transfer(tmp_path: Path) -> Path:
    """A joining node's store (its own log of 10 entries, membership.json "joining") with a
    verified transfer of a leader's snapshot staged in ``snapshot/ready`` (as the receiver
    leaves it before the core accepts it); the store directory."""
    src = SegmentedLogStore(tmp_path / "leader", CFG)
    src.append([Entry(1 + i // 100, i, b"e%05d" % i * 100) for i in range(1, 301)])
    src.flush()
    src.delete_prefix(src.segment_infos()[0].last_index)
    assert src.first_index() == FIRST_INDEX  # the leader's retention ran
    ext = src.snapshot_extent(SNAP_INDEX)
    h = pb.SnapshotHeader(
        term=3,
        snapshot_index=SNAP_INDEX,
        snapshot_term=src.term_at(SNAP_INDEX),
        config=CONF.encode(),
        base_index=ext.base_index,
        base_term=ext.base_term,
        start_position=ext.start_position,
        segment_size_bytes=SEG,
    )
    root = tmp_path / "n3"
    own = SegmentedLogStore(root, CFG)
    own.append([Entry(1, i, b"own") for i in range(1, 11)])
    own.close()
    save_conf(str(root), joining("n3"), is_joining=True)
    staging = _Staging(root / STAGING_DIR / "incoming")
    staging.root.mkdir(parents=True)
    check = _sent_check(src, ext.base_index, SNAP_INDEX)
    pieces = _log_pieces(_Sender(src), ext.start_position, ext.end_position, SEG, check)  # type: ignore[arg-type]
    for name, offset, read in pieces:
        staging.write(pb.SnapshotData(name=name, offset=offset, data=read()))  # type: ignore[operator]
    make_ready(root / STAGING_DIR, staging, h)
    src.close()
    return root


def _restart(root: Path) -> tuple[SegmentedLogStore, ConfState | None]:
    """What DLedgerNode.start does with a store: finish an interrupted install, open."""
    index = pending_install(str(root))
    if index is not None:
        finish_install(str(root))
    store = SegmentedLogStore(root, CFG)
    if index is not None:
        install_app(str(root), LogOnlyStateMachine(), index)
    return store, load_conf(str(root), "n3")


@pytest.mark.parametrize("crash_at", ["after_marker", "old_log_removed", "before_checkpoint"])
def test_an_interrupted_install_restarts_with_the_new_log_and_its_configuration(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, crash_at: str
) -> None:
    root = _stage_transfer(tmp_path)
    atomic_write(root / STAGING_DIR / INSTALL_MARKER, b"install\n")  # the install begins
    if crash_at != "after_marker":
        target = "os.rename" if crash_at == "old_log_removed" else "atomic_write"
        with monkeypatch.context() as m:
            m.setattr(f"dledger.storage.install.{target}", _crash)
            with pytest.raises(_Crash):
                finish_install(str(root))
    store, conf = _restart(root)
    # The complete new state: the snapshot's log, and the configuration it carried (the
    # old log's CONFIG entries are gone; "joining" would keep n3 from ever campaigning).
    assert (store.first_index(), store.last_index()) == (FIRST_INDEX, SNAP_INDEX)
    assert conf is not None and (conf.voters, conf.removed) == (CONF.voters, CONF.removed)
    assert conf.addr_of("n3") == CONF.addr_of("n3")
    assert pending_install(str(root)) is None
    store.close()
    store, _ = _restart(root)  # and again: nothing left to finish
    assert store.last_index() == SNAP_INDEX
    store.close()


def test_a_crash_before_the_install_began_keeps_the_old_state(tmp_path: Path) -> None:
    root = _stage_transfer(tmp_path)  # staged and verified, but no install marker yet
    store, conf = _restart(root)
    assert (store.first_index(), store.last_index()) == (1, 10)
    assert conf == joining("n3")
    store.close()


class _Crash(Exception):
    pass


def _crash(*_: object) -> None:
    raise _Crash("simulated crash")


# ---------------------------------------------------------------- pace and restarts


class _Clock:
    """A monotonic clock that only the pacer's sleeps move."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.now += seconds


def test_a_transfer_is_paced_at_the_configured_rate(tmp_path: Path) -> None:
    src = SegmentedLogStore(tmp_path / "leader", CFG)
    src.append([Entry(1, i, bytes([i % 251]) * 4000) for i in range(1, 501)])  # ~2 MiB
    src.flush()
    ext = src.snapshot_extent(500)
    clock = _Clock()
    rate = MIN_SNAPSHOT_BYTES_PER_S
    out = SimpleNamespace(pacer=Pacer(rate, clock, clock.sleep), bytes_sent=0)
    node = SimpleNamespace(core=SimpleNamespace(role=Role.LEADER, term=3), store=src)
    node.snapshots_out = out
    header = pb.SnapshotHeader(start_position=ext.start_position, segment_size_bytes=SEG)
    req = SnapshotRequest("n3", 3)

    async def stream() -> list[pb.SnapshotChunk]:
        sparse = AppSnapshot(500, [("index/f", bytes(4 << 20))])  # a sparse key index file
        check = _sent_check(src, ext.base_index, 500)
        it = _chunks(node, req, header, ext.end_position, sparse, check)  # type: ignore[arg-type]
        return [pb.SnapshotChunk.FromString(c) async for c in it]

    chunks = asyncio.run(stream())
    src.close()
    largest = max(len(c.data.data) or c.data.zeros for c in chunks if c.HasField("data"))
    assert out.bytes_sent == ext.end_position - ext.start_position > 2_000_000
    # The first chunk leaves at once, the rest at the pace: no faster than the rate; the
    # zeros travel as lengths and wait for nothing.
    assert (out.bytes_sent - largest) / rate <= clock.now - 1000.0 <= out.bytes_sent / rate
    assert sum(c.data.zeros for c in chunks if c.HasField("data")) == 4 << 20


def test_the_pace_is_shared_by_concurrent_transfers() -> None:
    clock = _Clock()
    pacer = Pacer(2 << 20, clock, clock.sleep)

    async def two() -> None:
        async def one() -> None:
            for _ in range(4):
                await pacer.take(1 << 20)

        await asyncio.gather(one(), one())

    asyncio.run(two())
    assert clock.now - 1000.0 == pytest.approx(3.5)  # 8 MiB at 2 MiB/s, the first at once


def test_restarts_back_off_per_follower() -> None:
    sender = SnapshotSender(SimpleNamespace(cfg=SimpleNamespace(snapshot_bytes_per_s=1 << 20)))  # type: ignore[arg-type]
    delays = [sender.retry_delay_ms("n3") for _ in range(8)]
    assert delays == [1000, 2000, 4000, 8000, 16000, 30000, 30000, 30000]
    assert sender.retry_delay_ms("n4") == 1000  # another follower's count is its own


# ---------------------------------------------------------- nothing of a failed transfer stays


class _Core:
    """What the receiver reads of the core; ``accept``: whether a staged snapshot is taken."""

    def __init__(self, accept: bool) -> None:
        self.term = 3
        self.commit_index = 10
        self.pending_snapshot: SimpleNamespace | None = None
        self.accept = accept

    def step(self, m: object) -> None:
        if self.accept:
            self.pending_snapshot = SimpleNamespace(index=m.snapshot_index)  # type: ignore[attr-defined]


def _receiver(root: Path, accept: bool = True) -> SnapshotReceiver:
    core = _Core(accept)
    node = SimpleNamespace(
        cfg=SimpleNamespace(store_dir=str(root), self_id="n3"),
        store=SimpleNamespace(config=CFG),
        core=core,
        drops=[],
    )
    node.note_drop = lambda reason, detail: node.drops.append(reason)
    node.step_local = core.step
    return SnapshotReceiver(node)  # type: ignore[arg-type]


def _transfer(
    files: list[tuple[str, bytes]], *, trailer: bool = True, digest: bytes | None = None
) -> list[pb.SnapshotChunk]:
    """A transfer of ``files`` (a correct trailer unless ``digest`` says another sum)."""
    h = _header(snapshot_index=100, start_position=0)
    chunks = [pb.SnapshotChunk(header=h)]
    sha = hashlib.sha256()
    for name, data in files:
        _digest_update(sha, name, 0, data, 0)
        chunks.append(pb.SnapshotChunk(data=pb.SnapshotData(name=name, offset=0, data=data)))
    total = sum(len(d) for _, d in files)
    if trailer:
        end = pb.SnapshotTrailer(total_bytes=total, sha256=digest or sha.digest())
        chunks.append(pb.SnapshotChunk(trailer=end))
    return chunks


async def _stream(chunks: list[pb.SnapshotChunk], then: BaseException | None = None) -> Any:
    for c in chunks:
        yield c
    if then is not None:
        raise then


def _receive(rx: SnapshotReceiver, chunks: list[pb.SnapshotChunk], **kw: Any) -> pb.SnapshotReply:
    return asyncio.run(rx.receive("n0", _stream(chunks, **kw)))


def _staged_files(root: Path) -> list[str]:
    staging = root / STAGING_DIR
    return sorted(p.relative_to(staging).as_posix() for p in staging.rglob("*") if p.is_file())


def _entries_from(first: int, last: int, term: int = 2) -> bytes:
    """Encoded entries ``first..last`` from data position 0: a valid staged segment."""
    out = b""
    for i in range(first, last + 1):
        out += codec.encode_entry(index=i, term=term, position=len(out), body=b"e%d" % i)
    return out


# The log of _header(start_position=0): entries 41..100 (its base is 40).
SEGMENT = ("log/00000000000000000000", _entries_from(41, 100))
APP = ("app/config/snapshot.json", b"{}")


@pytest.mark.parametrize(
    "case",
    [
        "checksum",
        "size",
        "bad_name",
        "out_of_order",
        "ended_early",
        "sender_gone",
        "second_header",
        "damaged_log",
        "short_log",
    ],
)
def test_a_refused_or_broken_transfer_leaves_no_staging(tmp_path: Path, case: str) -> None:
    rx = _receiver(tmp_path)
    chunks = _transfer([SEGMENT, APP])
    then: BaseException | None = None
    if case == "checksum":
        chunks = _transfer([SEGMENT, APP], digest=b"\0" * 32)
    elif case == "size":
        chunks[-1].trailer.total_bytes += 1
    elif case == "bad_name":
        chunks.insert(2, pb.SnapshotChunk(data=pb.SnapshotData(name="app/../x", data=b"x")))
    elif case == "out_of_order":
        chunks.insert(3, chunks[1])  # the segment again, after the next file began
    elif case == "ended_early":
        chunks = chunks[:-1]
    elif case == "sender_gone":  # gRPC cancels the handler when the caller goes away
        chunks, then = chunks[:-1], asyncio.CancelledError()
    elif case == "damaged_log":  # the leader's copy was bad: its checksum still matches
        bad = bytearray(SEGMENT[1])
        bad[len(bad) // 2] ^= 0x20
        chunks = _transfer([(SEGMENT[0], bytes(bad)), APP])
    elif case == "short_log":  # the entries end before the snapshot's index
        chunks = _transfer([(SEGMENT[0], _entries_from(41, 99)), APP])
    else:
        chunks.insert(2, chunks[0])
    with pytest.raises(asyncio.CancelledError if then else SnapshotRefused):
        _receive(rx, chunks, then=then)
    assert _staged_files(tmp_path) == []
    assert not (tmp_path / STAGING_DIR / "incoming").exists()
    # The next transfer starts clean and stages only its own files.
    reply = _receive(rx, _transfer([SEGMENT, ("app/other", b"y")]))
    assert reply.accepted
    assert _staged_files(tmp_path) == [
        "ready/app/other",
        "ready/header.json",
        "ready/log/00000000000000000000",
    ]


def test_a_stale_or_unaccepted_transfer_leaves_nothing_staged(tmp_path: Path) -> None:
    rx = _receiver(tmp_path, accept=False)
    old_term = _transfer([SEGMENT])
    old_term[0].header.term = 2  # a leader of an earlier term
    old_index = _transfer([SEGMENT])
    old_index[0].header.base_index = 5
    old_index[0].header.snapshot_index = 10  # not above the commit index: nothing to send
    for stale in (old_term, old_index):
        assert not _receive(rx, stale).accepted
        assert _staged_files(tmp_path) == []
    # Complete and verified, but the core did not take it (it follows another leader now).
    assert not _receive(rx, _transfer([SEGMENT, APP])).accepted
    assert _staged_files(tmp_path) == [] and not rx._staged


def test_startup_removes_what_an_interrupted_transfer_left(tmp_path: Path) -> None:
    staging = tmp_path / STAGING_DIR
    for leftover in ("incoming/log/00000000000000000000", "ready/app/config/snapshot.json"):
        (staging / leftover).parent.mkdir(parents=True, exist_ok=True)
        (staging / leftover).write_bytes(b"half")
    assert pending_install(str(tmp_path)) is None
    clear_staging(str(tmp_path))
    assert not staging.exists()
    clear_staging(str(tmp_path))  # nothing there: fine
    # An install to finish is never cleared as leftovers.
    root = _stage_transfer(tmp_path / "x")
    atomic_write(root / STAGING_DIR / INSTALL_MARKER, b"install\n")
    with pytest.raises(DLedgerError, match="install to finish"):
        clear_staging(str(root))


def test_a_node_starts_without_the_leftovers_of_a_transfer_a_crash_cut_short(
    tmp_path: Path,
) -> None:
    peer_port, other_port, client_port = _free_ports(3)
    peers = {"n0": f"127.0.0.1:{peer_port}", "n1": f"127.0.0.1:{other_port}"}
    store_dir = tmp_path / "s"
    cfg = NodeConfig("g", "n0", peers, "127.0.0.1", client_port, str(store_dir), CFG)
    leftover = store_dir / STAGING_DIR / "incoming" / "log" / "00000000000000000000"
    leftover.parent.mkdir(parents=True)
    leftover.write_bytes(b"half a segment")

    async def run() -> None:
        node = DLedgerNode(dataclasses.replace(cfg, election_timeout_ms=60_000), seed=1)
        await node.start()
        await node.stop()

    asyncio.run(run())
    assert not (store_dir / STAGING_DIR).exists()


def test_chunks_are_hashed_and_encoded_off_the_loop_and_verify_at_the_receiver(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    src = SegmentedLogStore(tmp_path / "leader", CFG)
    src.append([Entry(1, i, bytes([i % 251]) * 3000) for i in range(1, 60)])
    src.flush()
    ext = src.snapshot_extent(59)
    out = SimpleNamespace(pacer=Pacer(MAX_SNAPSHOT_BYTES_PER_S), bytes_sent=0)
    node = SimpleNamespace(core=SimpleNamespace(role=Role.LEADER, term=3), store=src)
    node.snapshots_out = out
    header = _header(snapshot_index=59, base_index=0, base_term=0, start_position=0)
    app = AppSnapshot(59, [("config/snapshot.json", b"{}"), ("index/f", bytes(70_000))])
    hashed_in: list[threading.Thread] = []
    real_update = snapshots._digest_update

    def update(*args: Any) -> None:
        hashed_in.append(threading.current_thread())
        real_update(*args)

    monkeypatch.setattr(snapshots, "_digest_update", update)

    async def stream() -> list[pb.SnapshotChunk]:
        check = _sent_check(src, 0, 59)
        it = _chunks(node, SnapshotRequest("n3", 3), header, ext.end_position, app, check)  # type: ignore[arg-type]
        return [pb.SnapshotChunk.FromString(c) async for c in it]

    chunks = asyncio.run(stream())
    src.close()
    assert hashed_in and all(t is not threading.main_thread() for t in hashed_in)
    monkeypatch.undo()
    rx = _receiver(tmp_path / "n3")
    assert _receive(rx, chunks).accepted  # the receiver's digest agrees with the sender's
    staged = _staged_files(tmp_path / "n3")
    assert "ready/app/index/f" in staged and "ready/app/config/snapshot.json" in staged
