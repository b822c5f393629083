"""The floor (issue #23): a bare gRPC round trip between the same kinds of processes as a raftmq
send, so raftmq's latency and rate can be read as a ratio to what the processes and gRPC alone
cost.

Three Python server processes on 127.0.0.1, grpc.aio like the brokers (same server and channel
options as the peer transport, the brokers' garbage-collector settings): a *leader* serves one
unary method; for each call it writes the request (8-byte sequence number + payload) to a
long-lived bidirectional stream to each of two *followers*, which answer every frame with its
sequence number, and the leader answers the call once both have acknowledged. No Raft, no
disk, no protobuf: bytes in, bytes out. The load is the peers' (``bench.peers``): closed-loop
senders over grpc.aio unary calls in spawned processes, one channel per process (as the raftmq
producer keeps one per address), a warm-up, then the measured window.

    python -m bench.floor --in-flight 1,16 --seconds 5      (prints one line per case)

``mqbench --only floor`` runs it alone; a whole ``mqbench`` run puts it beside raftmq's cases.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import grpc

from bench import tune_gc
from bench.peers import (
    HOST,
    POLL_INTERVAL_S,
    PeerError,
    _Cluster,
    _load_text,
    _Member,
    _run_load,
    _Tally,
    _WorkerSpec,
    drive,
    free_ports,
    split_in_flight,
    summarize,
)
from dledger.server.transport import CHANNEL_OPTIONS, SERVER_OPTIONS

log = logging.getLogger("bench.floor")

SERVICE = "raftmq.bench.v1.Floor"
CALL_METHOD = f"/{SERVICE}/Call"
REPLICATE_METHOD = f"/{SERVICE}/Replicate"
FOLLOWERS = 2
SEQ_BYTES = 8
# Calls the leader holds waiting for acknowledgements; past it a call is refused
# (RESOURCE_EXHAUSTED). Far above any in-flight count mqbench asks for (256).
MAX_PENDING_CALLS = 65_536
# Frames queued per follower stream (the pending calls bound it too).
FOLLOWER_QUEUE_MAX = MAX_PENDING_CALLS
# A call waits this long for both acknowledgements before failing (a follower died).
ACK_TIMEOUT_S = 10.0
# From spawning the three processes to a leader that answers a call.
START_TIMEOUT_S = 60.0
PROBE_TIMEOUT_S = 2.0
DEFAULT_SIZE_BYTES = 1024
DEFAULT_IN_FLIGHT = (1, 16)
DEFAULT_SECONDS = 5.0
DEFAULT_WARMUP_S = 1.0
DEFAULT_PROCESSES = 2  # as many load processes as mqbench's own cases use
CONNECTIONS_PER_PROCESS = 1
REPO_ROOT = Path(__file__).resolve().parent.parent


# --------------------------------------------------------------------------------------------
# The server processes


class _Fanout:
    """The leader's side: one stream per follower, and the calls waiting for their acks."""

    def __init__(self, followers: Sequence[str]) -> None:
        self.followers = list(followers)
        self._queues: list[asyncio.Queue[bytes]] = []
        self._pending: dict[int, list[Any]] = {}  # seq -> [future, acks still missing]
        self._next = 0
        self._broken = ""

    async def open(self, deadline: float) -> list[asyncio.Task[None]]:
        """Connects to every follower (waiting for each until ``deadline``) and starts its
        stream; returns the readers' tasks."""
        readers = []
        for addr in self.followers:
            ch = grpc.aio.insecure_channel(addr, options=CHANNEL_OPTIONS)
            await asyncio.wait_for(ch.channel_ready(), max(0.1, deadline - time.monotonic()))
            q: asyncio.Queue[bytes] = asyncio.Queue(FOLLOWER_QUEUE_MAX)
            self._queues.append(q)
            call = ch.stream_stream(REPLICATE_METHOD)(self._frames(q))
            readers.append(asyncio.ensure_future(self._read_acks(addr, call)))
        return readers

    @staticmethod
    async def _frames(q: asyncio.Queue[bytes]) -> AsyncIterator[bytes]:
        while True:
            yield await q.get()

    async def _read_acks(self, addr: str, call: Any) -> None:
        try:
            async for ack in call:
                self._acked(int.from_bytes(ack[:SEQ_BYTES], "big"))
        except grpc.RpcError as exc:
            self._broken = f"follower {addr}: {exc.code().name}"
        else:
            self._broken = f"follower {addr} closed its stream"
        log.error("%s; failing the %d pending calls", self._broken, len(self._pending))
        for fut, _ in self._pending.values():
            if not fut.done():
                fut.set_exception(PeerError(self._broken))
        self._pending.clear()

    def _acked(self, seq: int) -> None:
        entry = self._pending.get(seq)
        if entry is None:
            return
        entry[1] -= 1
        if entry[1] == 0:
            del self._pending[seq]
            if not entry[0].done():
                entry[0].set_result(None)

    async def call(self, request: bytes, context: grpc.aio.ServicerContext[Any, Any]) -> bytes:
        if self._broken:
            await context.abort(grpc.StatusCode.UNAVAILABLE, self._broken)
        if len(self._pending) >= MAX_PENDING_CALLS:
            await context.abort(
                grpc.StatusCode.RESOURCE_EXHAUSTED, f"over {MAX_PENDING_CALLS} calls pending"
            )
        seq = self._next
        self._next += 1
        fut = asyncio.get_running_loop().create_future()
        self._pending[seq] = [fut, len(self._queues)]
        head = seq.to_bytes(SEQ_BYTES, "big")
        frame = head + request
        for q in self._queues:
            q.put_nowait(frame)
        try:
            await asyncio.wait_for(fut, ACK_TIMEOUT_S)
        except (TimeoutError, PeerError) as exc:
            self._pending.pop(seq, None)
            await context.abort(grpc.StatusCode.UNAVAILABLE, f"not acknowledged: {exc}")
        return head


