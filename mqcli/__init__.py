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

__all__ = ["CommandLine", "GlobalOption"]


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
