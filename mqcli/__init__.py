"""Command lines typed the way RocketMQ users type them: with subcommands, where an option of
the tool as a whole (``--base-dir``, ``-n``) may stand before the subcommand or after it.

    mqcluster --base-dir DIR up      and      mqcluster up --base-dir DIR

argparse alone accepts only the first. :class:`CommandLine` adds each global option to the
main parser with its real default and again to every subcommand with no default at all
(``argparse.SUPPRESS``), so that a subcommand sets the value only when the option is typed
after it and otherwise leaves the main parser's value alone. When the option is typed on both
sides, the one after the subcommand wins (it is read last).

A neutral package: every tool (``client`` included, which imports nothing of the servers)
may import it; it imports nothing of the project.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from mqcli.logs import add_log_arguments

__all__ = ["CommandLine", "GlobalOption", "parse_assignments", "server_parser"]


@dataclass(frozen=True, slots=True)
class GlobalOption:
    """One option of the whole tool: ``add_argument``'s flags and keyword arguments."""

    flags: tuple[str, ...]
    kwargs: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, *flags: str, **kwargs: Any) -> GlobalOption:
        if kwargs.get("required"):
            # A required option typed only after the subcommand would fail the main parser.
            raise ValueError(f"global option {flags[0]} cannot be required")
        return cls(tuple(flags), dict(kwargs))


class CommandLine:
    """A parser with subcommands whose global options are accepted on either side."""

    def __init__(
        self,
        parser: argparse.ArgumentParser,
        options: Sequence[GlobalOption],
        **subparsers_kwargs: Any,
    ) -> None:
        self.parser = parser
        self.options = tuple(options)
        for opt in self.options:
            parser.add_argument(*opt.flags, **opt.kwargs)
        self._sub = parser.add_subparsers(**subparsers_kwargs)

    def add(self, name: str, **kwargs: Any) -> argparse.ArgumentParser:
        """A subcommand (``add_parser``'s keyword arguments) with every global option."""
        p: argparse.ArgumentParser = self._sub.add_parser(name, **kwargs)
        for opt in self.options:
            p.add_argument(*opt.flags, **{**opt.kwargs, "default": argparse.SUPPRESS})
        return p

    def parse_args(self, argv: Sequence[str] | None = None) -> argparse.Namespace:
        return self.parser.parse_args(argv)


def parse_assignments(items: Sequence[str], flag: str = "--set") -> dict[str, str]:
    """``KEY=VALUE`` items (a repeated ``--set``) as a dict, later ones winning; an item
    without ``=``: ``ValueError`` naming it (the caller's ``parser.error``)."""
    out: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"{flag} {item!r}: expected KEY=VALUE")
        out[key] = value
    return out


def server_parser(
    prog: str, description: str, keys_title: str, keys: dict[str, str]
) -> argparse.ArgumentParser:
    """The parser of a foreground server (mqbroker, mqnamesrv): its config file keys listed
    under ``--help`` (``keys``: name -> description), ``--log-level`` and where the log goes
    (:mod:`mqcli.logs`)."""
    width = max(len(k) for k in keys)
    parser = argparse.ArgumentParser(
        prog=prog,
        description=description,
        epilog=f"{keys_title}:\n" + "\n".join(f"  {k:<{width}}  {d}" for k, d in keys.items()),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--log-level", default="INFO", help="DEBUG, INFO, WARNING (default INFO)")
    add_log_arguments(parser)
    return parser