async def _replicate(
    frames: AsyncIterator[bytes], context: grpc.aio.ServicerContext[Any, Any]
) -> AsyncIterator[bytes]:
    """A follower: every frame is answered with its sequence number."""
    async for frame in frames:
        yield frame[:SEQ_BYTES]


async def _serve(port: int, followers: Sequence[str]) -> None:
    server = grpc.aio.server(options=SERVER_OPTIONS)
    handlers: dict[str, grpc.RpcMethodHandler] = {
        "Replicate": grpc.stream_stream_rpc_method_handler(_replicate)
    }
    readers: list[asyncio.Task[None]] = []
    if followers:
        fanout = _Fanout(followers)
        readers = await fanout.open(time.monotonic() + START_TIMEOUT_S)
        handlers["Call"] = grpc.unary_unary_rpc_method_handler(fanout.call)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))
    if server.add_insecure_port(f"{HOST}:{port}") != port:
        raise PeerError(f"cannot listen on {HOST}:{port}")
    await server.start()
    log.info("floor %s serving on %s:%d", "leader" if followers else "follower", HOST, port)
    if readers:  # a leader ends when a follower stream does: the harness sees it exit
        await asyncio.wait(readers, return_when=asyncio.FIRST_COMPLETED)
        await server.stop(None)
    else:
        await server.wait_for_termination()


# --------------------------------------------------------------------------------------------
# The group


class FloorGroup(_Cluster):
    """A leader and two followers (``python -m bench.floor serve``) on free ports, stopped by
    PID on exit."""

    binary = sys.executable
    kind = "floor"

    def __init__(self, base_dir: str | Path | None = None) -> None:
        super().__init__(base_dir)
        self.ports: list[int] = []

    def __enter__(self) -> FloorGroup:
        self.start()
        return self

    @classmethod
    def unavailable_reason(cls) -> str | None:
        return None  # only Python and grpc: always here

    @property
    def target(self) -> str:
        return f"{HOST}:{self.ports[0]}"

    def _prepare(self) -> None:
        assert self.root is not None
        self.ports = free_ports(1 + FOLLOWERS)
        names = ["leader", *(f"follower{i}" for i in range(FOLLOWERS))]
        self.members = [_Member(n, self.root / n, self.root / f"{n}.log") for n in names]

    def _env(self) -> dict[str, str]:
        path = os.environ.get("PYTHONPATH", "")
        return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(REPO_ROOT), path) if p)}

    def _command(self, index: int) -> list[str]:
        cmd = [sys.executable, "-m", "bench.floor", "serve", "--port", str(self.ports[index])]
        if index == 0:
            cmd += ["--followers", ",".join(f"{HOST}:{p}" for p in self.ports[1:])]
        return cmd

    def _wait_ready(self, deadline: float) -> None:
        # The channel's reconnect back-off as the peer transport's (20 ms first), so a leader
        # that starts listening a moment after the first try is seen at once.
        with grpc.insecure_channel(self.target, options=CHANNEL_OPTIONS) as ch:
            probe = ch.unary_unary(CALL_METHOD)
            while time.monotonic() < deadline:
                self._check_alive()
                try:
                    probe(b"probe", timeout=PROBE_TIMEOUT_S, wait_for_ready=True)
                    return
                except grpc.RpcError:
                    time.sleep(POLL_INTERVAL_S)
        raise self._timeout("no answer from the leader")


# --------------------------------------------------------------------------------------------
# The load (runs in the peers' spawned load processes)


