"""Snapshot transfer and install: the server's side of ``dledger.core.snapshot``.

What a snapshot is here (docs/RAFT.md, "Snapshots"):

* **the log** the receiver keeps: the leader's data segments from its first one up to the end
  of the snapshot's last entry, byte for byte (``SegmentedLogStore.snapshot_extent``). The
  receiver then holds the same entries at the same data positions as every replica, which
  is what the application's position-addressed files (the broker's ConsumeQueues and key
  index) need, and what lets it serve every message the others serve;
* **the application's files** at the snapshot index (``SnapshotApp.capture_snapshot``),
  opaque to dledger: the broker sends its state snapshot and its ConsumeQueue and key index
  files.

The leader (:class:`SnapshotSender`) answers a Ready's ``snapshot_requests``: it captures at
its applied index, streams ``DLedgerPeer.InstallSnapshot`` (a header, data chunks of at most
:data:`SNAPSHOT_CHUNK_BYTES`, a trailer with the size and SHA-256 of the whole), then
reports to its core. A failed transfer is restarted whole after :data:`SNAPSHOT_RETRY_MS`.

The follower (:class:`SnapshotReceiver`) checks every field, stages the files under
``{store}/snapshot/incoming``, verifies the trailer, syncs, moves them to ``ready`` and only
then steps the InstallSnapshot into its core. When the core accepts it, the next Ready says
``snapshot`` and :meth:`SnapshotReceiver.install` swaps the staged log and files in (a marker
file makes an install that a crash interrupted finish at the next start).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import functools
import hashlib
import json
import logging
import os
import re
import shutil
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import grpc
from raftmq.dledger.v1 import dledger_pb2 as pb

from dledger.appsnapshot import AppSnapshot
from dledger.chain import CHAIN_UNKNOWN
from dledger.core import ConfState, InstallSnapshot, Role, SnapshotMeta, SnapshotRequest
from dledger.core.config import MAX_GROUP_SIZE
from dledger.core.membership import decode as decode_conf
from dledger.log import CorruptLogError, DLedgerError, FormatTooNewError
from dledger.server.membership import save_conf
from dledger.server.transport import CHANNEL_OPTIONS
from dledger.storage import SegmentedLogStore
from dledger.storage.files import atomic_write, fsync_dir, segment_name
from dledger.storage.install import install_log, verify_staged_log
from dledger.storage.store import LogExtent
from mqerrors import codes as E
from mqrelease import BASELINE_LEVEL, too_new_message
from mqsecurity.channels import open_aio_channel
from rpckit import status

if TYPE_CHECKING:
    from dledger.server.node import DLedgerNode

logger = logging.getLogger(__name__)

# Bytes of file data per chunk: small enough for any gRPC limit and a bounded write per
# message on the receiver, large enough that a GiB costs only a thousand messages.
SNAPSHOT_CHUNK_BYTES = 1 << 20
# Largest snapshot a follower accepts: the log a group keeps (retention) plus the
# application's files; 1 TiB is far beyond a broker's disk per group today, and bounds what a
# forged transfer can make a follower write before its checksum fails.
MAX_SNAPSHOT_BYTES = 1 << 40
# Files in one snapshot: data segments plus the application's (a broker with 100,000 topics
# of a few queues each holds a few hundred thousand ConsumeQueue files).
MAX_SNAPSHOT_FILES = 1_000_000
# A file name in a transfer: "log/<segment>" or "app/<relative path>".
MAX_SNAPSHOT_NAME_CHARS = 1024
# The opaque membership configuration in a header.
MAX_SNAPSHOT_CONFIG_BYTES = 64 << 10
# A follower waits at most this long for the next chunk before it gives the transfer up.
SNAPSHOT_IDLE_TIMEOUT_S = 30.0
# After a failed transfer the leader waits this long before its core may ask again,
# doubling with each failure in a row to a follower up to SNAPSHOT_RETRY_MAX_MS: every attempt
# captures anew (links every ConsumeQueue and key index file) and resends everything, so a
# follower that keeps failing must not cost the leader that every second.
SNAPSHOT_RETRY_MS = 1000
SNAPSHOT_RETRY_MAX_MS = 30_000
# snapshotTransferBytesPerSec: the pace of all of a leader's snapshot transfers together.
# Each MiB costs the leader ~6 ms of CPU (SHA-256 ~1.6 ms, protobuf ~4.6 ms, measured on the
# 2-core test machine), in a thread rather than on the event loop but on the same cores, so
# the default 32 MiB/s keeps a transfer to about a fifth of one core, and to a quarter of a
# 1 Gbit/s link; a 100 GiB log then takes about 53 minutes. The floor keeps the gap between
# two chunks (1 MiB) far below the follower's idle timeout.
DEFAULT_SNAPSHOT_BYTES_PER_S = 32 << 20
MIN_SNAPSHOT_BYTES_PER_S = 1 << 20
MAX_SNAPSHOT_BYTES_PER_S = 16 << 30
# One path component of an application file: what broker names and file names use.
_COMPONENT = re.compile(r"[A-Za-z0-9_.%|#-]{1,255}")
# DLedgerPeer.InstallSnapshot's path, as the generated stub names it.
INSTALL_SNAPSHOT_METHOD = "/raftmq.dledger.v1.DLedgerPeer/InstallSnapshot"
STAGING_DIR = "snapshot"
INSTALL_MARKER = "INSTALLING"
# The staged snapshot's header (ready/header.json): its format ("v"; a header without it,
# written before it existed, is 1). An install to finish whose header is newer is refused.
HEADER_FILE = "header.json"
HEADER_VERSION = 1
DROP_SNAPSHOT_REFUSED = "snapshot_refused"


class SnapshotApp(Protocol):
    """What a state machine implements to take part in snapshots (both optional)."""

    def capture_snapshot(self) -> AppSnapshot:
        """Called between applies: the state at the applied index."""
        ...

    def install_snapshot(self, app_dir: Path, index: int) -> None:
        """Replace the state by the files staged in ``app_dir`` (after the log was
        installed); ``applied_index()`` then returns ``index``."""
        ...


class SnapshotRefused(DLedgerError):
    """A transfer this follower will not take (a field out of range, a bad name, a checksum
    that does not match, another transfer in progress)."""

    code = E.SNAPSHOT_REFUSED


_ZEROS = bytes(SNAPSHOT_CHUNK_BYTES)


def _digest_update(h: hashlib._Hash, name: str, offset: int, data: bytes, zeros: int) -> None:
    h.update(name.encode())
    h.update(b"\0")
    h.update(offset.to_bytes(8, "big"))
    if zeros:
        h.update(b"Z" + zeros.to_bytes(8, "big"))
    else:
        h.update(data)


# ---------------------------------------------------------------------- the leader's side


class Pacer:
    """At most ``bytes_per_s`` on average over everything paced through it, in bursts of one
    chunk: each ``take(n)`` books the next ``n / bytes_per_s`` seconds of the link and sleeps
    until its booking starts (nothing is saved up while idle)."""

    def __init__(
        self,
        bytes_per_s: int,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self.bytes_per_s = bytes_per_s
        self._clock = clock
        self._sleep = sleep
        self._free_at = 0.0

    async def take(self, n: int) -> None:
        now = self._clock()
        start = max(now, self._free_at)
        self._free_at = start + n / self.bytes_per_s
        if start > now:
            await self._sleep(start - now)


class SnapshotSender:
    """One transfer task per follower at a time, all paced by one :class:`Pacer`."""

    def __init__(self, node: DLedgerNode) -> None:
        self._node = node
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._stopping = False
        self.pacer = Pacer(node.cfg.snapshot_bytes_per_s)
        # Failed transfers in a row, by follower (the retry delay doubles with each).
        self._failures: dict[str, int] = {}
        self.sent = 0
        self.failed = 0
        self.bytes_sent = 0

    def start(self, req: SnapshotRequest) -> None:
        task = self._tasks.get(req.to_id)
        if task is not None and not task.done():
            return
        self._tasks[req.to_id] = asyncio.get_running_loop().create_task(self._run(req))

    async def stop(self) -> None:
        self._stopping = True
        for task in self._tasks.values():
            task.cancel()
        for task in self._tasks.values():
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    async def _run(self, req: SnapshotRequest) -> None:
        node = self._node
        index = 0
        check = _SentLogCheck()
        try:
            index = await self._transfer(req, check)
        except asyncio.CancelledError:
            if self._stopping:
                raise
            logger.warning("node=%s snapshot to=%s cancelled", node.cfg.self_id, req.to_id)
        except Exception as exc:
            # Whatever failed (the peer, a segment retention deleted meanwhile, the disk),
            # the core must hear of it, or the follower would wait for ever.
            logger.warning("node=%s snapshot to=%s failed: %s", node.cfg.self_id, req.to_id, exc)
        if check.damage is not None:
            node.on_damage(check.damage, "snapshot")  # never send a damaged log: repair
        ok = index > 0
        if ok:
            self.sent += 1
            self._failures.pop(req.to_id, None)
        else:
            self.failed += 1
            await asyncio.sleep(self.retry_delay_ms(req.to_id) / 1000)
        if node.core.role is Role.LEADER and node.core.term == req.term:
            node.core.report_snapshot(req.to_id, ok, index)
            node.wake()

    def retry_delay_ms(self, peer: str) -> int:
        """Count one more failure to ``peer``; how long to wait before the next attempt."""
        n = self._failures.get(peer, 0) + 1
        if len(self._failures) < MAX_GROUP_SIZE or peer in self._failures:
            self._failures[peer] = n
        return min(SNAPSHOT_RETRY_MS << min(n - 1, 16), SNAPSHOT_RETRY_MAX_MS)

    async def _transfer(self, req: SnapshotRequest, check: _SentLogCheck) -> int:
        """Stream one snapshot; its index once the follower has it."""
        node = self._node
        index = node.applied
        store = node.store
        meta = SnapshotMeta(index, store.term_at(index), chain=store.chain_at(index))
        extent = store.snapshot_extent(index)
        app = node.capture_app_snapshot()
        loop = asyncio.get_running_loop()
        check.start(store, extent.base_index, index)
        try:
            return await self._stream(req, meta, extent, app, check)
        finally:
            if app.release is not None:
                loop.run_in_executor(None, app.release)  # however the transfer ended

    async def _stream(
        self,
        req: SnapshotRequest,
        meta: SnapshotMeta,
        extent: LogExtent,
        app: AppSnapshot,
        check: _SentLogCheck,
    ) -> int:
        node = self._node
        index = meta.index
        if app.prepare is not None:
            await asyncio.get_running_loop().run_in_executor(None, app.prepare)
        header = pb.SnapshotHeader(
            term=req.term,
            snapshot_index=meta.index,
            snapshot_term=meta.term,
            config=node.core.conf_state_at(index).encode(),
            base_index=extent.base_index,
            base_term=extent.base_term,
            start_position=extent.start_position,
            segment_size_bytes=extent.segment_size_bytes,
            base_chain=extent.base_chain,
            snapshot_chain=meta.chain,
        )
        logger.info(
            "node=%s snapshot to=%s index=%d log=[%d, %d) app_files=%d",
            node.cfg.self_id,
            req.to_id,
            index,
            extent.start_position,
            extent.end_position,
            len(app.files),
        )
        chunks = _chunks(node, req, header, extent.end_position, app, check)
        # A member added at run time is in no settings: its address is the configuration's.
        addr = node.peer_addr(req.to_id)
        if not addr:
            raise DLedgerError(f"no peer address known for {req.to_id}")
        async with open_aio_channel(addr, node.cfg.client_security, CHANNEL_OPTIONS) as ch:
            # The chunks come encoded (_chunks): the call sends their bytes as they are.
            install = ch.stream_unary(
                INSTALL_SNAPSHOT_METHOD,
                request_serializer=_as_is,
                response_deserializer=pb.SnapshotReply.FromString,
            )
            reply = await install(chunks, metadata=node.peer_metadata())
        logger.info(
            "node=%s snapshot to=%s index=%d done accepted=%s bytes=%d",
            node.cfg.self_id,
            req.to_id,
            index,
            reply.accepted,
            reply.received_bytes,
        )
        return index


def _encode_piece(
    digest: hashlib._Hash, name: str, offset: int, data: object
) -> tuple[bytes, int, bool]:
    """In a thread: read one piece, add it to the digest and encode its chunk (SHA-256 and
    protobuf cost ~6 ms per MiB: never on the event loop). The encoded chunk, its length
    in file bytes, and whether it is a run of zeros."""
    if callable(data):
        data = data()
    assert isinstance(data, bytes)
    n = len(data)
    if data and data == _ZEROS[:n]:
        # A run of zeros (a sparse key index file, the rest of a segment) travels as its
        # length: it costs neither the link nor the digest.
        _digest_update(digest, name, offset, b"", n)
        chunk = pb.SnapshotChunk(data=pb.SnapshotData(name=name, offset=offset, zeros=n))
        return chunk.SerializeToString(), n, True
    _digest_update(digest, name, offset, data, 0)
    chunk = pb.SnapshotChunk(data=pb.SnapshotData(name=name, offset=offset, data=data))
    return chunk.SerializeToString(), n, False


async def _chunks(
    node: DLedgerNode,
    req: SnapshotRequest,
    header: pb.SnapshotHeader,
    end_position: int,
    app: AppSnapshot,
    check: _SentLogCheck,
) -> AsyncIterator[bytes]:
    """Header, the log's segments, the application's files, trailer, each an encoded
    ``SnapshotChunk`` (the call sends them as they are). Each piece is read, hashed and
    encoded in a thread, one at a time and in order (the digest follows the stream); the
    loop only paces and checks the leadership. Stops (the call then fails) when this node
    no longer leads in the request's term."""
    yield pb.SnapshotChunk(header=header).SerializeToString()
    digest = hashlib.sha256()
    total = 0
    loop = asyncio.get_running_loop()
    pieces = _log_pieces(
        node, header.start_position, end_position, header.segment_size_bytes, check
    )
    for name, offset, data in _chain(pieces, _app_pieces(app)):
        if node.core.role is not Role.LEADER or node.core.term != req.term:
            raise SnapshotRefused("no longer the leader of the request's term")
        job = functools.partial(_encode_piece, digest, name, offset, data)
        encoded, n, zeros = await loop.run_in_executor(None, job)
        total += n
        if not zeros:  # zeros cost the link nothing: not paced
            await node.snapshots_out.pacer.take(n)
            node.snapshots_out.bytes_sent += n
        yield encoded
    trailer = pb.SnapshotTrailer(total_bytes=total, sha256=digest.digest())
    yield pb.SnapshotChunk(trailer=trailer).SerializeToString()


