"""``mqnamesrv [-p PORT] [-c FILE]``: run one NameServer in the foreground until SIGTERM/SIGINT."""

from __future__ import annotations

import sys

from mqsecurity import handshakes

if __name__ == "__main__":  # `python -m nameserver`: before grpc is imported (docs/SECURITY.md)
    handshakes.tap_before_grpc(sys.argv[1:])

import argparse
import asyncio
import dataclasses
import logging

from mqcli import server_parser
from mqcli.logs import check_log_arguments, setup_server_logging
from nameserver.config import (
    KEYS,
    ConfigError,
    NameServerConfig,
    ignored_keys_warning,
    load_config,
)
from nameserver.server import NameServer, StartError
from prockit.processes import serve_until_signalled


async def _serve(cfg: NameServerConfig) -> None:
    server = NameServer(cfg)
    await server.start()
    await serve_until_signalled(server.stop)


def build_parser() -> argparse.ArgumentParser:
    """``mqnamesrv``'s command line (the systemd unit's test parses its ExecStart with it)."""
    parser = server_parser(
        "mqnamesrv",
        "Run one raftmq NameServer (broker registration and topic routes).",
        "config file keys (properties format)",
        {name: doc for name, (_, doc) in KEYS.items()},
    )
    parser.add_argument("-p", "--port", type=int, help="gRPC port (overrides listenPort)")
    parser.add_argument("-c", "--config", help="properties file")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    ns = parser.parse_args(argv)
    check_log_arguments(parser, ns)
    setup_server_logging(ns)
    try:
        cfg = load_config(ns.config) if ns.config else NameServerConfig()
    except ConfigError as exc:
        print(f"mqnamesrv: {exc}", file=sys.stderr)
        return 2
    warning = ignored_keys_warning(cfg, ns.config) if ns.config else None
    if warning is not None:
        logging.getLogger("nameserver.config").warning("%s", warning)
    if ns.port is not None:
        if not 1 <= ns.port <= 65535:
            print(f"mqnamesrv: -p {ns.port}: not a port (1-65535)", file=sys.stderr)
            return 2
        cfg = dataclasses.replace(cfg, listenPort=ns.port)
    if argv is None:  # a process of its own (it may re-execute itself)
        handshakes.count_refused_handshakes(cfg.tlsEnable)
    try:
        asyncio.run(_serve(cfg))
    except StartError as exc:
        print(f"mqnamesrv: cannot start: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