async def floor_session(
    spec: _WorkerSpec, ready: Callable[[], Awaitable[tuple[float, float]]]
) -> _Tally:
    """``spec.senders`` closed-loop unary calls of ``spec.size_bytes`` to the leader."""
    channels = [
        grpc.aio.insecure_channel(spec.target, options=CHANNEL_OPTIONS)
        for _ in range(spec.connections)
    ]
    try:
        calls = [ch.unary_unary(CALL_METHOD) for ch in channels]
        for ch in channels:
            await asyncio.wait_for(ch.channel_ready(), START_TIMEOUT_S)
        payload = os.urandom(spec.size_bytes)

        async def send(k: int, seq: int) -> None:
            await calls[k % len(calls)](payload, timeout=ACK_TIMEOUT_S)

        start_at, stop_at = await ready()
        return await drive(send, spec.senders, start_at, stop_at)
    finally:
        for ch in channels:
            await ch.close()


def run_floor(
    size_bytes: int,
    in_flight: int,
    seconds: float,
    *,
    processes: int = DEFAULT_PROCESSES,
    warmup_s: float = DEFAULT_WARMUP_S,
    group: FloorGroup | None = None,
) -> dict[str, Any]:
    """Closed-loop calls of ``size_bytes`` through the floor's leader, ``in_flight`` at a
    time, for ``seconds`` after ``warmup_s``; the peers' result shape plus the servers' CPU
    per call. Starts (and stops) a fresh group unless given one."""
    if group is None:
        with FloorGroup() as fresh:
            return run_floor(
                size_bytes, in_flight, seconds, processes=processes, warmup_s=warmup_s, group=fresh
            )
    specs = [
        _WorkerSpec("floor", i, group.target, n, size_bytes, CONNECTIONS_PER_PROCESS)
        for i, n in enumerate(split_in_flight(in_flight, processes))
    ]
    out = _run_load(specs, warmup_s, seconds, group.pids())
    ops = len(out.latencies_ms)
    conditions = (
        f"a grpc.aio leader answering each unary call once {FOLLOWERS} grpc.aio followers "
        f"acknowledged it on their streams (raw bytes, no disk); {size_bytes} B payloads, "
        f"{in_flight} in flight over {len(specs)} Python processes (grpc.aio, "
        f"{CONNECTIONS_PER_PROCESS} channel each), {warmup_s:g} s warm-up, {seconds:g} s "
        f"measured; servers' CPU {out.peer_cpu_s:.1f} s; {_load_text(out, seconds)}"
    )
    if out.errors:
        conditions += f"; first error: {out.first_error}"
    result = summarize(out.latencies_ms, out.errors, seconds, size_bytes, conditions)
    result["in_flight"] = in_flight
    result["server_cpu_us_per_call"] = out.peer_cpu_s / ops * 1e6 if ops else 0.0
    return result


def run_levels(
    size_bytes: int, in_flight: Sequence[int], seconds: float, processes: int = DEFAULT_PROCESSES
) -> list[dict[str, Any]]:
    """``run_floor`` at each in-flight count on one group."""
    with FloorGroup() as group:
        return [
            run_floor(size_bytes, n, seconds, processes=processes, group=group) for n in in_flight
        ]


# --------------------------------------------------------------------------------------------
# Command line


def _raise_on_sigterm(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.floor", description=__doc__)
    sub = p.add_subparsers(dest="cmd")
    s = sub.add_parser("serve", help="one server process (started by FloorGroup)")
    s.add_argument("--port", type=int, required=True)
    s.add_argument("--followers", default="", help="leader: the followers, host:port,host:port")
    p.add_argument("--in-flight", dest="in_flight", default=",".join(map(str, DEFAULT_IN_FLIGHT)))
    p.add_argument("--seconds", type=float, default=DEFAULT_SECONDS)
    p.add_argument("--size", type=int, default=DEFAULT_SIZE_BYTES)
    p.add_argument("--processes", type=int, default=DEFAULT_PROCESSES)
    p.add_argument("--json", action="store_true", help="print one JSON list instead")
    a = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    if a.cmd == "serve":
        tune_gc()
        followers = [f for f in a.followers.split(",") if f]
        if followers and len(followers) != FOLLOWERS:
            p.error(f"--followers takes {FOLLOWERS} addresses")
        asyncio.run(_serve(a.port, followers))
        return 0
    try:
        levels = [int(x) for x in a.in_flight.split(",")]
    except ValueError:
        p.error("--in-flight takes comma-separated integers")
    if min(levels) <= 0 or a.seconds <= 0 or a.size <= 0 or a.processes <= 0:
        p.error("--in-flight, --seconds, --size and --processes must be > 0")
    signal.signal(signal.SIGTERM, _raise_on_sigterm)
    try:
        cases = run_levels(a.size, levels, a.seconds, a.processes)
    except PeerError as exc:
        print(f"bench.floor: {exc}", file=sys.stderr)
        return 1
    if a.json:
        print(json.dumps(cases, indent=2))
    for c in [] if a.json else cases:
        print(
            f"floor {a.size} B x {c['in_flight']} in flight: {c['ops_per_s']:,.0f} calls/s "
            f"p50 {c['p50_ms']:.2f} p99 {c['p99_ms']:.2f} ms, servers "
            f"{c['server_cpu_us_per_call']:.0f} us CPU per call"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
