"""A fault-injecting TCP proxy: one listening port per directed link, all in one asyncio loop
running in a background thread (no root needed).

A link forwards every connection made to its port to its target. Faults, per link:

- ``cut``: existing connections are reset and new ones closed at once (a one-way cut is a cut
  of one directed link: node A's connection to B dies, B's to A keeps working);
- ``latency_ms`` + ``jitter_ms``: each chunk is delivered that much later (uniform jitter, order
  kept);
- ``bandwidth_bytes_per_s``: each direction of a connection is throttled to this rate.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import random
import threading
from collections.abc import Collection, Coroutine, Iterable
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

logger = logging.getLogger(__name__)
_T = TypeVar("_T")

# Bytes read per chunk; also the granularity of latency and bandwidth shaping.
CHUNK_BYTES = 64 * 1024
# Chunks queued per connection direction before the reader waits (bounds memory on slow links).
MAX_QUEUED_CHUNKS = 256
# Seconds a control call waits for the proxy loop.
CONTROL_TIMEOUT_S = 10.0
# Seconds to connect to a link's target before the client connection is closed.
CONNECT_TIMEOUT_S = 2.0
# Listening ports drawn to find one outside the ports already promised to the group (each
# draw is a fresh kernel-chosen port; a few collisions in a row are already unlikely).
MAX_LISTEN_TRIES = 16


@dataclass(slots=True)
class LinkFaults:
    cut: bool = False
    latency_ms: float = 0.0
    jitter_ms: float = 0.0
    bandwidth_bytes_per_s: int = 0  # 0: unlimited

    def healthy(self) -> bool:
        return (
            not self.cut
            and not self.latency_ms
            and not self.jitter_ms
            and not (self.bandwidth_bytes_per_s)
        )


@dataclass(slots=True)
class Link:
    name: str
    target_port: int
    listen_port: int = 0
    faults: LinkFaults = field(default_factory=LinkFaults)
    server: asyncio.base_events.Server | None = None
    conns: set[asyncio.StreamWriter] = field(default_factory=set)
    accepted: int = 0
    refused: int = 0
    bytes_forwarded: int = 0


class ProxyNet:
    """Every link of a run. ``start()``, ``add_link()``..., fault calls, ``stop()``."""

    def __init__(self, seed: int, host: str = "127.0.0.1") -> None:
        self.host = host
        self._rng = random.Random(seed)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name="jepsen-proxy", daemon=True)
        self.links: dict[str, Link] = {}

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_forever()

    def start(self) -> None:
        self._thread.start()

    def _call(self, coro: Coroutine[Any, Any, _T]) -> _T:
        fut: concurrent.futures.Future[_T] = asyncio.run_coroutine_threadsafe(coro, self._loop)
        return fut.result(CONTROL_TIMEOUT_S)

    def stop(self) -> None:
        if not self._thread.is_alive():
            return
        with contextlib.suppress(Exception):
            self._call(self._close_all())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(CONTROL_TIMEOUT_S)
        if not self._thread.is_alive():
            self._loop.close()

    async def _close_all(self) -> None:
        for link in self.links.values():
            if link.server is not None:
                link.server.close()
            for w in list(link.conns):
                w.transport.abort()
        for link in self.links.values():
            if link.server is not None:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(link.server.wait_closed(), CONNECT_TIMEOUT_S)

    # ------------------------------------------------------------------ links

    def add_link(self, name: str, target_port: int, avoid: Collection[int] = ()) -> int:
        """Listen on a free port that forwards to ``target_port``; returns the port. The port is
        never one of ``avoid``: ports picked for processes that have not bound them yet (the
        kernel may hand such a port to this listener, and the process then cannot start)."""
        assert name not in self.links, name
        link = Link(name, target_port)
        self.links[name] = link
        return self._call(self._listen(link, frozenset(avoid)))

    async def _listen(self, link: Link, avoid: frozenset[int]) -> int:
        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await self._handle(link, reader, writer)

        refused: list[asyncio.Server] = []  # held open until a good port is found
        try:
            for _ in range(MAX_LISTEN_TRIES):
                server = await asyncio.start_server(handle, self.host, 0)
                port = int(server.sockets[0].getsockname()[1])
                if port not in avoid:
                    link.server, link.listen_port = server, port
                    return port
                refused.append(server)
            raise RuntimeError(
                f"link {link.name}: no free port outside the {len(avoid)} promised ones"
                f" in {MAX_LISTEN_TRIES} draws"
            )
        finally:
            for server in refused:
                server.close()

    async def _handle(
        self, link: Link, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        if link.faults.cut:
            link.refused += 1
            writer.transport.abort()
            return
        try:
            up_reader, up_writer = await asyncio.wait_for(
                asyncio.open_connection(self.host, link.target_port), CONNECT_TIMEOUT_S
            )
        except (OSError, TimeoutError):
            writer.transport.abort()  # target down: the client sees a reset, as without us
            return
        if link.faults.cut:  # cut while we were connecting
            up_writer.transport.abort()
            writer.transport.abort()
            return
        link.accepted += 1
        link.conns.update((writer, up_writer))
        try:
            await asyncio.gather(
                self._pump(link, reader, up_writer), self._pump(link, up_reader, writer)
            )
        finally:
            for w in (writer, up_writer):
                link.conns.discard(w)
                w.transport.abort()

    async def _pump(
        self, link: Link, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        """Copy one direction with the link's latency and bandwidth; stop on EOF, error or
        cut (the caller then aborts both sockets)."""
        queue: asyncio.Queue[tuple[float, bytes] | None] = asyncio.Queue(MAX_QUEUED_CHUNKS)
        loop = asyncio.get_running_loop()

        async def deliver() -> None:
            while True:
                item = await queue.get()
                if item is None:
                    return
                at, data = item
                delay = at - loop.time()
                if delay > 0:
                    await asyncio.sleep(delay)
                if link.faults.cut:
                    return
                writer.write(data)
                await writer.drain()
                link.bytes_forwarded += len(data)
                bw = link.faults.bandwidth_bytes_per_s
                if bw > 0:
                    await asyncio.sleep(len(data) / bw)

        sender = asyncio.ensure_future(deliver())
        last_at = 0.0
        try:
            while not sender.done():
                data = await reader.read(CHUNK_BYTES)
                if not data or link.faults.cut:
                    break
                f = link.faults
                delay_s = (f.latency_ms + self._rng.uniform(0.0, f.jitter_ms)) / 1000
                last_at = max(last_at, loop.time() + delay_s)  # jitter never reorders bytes
                await queue.put((last_at, data))
        except (OSError, ConnectionError):
            pass
        finally:
            with contextlib.suppress(asyncio.QueueFull):
                queue.put_nowait(None)
            if not sender.done() and (link.faults.cut or queue.full()):
                sender.cancel()
            with contextlib.suppress(asyncio.CancelledError, OSError, ConnectionError):
                await sender
            with contextlib.suppress(OSError, RuntimeError):
                if writer.can_write_eof():
                    writer.write_eof()

    # ------------------------------------------------------------------ faults

    async def _apply(self, names: list[str], faults: LinkFaults | None) -> None:
        for name in names:
            link = self.links[name]
            link.faults = LinkFaults() if faults is None else replace(faults)
            if link.faults.cut:
                for w in list(link.conns):
                    w.transport.abort()

    def set_faults(self, names: Iterable[str], faults: LinkFaults | None) -> None:
        """Give every named link ``faults`` (None: heal them)."""
        wanted = list(names)
        unknown = [n for n in wanted if n not in self.links]
        if unknown:
            raise KeyError(f"unknown links {unknown}")
        self._call(self._apply(wanted, faults))

    def cut(self, names: Iterable[str]) -> None:
        self.set_faults(names, LinkFaults(cut=True))

    def heal_all(self) -> None:
        self.set_faults(list(self.links), None)

    def faulty(self) -> dict[str, LinkFaults]:
        return {n: lk.faults for n, lk in self.links.items() if not lk.faults.healthy()}

    def stats(self) -> dict[str, dict[str, int]]:
        return {
            n: {"accepted": lk.accepted, "refused": lk.refused, "bytes": lk.bytes_forwarded}
            for n, lk in self.links.items()
        }
