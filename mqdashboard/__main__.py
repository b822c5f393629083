"""``mqdashboard``: serve the web dashboard of a raftmq cluster (docs/DASHBOARD.md).

    mqdashboard [-n host:port;host:port] [--host 127.0.0.1] [--port 8080]
                [--sample-interval-ms 2000] [security options]

It needs only the NameServer addresses (``-n``, env ``NAMESRV_ADDR``, default
``127.0.0.1:9876``) and reaches a secure group with the options every tool takes
(``--tls-ca``, ``--credentials``, env ``RAFTMQ_TLS_CA`` / ``RAFTMQ_CREDENTIALS``: see
docs/SECURITY.md). It binds 127.0.0.1 unless ``--host`` says otherwise.

Exit codes: 0 stopped by a signal; 1 the server could not start (a busy port); 2 bad usage.
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import sys

import uvicorn

from client.errors import MQClientError
from mqdashboard.reader import GroupReader
from mqdashboard.sampler import DEFAULT_INTERVAL_MS, MAX_INTERVAL_MS, MIN_INTERVAL_MS, Sampler
from mqdashboard.web import Settings, create_app
from mqsecurity.errors import SecurityError
from mqsecurity.options import add_security_arguments, security_from_args

DEFAULT_PORT = 8080  # rocketmq-dashboard's
DEFAULT_HOST = "127.0.0.1"
DEFAULT_NAMESRV = "127.0.0.1:9876"
ENV_NAMESRV = "NAMESRV_ADDR"  # RocketMQ's


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="mqdashboard",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "-n",
        "--namesrv",
        default=os.environ.get(ENV_NAMESRV, DEFAULT_NAMESRV),
        help=f"NameServers, host:port;host:port (env {ENV_NAMESRV}; default {DEFAULT_NAMESRV})",
    )
    parser.add_argument(
        "--host",
        default=DEFAULT_HOST,
        help="address to bind (default 127.0.0.1: this machine only; anyone who reaches the "
        "dashboard reads what its credentials may read)",
    )
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help="HTTP port (default 8080)")
    parser.add_argument(
        "--sample-interval-ms",
        type=int,
        default=DEFAULT_INTERVAL_MS,
        help=f"how often the live rates and charts sample the cluster "
        f"({MIN_INTERVAL_MS} to {MAX_INTERVAL_MS}, default {DEFAULT_INTERVAL_MS})",
    )
    add_security_arguments(parser)
    return parser


def allowed_hosts(host: str) -> list[str]:
    """The Host headers the dashboard answers: the bound address, and localhost when bound to
    loopback; any when bound to every interface (the operator's choice: put it behind a
    proxy that checks the name)."""
    if host in ("0.0.0.0", "::"):
        return ["*"]
    hosts = [host]
    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = host == "localhost"
    if loopback:
        hosts += ["localhost", "127.0.0.1", "[::1]"]
    return sorted(set(hosts))


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not 0 < args.port < 65536:
        parser.error(f"--port {args.port}: outside 1..65535")
    if not MIN_INTERVAL_MS <= args.sample_interval_ms <= MAX_INTERVAL_MS:
        parser.error(
            f"--sample-interval-ms {args.sample_interval_ms}: outside "
            f"{MIN_INTERVAL_MS}..{MAX_INTERVAL_MS}"
        )
    try:
        security = security_from_args(args)
    except SecurityError as exc:
        parser.error(str(exc))
    try:
        reader = GroupReader(args.namesrv, security)
    except MQClientError as exc:
        parser.error(f"-n {args.namesrv!r}: {exc.message}")
    sampler = Sampler(reader, args.sample_interval_ms)
    settings = Settings(args.namesrv, actions_need_credentials=security.credentials is not None)
    app = create_app(reader, sampler, settings, allowed_hosts(args.host))
    shown_host = f"[{args.host}]" if ":" in args.host else args.host
    print(
        f"mqdashboard: http://{shown_host}:{args.port}/ for NameServer {args.namesrv} "
        f"({security.describe()})",
        flush=True,
    )
    server = uvicorn.Server(
        uvicorn.Config(app, host=args.host, port=args.port, log_level="warning", access_log=False)
    )
    try:
        server.run()
    except SystemExit:  # uvicorn's answer to a failed start (a busy port), said on stderr
        return 1
    return 0 if server.started else 1


if __name__ == "__main__":
    sys.exit(main())
