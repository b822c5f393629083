"""Where a server's log goes (mqbroker, mqnamesrv): stderr by default, or a file of its own with
rotation, as text or as JSON lines (docs/DEPLOY.md, "Logs").

    --log-file FILE         write the log to FILE instead of stderr (one file per process:
                            two processes rotating one file would lose lines)
    --log-max-bytes N       rotate FILE when it would exceed N bytes (default 100 MiB)
    --log-backups K         keep K rotated files FILE.1 .. FILE.K (default 5)
    --log-format text|json  text lines (default) or one JSON object a line

Either way stderr keeps what does not go through Python's logging: gRPC's own lines and a
crash's stack (faulthandler). Disk use of a rotated log is bounded by (K + 1) x N bytes.

A neutral module: it imports nothing of the project.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import logging
import logging.handlers
import os

# The text format of every server's lines (prockit.processes uses the same).
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s %(message)s"
# Rotation bounds: a file under 1 MiB rotates every few seconds under DEBUG; over 10 GiB is not
# a log anyone reads. Backups: at least 1 (else rotation would drop the whole log at once).
DEFAULT_MAX_BYTES = 100 << 20
MIN_MAX_BYTES = 1 << 20
MAX_MAX_BYTES = 10 << 30
DEFAULT_BACKUPS = 5
MIN_BACKUPS = 1
MAX_BACKUPS = 100
FORMATS = ("text", "json")


class JsonFormatter(logging.Formatter):
    """One JSON object a line: time (UTC, ISO 8601, ms), level, logger, message, process id,
    and the exception's text when there is one."""

    def format(self, record: logging.LogRecord) -> str:
        when = dt.datetime.fromtimestamp(record.created, dt.UTC)
        out = {
            "ts": when.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
            "pid": record.process,
        }
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, ensure_ascii=False)


def add_log_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("log (docs/DEPLOY.md, 'Logs')")
    group.add_argument("--log-file", metavar="FILE", help="log to FILE (rotated), not stderr")
    group.add_argument(
        "--log-max-bytes",
        type=int,
        default=DEFAULT_MAX_BYTES,
        help=f"rotate at this size ({MIN_MAX_BYTES} to {MAX_MAX_BYTES}; default 100 MiB)",
    )
    group.add_argument(
        "--log-backups",
        type=int,
        default=DEFAULT_BACKUPS,
        help=f"rotated files kept ({MIN_BACKUPS} to {MAX_BACKUPS}; default {DEFAULT_BACKUPS})",
    )
    group.add_argument("--log-format", choices=FORMATS, default="text", help="default text")


def check_log_arguments(parser: argparse.ArgumentParser, ns: argparse.Namespace) -> None:
    """Refuse bounds out of range and a file that cannot be written (``parser.error``: exit 2
    with the reason), before the process touches anything else."""
    if not MIN_MAX_BYTES <= ns.log_max_bytes <= MAX_MAX_BYTES:
        parser.error(f"--log-max-bytes {ns.log_max_bytes}: {MIN_MAX_BYTES} to {MAX_MAX_BYTES}")
    if not MIN_BACKUPS <= ns.log_backups <= MAX_BACKUPS:
        parser.error(f"--log-backups {ns.log_backups}: {MIN_BACKUPS} to {MAX_BACKUPS}")
    if ns.log_file:
        folder = os.path.dirname(os.path.abspath(ns.log_file))
        if not os.path.isdir(folder) or not os.access(folder, os.W_OK):
            parser.error(f"--log-file {ns.log_file}: {folder} is not a writable directory")


def setup_server_logging(ns: argparse.Namespace) -> logging.Handler:
    """The root logger at ``ns.log_level`` writing where ``ns`` says; the handler."""
    handler: logging.Handler
    if ns.log_file:
        handler = logging.handlers.RotatingFileHandler(
            ns.log_file, maxBytes=ns.log_max_bytes, backupCount=ns.log_backups, encoding="utf-8"
        )
    else:
        handler = logging.StreamHandler()
    fmt = JsonFormatter() if ns.log_format == "json" else logging.Formatter(TEXT_FORMAT)
    handler.setFormatter(fmt)
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    level = logging.getLevelName(str(ns.log_level).upper())
    root.setLevel(level if isinstance(level, int) else logging.INFO)  # unknown: INFO
    return handler