def _as_is(chunk: bytes) -> bytes:
    return chunk


_Piece = tuple[str, int, object]


def _chain(*parts: Iterator[_Piece]) -> Iterator[_Piece]:
    for part in parts:
        yield from part


def _log_pieces(
    node: DLedgerNode, start: int, end: int, seg_size: int, check: _SentLogCheck
) -> Iterator[_Piece]:
    pos = start
    while pos < end:
        seg = pos - pos % seg_size
        n = min(SNAPSHOT_CHUNK_BYTES, end - pos, seg + seg_size - pos)
        store = node.store
        yield (f"log/{segment_name(seg)}", pos - seg, _reader(store, pos, n, check))
        pos += n


def _reader(store: SegmentedLogStore, pos: int, n: int, check: _SentLogCheck) -> object:
    def read() -> bytes:
        check.through(pos + n)
        return store.read_at(pos, n)

    return read


class _SentLogCheck:
    """The sender's check of what it sends: before each range of log bytes is read, the
    CRCs of every entry starting in it are checked (``store.verify_until``), in the reader's
    thread, in order. Damage is kept (``damage``) for the sender to act on: the transfer
    fails and the node repairs."""

    def __init__(self) -> None:
        self._store: SegmentedLogStore | None = None
        self._next = 0
        self._last = 0
        self.damage: CorruptLogError | None = None

    def start(self, store: SegmentedLogStore, base_index: int, last_index: int) -> None:
        self._store, self._next, self._last = store, base_index + 1, last_index

    def through(self, end_position: int) -> None:
        assert self._store is not None, "start() before the first piece"
        try:
            self._next = self._store.verify_until(self._next, end_position, self._last)
        except CorruptLogError as exc:
            self.damage = exc
            raise


