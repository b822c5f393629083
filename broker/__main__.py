"""``mqbroker -c FILE``: run one broker-group member in the foreground until SIGTERM/SIGINT."""

from __future__ import annotations

import sys

from mqsecurity import handshakes

if __name__ == "__main__":  # `python -m broker`: before grpc is imported (docs/SECURITY.md)
    handshakes.tap_before_grpc(sys.argv[1:])

import argparse
import asyncio
import faulthandler
import gc
import logging
from collections.abc import Coroutine
from typing import Any

import uvloop

from broker.app import Process, build
from broker.config import KEYS, ConfigError, ignored_keys_warning, load_config
from dledger.server import StartError
from mqcli import server_parser
from mqcli.logs import check_log_arguments, setup_server_logging
from prockit import malloc
from prockit.fatal import spawn
from prockit.processes import serve_until_signalled


async def _serve(process: Process) -> None:
    node, registrar = process.node, process.registrar
    exporter, scrubber = process.exporter, process.scrubber
    # The front ends beside the node's own ports: RocketMQ 5 and RocketMQ 4.x's remoting.
    ports = [p for p in (process.v2_port, process.remoting_port) if p is not None]
    for port in ports:
        port.bind()
    if exporter is not None:
        exporter.bind(asyncio.get_running_loop())
    await node.start()
    for port in ports:
        await port.start()
    if exporter is not None:
        exporter.start()
    scrubber.start()
    # Free pages of the C allocator back to the kernel after bursts (prockit.malloc).
    trimmer = spawn(malloc.trim_periodically(), "malloc-trim")
    if registrar is not None:
        registrar.start()

        # Removed from the group: routes must stop naming this node (it serves nothing new).
        def unregister() -> None:
            spawn(registrar.stop(), "unregister-removed")

        node.removed_listeners.append(unregister)

    async def stop() -> None:
        trimmer.cancel()
        if registrar is not None:
            await registrar.stop()  # unregister first: routes drop this node at once
        if exporter is not None:
            await exporter.stop()
        for port in ports:
            await port.stop()
        await scrubber.stop()
        await node.stop()
        process.broker.sm.close()  # the node applies nothing after stop(): final snapshot

    await serve_until_signalled(stop)


# The send path allocates short-lived tuples, protobuf objects and futures by the hundred per
# call, and a broker holds long-lived ones by the hundred thousand (dedup window, results,
# topic and offset tables). With CPython's default gen-0 threshold of 700 the cyclic collector
# ran several hundred times a second and walked the long-lived ones again and again. Raising
# the thresholds and freezing what start-up made keeps it to a few cheap runs a second.
GC_THRESHOLDS = (50_000, 20, 50)


def tune_gc() -> None:
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)


def run_event_loop(main: Coroutine[Any, Any, None]) -> None:
    """Run ``main`` on uvloop's event loop: at one send in flight the leader's loop turns
    about 25 times per message (gRPC completions, the ready loop, timers), and uvloop's turns
    and callbacks cost less CPU than the standard loop's (docs/PERFORMANCE.md, issue #23)."""
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(main)


def enable_crash_traces() -> None:
    """Make a crash by signal (SIGBUS from a mapped file whose blocks a full disk could not
    give, SIGSEGV, SIGFPE, SIGABRT, SIGILL) print ``Fatal Python error: Bus error`` and every
    thread's stack to stderr (the node's log) instead of ending the process without a line."""
    faulthandler.enable(file=sys.stderr, all_threads=True)


def build_parser() -> argparse.ArgumentParser:
    """``mqbroker``'s command line (the systemd unit's test parses its ExecStart with it)."""
    parser = server_parser(
        "mqbroker",
        "Run one member of a raftmq broker group (a DLedger/Raft node).",
        "broker.conf keys",
        {
            name: f"{key.doc} (default: {'required' if key.default is None else key.default})"
            for name, key in KEYS.items()
        },
    )
    parser.add_argument("-c", "--config", required=True, help="broker.conf (properties format)")
    parser.add_argument(
        "--profile",
        metavar="FILE",
        default="",
        help="sample the node with pyinstrument (a test extra) and write the profile, as text, "
        "to FILE when it stops (docs/PERFORMANCE.md)",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    ns = parser.parse_args(argv)
    malloc.cap_arenas()  # before gRPC's and the executors' threads exist (prockit.malloc)
    enable_crash_traces()
    check_log_arguments(parser, ns)
    setup_server_logging(ns)
    try:
        cfg = load_config(ns.config)
        warning = ignored_keys_warning(cfg)
        if warning is not None:
            logging.getLogger("broker.config").warning("%s", warning)
        for note in cfg.notes:
            logging.getLogger("broker.config").warning("%s", note)
        if argv is None:  # a process of its own (it may re-execute itself)
            handshakes.count_refused_handshakes(cfg.tlsEnable)
        process = build(cfg)  # the composition root (broker.app)
    except ConfigError as exc:
        print(f"mqbroker: {exc}", file=sys.stderr)
        return 2
    tune_gc()
    profiler = None
    if ns.profile:
        try:
            from pyinstrument import Profiler
        except ImportError:
            print(
                "mqbroker: --profile needs pyinstrument (pip install pyinstrument)", file=sys.stderr
            )
            return 2
        profiler = Profiler(interval=0.001, async_mode="disabled")
        profiler.start()
    try:
        run_event_loop(_serve(process))
    except StartError as exc:
        print(f"mqbroker: cannot start: {exc}", file=sys.stderr)
        return 1
    finally:
        if profiler is not None:
            profiler.stop()
            with open(ns.profile, "w") as f:
                f.write(profiler.output_text(unicode=False, color=False, show_all=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