def _app_pieces(app: AppSnapshot) -> Iterator[_Piece]:
    for rel, source in app.files:
        name = f"app/{rel}"
        if isinstance(source, bytes):
            for off in range(0, max(len(source), 1), SNAPSHOT_CHUNK_BYTES):
                yield (name, off, source[off : off + SNAPSHOT_CHUNK_BYTES])
            continue
        size = source.stat().st_size
        for off in range(0, max(size, 1), SNAPSHOT_CHUNK_BYTES):
            yield (name, off, _file_reader(source, off, min(SNAPSHOT_CHUNK_BYTES, size - off)))


def _file_reader(path: Path, off: int, n: int) -> object:
    def read() -> bytes:
        with path.open("rb") as f:
            f.seek(off)
            return f.read(n)

    return read


# ---------------------------------------------------------------------- the follower's side


def _check_name(name: str) -> None:
    if len(name) > MAX_SNAPSHOT_NAME_CHARS:
        raise SnapshotRefused(f"file name of {len(name)} characters")
    kind, _, rest = name.partition("/")
    parts = rest.split("/")
    if kind == "log" and len(parts) == 1 and parts[0].isdigit() and len(parts[0]) == 20:
        return
    if kind == "app" and all(_COMPONENT.fullmatch(p) and p not in (".", "..") for p in parts):
        return
    raise SnapshotRefused(f"file name {name[:64]!r} is not log/<segment> or app/<safe path>")


def _check_header(h: pb.SnapshotHeader, seg_size: int) -> None:
    if not (
        1 <= h.snapshot_index < (1 << 63)
        and 1 <= h.snapshot_term <= h.term < (1 << 63)
        and h.base_index <= h.snapshot_index
        and h.base_term <= h.snapshot_term
        and h.segment_size_bytes == seg_size
        and h.start_position % seg_size == 0
        and len(h.config) <= MAX_SNAPSHOT_CONFIG_BYTES
    ):
        raise SnapshotRefused(
            f"header out of range: index={h.snapshot_index} term={h.snapshot_term} "
            f"leader_term={h.term} base={h.base_index}/{h.base_term} "
            f"segment_size={h.segment_size_bytes} (mine {seg_size}) start={h.start_position}"
        )


class _Staging:
    """Files of one transfer being written under ``incoming``."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.name = ""
        self.size = 0
        self.names: set[str] = set()
        self.total = 0
        self.digest = hashlib.sha256()

    def write(self, d: pb.SnapshotData) -> None:
        _check_name(d.name)
        if d.name != self.name:
            if d.name in self.names or len(self.names) >= MAX_SNAPSHOT_FILES:
                raise SnapshotRefused(f"file {d.name[:64]!r} out of order or too many files")
            self.names.add(d.name)
            self.name, self.size = d.name, 0
        n = d.zeros or len(d.data)
        if d.offset != self.size or n > SNAPSHOT_CHUNK_BYTES or (d.zeros and d.data):
            raise SnapshotRefused(f"chunk of {d.name[:64]!r} at {d.offset}, expected {self.size}")
        self.total += n
        if self.total > MAX_SNAPSHOT_BYTES:
            raise SnapshotRefused(f"snapshot larger than {MAX_SNAPSHOT_BYTES} bytes")
        _digest_update(self.digest, d.name, d.offset, d.data, d.zeros)
        path = self.root / d.name
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("ab") as f:
            if not d.zeros:
                f.write(d.data)
            elif d.name.startswith("log/"):
                f.write(_ZEROS[:n])  # a data segment is never sparse (docs/STORAGE.md)
            else:
                f.truncate(self.size + n)  # the application's files are made sparse too
        self.size += n

    def sync(self) -> None:
        for p in sorted(self.root.rglob("*"), reverse=True):
            fd = os.open(p, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)


class SnapshotReceiver:
    """Stages one transfer at a time; installs what the core accepted."""

    def __init__(self, node: DLedgerNode) -> None:
        self._node = node
        self.dir = Path(node.cfg.store_dir) / STAGING_DIR
        self._busy = False
        self._staged: dict[tuple[int, int], pb.SnapshotHeader] = {}
        self.installed = 0
        self.refused = 0

    async def receive(
        self, sender: str, requests: AsyncIterator[pb.SnapshotChunk]
    ) -> pb.SnapshotReply:
        if self._busy:
            raise SnapshotRefused("another snapshot transfer is in progress")
        self._busy = True
        try:
            return await self._receive(sender, requests)
        except SnapshotRefused as exc:
            self.refused += 1
            self._node.note_drop(DROP_SNAPSHOT_REFUSED, f"from={sender}: {exc}")
            raise
        finally:
            self._busy = False

    async def _receive(
        self, sender: str, requests: AsyncIterator[pb.SnapshotChunk]
    ) -> pb.SnapshotReply:
        node = self._node
        loop = asyncio.get_running_loop()
        it = aiter(requests)
        first = await _next_chunk(it)
        if first.WhichOneof("kind") != "header":
            raise SnapshotRefused("a transfer starts with its header")
        h = first.header
        _check_header(h, node.store.config.segment_size_bytes)
        if h.term < node.core.term or h.snapshot_index <= node.core.commit_index:
            return pb.SnapshotReply(accepted=False)  # stale: nothing to send
        conf = _snapshot_conf(h)  # a malformed configuration refuses before anything is staged
        incoming = self.dir / "incoming"
        await loop.run_in_executor(None, _fresh_dir, incoming)
        staging = _Staging(incoming)
        try:
            await self._stage(it, staging, h)
        except BaseException:
            # Refused, failed or abandoned (the sender gone: the call is cancelled) part way:
            # nothing of it stays. Shielded: a second cancel does not stop the removal.
            await asyncio.shield(loop.run_in_executor(None, _remove_dir, incoming))
            raise
        self._staged = {(h.snapshot_index, h.snapshot_term): h}
        m = InstallSnapshot(
            sender,
            node.cfg.self_id,
            h.term,
            h.snapshot_index,
            h.snapshot_term,
            conf,
            h.snapshot_chain,
        )
        node.step_local(m)
        pending = node.core.pending_snapshot
        accepted = pending is not None and pending.index == h.snapshot_index
        if not accepted:
            # The core had what it covers by now, or follows another leader: nothing will
            # install these files (unless it still waits to install an earlier snapshot).
            self._staged.clear()
            if pending is None:
                await loop.run_in_executor(None, _remove_dir, self.dir / "ready")
        return pb.SnapshotReply(accepted=accepted, received_bytes=staging.total)

    async def _stage(
        self, it: AsyncIterator[pb.SnapshotChunk], staging: _Staging, h: pb.SnapshotHeader
    ) -> None:
        """Write the data chunks up to the trailer, check it, and make the files ``ready``."""
        loop = asyncio.get_running_loop()
        while True:
            chunk = await _next_chunk(it)
            kind = chunk.WhichOneof("kind")
            if kind == "data":
                await loop.run_in_executor(None, staging.write, chunk.data)
            elif kind == "trailer":
                break
            else:
                raise SnapshotRefused("a second header in one transfer")
        t = chunk.trailer
        if t.total_bytes != staging.total or t.sha256 != staging.digest.digest():
            raise SnapshotRefused(
                f"checksum or size does not match ({staging.total} bytes received, "
                f"{t.total_bytes} sent)"
            )
        check = functools.partial(
            verify_staged_log,
            staging.root / "log",
            start_position=h.start_position,
            segment_size_bytes=h.segment_size_bytes,
            base_index=h.base_index,
            last_index=h.snapshot_index,
        )
        try:
            await loop.run_in_executor(None, check)
        except DLedgerError as exc:  # a damaged entry, or segments that do not fit
            raise SnapshotRefused(f"the log it brings is damaged: {exc}") from None
        await loop.run_in_executor(None, make_ready, self.dir, staging, h)

    async def install(self, meta: SnapshotMeta) -> SegmentedLogStore:
        """Install the staged snapshot ``meta`` (the core accepted it): returns the new store
        (the old one is closed)."""
        node = self._node
        h = self._staged.pop((meta.index, meta.term), None)
        if h is None:
            raise DLedgerError(f"snapshot {meta.index}/{meta.term} accepted but not staged")
        loop = asyncio.get_running_loop()
        marker = self.dir / INSTALL_MARKER
        await loop.run_in_executor(None, atomic_write, marker, b"install\n")
        node.store.close()
        await loop.run_in_executor(None, finish_install, node.cfg.store_dir)
        store = await loop.run_in_executor(
            None,
            functools.partial(
                SegmentedLogStore,
                node.cfg.store_dir,
                node.cfg.store,
                supported_feature_level=node.cfg.supported_feature_level,
            ),
        )
        self.installed += 1
        return store


async def _next_chunk(it: AsyncIterator[pb.SnapshotChunk]) -> pb.SnapshotChunk:
    try:
        return await asyncio.wait_for(anext(it), SNAPSHOT_IDLE_TIMEOUT_S)
    except StopAsyncIteration:
        raise SnapshotRefused("the transfer ended before its trailer") from None
    except TimeoutError:
        raise SnapshotRefused(f"no chunk for {SNAPSHOT_IDLE_TIMEOUT_S:.0f} s") from None


def _snapshot_conf(h: pb.SnapshotHeader) -> ConfState | None:
    """The membership configuration in force at the snapshot's index (None: the sender sent
    none, the static configuration); a malformed one refuses the transfer."""
    if not h.config:
        return None
    try:
        return decode_conf(h.config, h.snapshot_index)
    except ValueError as exc:
        raise SnapshotRefused(f"membership configuration: {exc}") from None


def _header_dict(h: pb.SnapshotHeader) -> dict[str, int | str]:
    """What an install (and a restart finishing one) needs of the header, the membership
    configuration included: the log that held its CONFIG entries is replaced."""
    return {
        "v": HEADER_VERSION,
        "config": base64.b64encode(h.config).decode(),
        "snapshot_index": h.snapshot_index,
        "snapshot_term": h.snapshot_term,
        "base_index": h.base_index,
        "base_term": h.base_term,
        "start_position": h.start_position,
        "segment_size_bytes": h.segment_size_bytes,
        "base_chain": h.base_chain,
    }


def make_ready(staging_dir: Path, staging: _Staging, h: pb.SnapshotHeader) -> None:
    """A complete, verified transfer becomes ``staging_dir/ready``: data synced first, then
    moved, then its header (the last file written: no header, no snapshot to install)."""
    staging.sync()
    ready = staging_dir / "ready"
    shutil.rmtree(ready, ignore_errors=True)
    os.rename(staging.root, ready)
    (ready / "log").mkdir(exist_ok=True)
    (ready / "app").mkdir(exist_ok=True)
    atomic_write(ready / HEADER_FILE, json.dumps(_header_dict(h)).encode())
    fsync_dir(staging_dir)


def _fresh_dir(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)


def _remove_dir(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)


def clear_staging(store_dir: str) -> None:
    """At start, with no install to finish (:func:`pending_install` is None): drop whatever
    a transfer a crash or a kill cut short left staged (``incoming``, or a ``ready`` the core
    never installed). Nothing there is needed: the leader sends the snapshot again."""
    staging = Path(store_dir) / STAGING_DIR
    if (staging / INSTALL_MARKER).exists():
        raise DLedgerError(f"{staging} holds an install to finish, not leftovers")
    if staging.exists():
        logger.info("snapshot staging left by an earlier run removed: %s", staging)
        shutil.rmtree(staging, ignore_errors=True)


def finish_install(store_dir: str) -> None:
    """Swap the staged log in and save the snapshot's membership configuration (idempotent:
    also what a restart runs when the marker is there). The application's files are swapped
    by :func:`install_app`, which removes the marker last: a crash anywhere before leaves
    the marker, and the next start runs this again, so the node never starts with the new
    log and the configuration of the old one (whose CONFIG entries the install dropped)."""
    staging = Path(store_dir) / STAGING_DIR
    ready = staging / "ready"
    h = staged_header(ready)
    raw_conf = base64.b64decode(h.get("config", ""))
    level = BASELINE_LEVEL
    if raw_conf:
        conf = decode_conf(raw_conf, int(h["snapshot_index"]))
        save_conf(store_dir, conf)
        level = conf.features  # a raised group's store is format 3 from its first checkpoint
    install_log(
        Path(store_dir),
        ready / "log",
        base_index=int(h["base_index"]),
        base_term=int(h["base_term"]),
        start_position=int(h["start_position"]),
        segment_size_bytes=int(h["segment_size_bytes"]),
        base_chain=int(h.get("base_chain", CHAIN_UNKNOWN)),
        feature_level=level,
    )


def staged_header(ready: Path) -> dict[str, Any]:
    """The header of the snapshot staged in ``ready``; FormatTooNewError when a newer release
    wrote it (the install is left to that release: nothing is swapped or removed)."""
    path = ready / HEADER_FILE
    h: dict[str, Any] = json.loads(path.read_bytes())
    version = h.get("v", 1) if isinstance(h, dict) else None
    if not isinstance(version, int) or version < 1:
        raise DLedgerError(f"{path}: not a snapshot header")
    if version > HEADER_VERSION:
        message = too_new_message("snapshot header", path, version, HEADER_VERSION)
        raise FormatTooNewError(message, path=str(path), found=version, newest=HEADER_VERSION)
    return h


def pending_install(store_dir: str) -> int | None:
    """The snapshot index of an install a crash interrupted (its marker is there), else
    None."""
    staging = Path(store_dir) / STAGING_DIR
    if not (staging / INSTALL_MARKER).exists():
        return None
    h = staged_header(staging / "ready")
    return int(h["snapshot_index"])


def install_app(store_dir: str, sm: object, index: int) -> None:
    """Hand the staged application files to the state machine (if it takes snapshots),
    then drop the staging directory and the marker."""
    staging = Path(store_dir) / STAGING_DIR
    hook = getattr(sm, "install_snapshot", None)
    if callable(hook):
        hook(staging / "ready" / "app", index)
    (staging / INSTALL_MARKER).unlink(missing_ok=True)
    fsync_dir(staging)
    shutil.rmtree(staging / "ready", ignore_errors=True)


def refused_status(exc: SnapshotRefused) -> status.RpcFailure:
    return status.RpcFailure(grpc.StatusCode.FAILED_PRECONDITION, E.SNAPSHOT_REFUSED, str(exc))
