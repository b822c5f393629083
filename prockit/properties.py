"""Strict Java properties files: RocketMQ's format for ``broker.conf`` and the NameServer's
config. Generic (no key of either server is known here): each server passes its key table and
its own ``ConfigError`` class, and every refusal is one line naming the file and the key.

- a key set twice, a malformed file, an unknown key, a value its parser refuses: refused;
- comments and blank lines are skipped;
- values are parsed by the caller's parsers, which raise ``ValueError`` with the reason
  ("is not an integer"), quoted after the key and the value.
"""

from __future__ import annotations

import io
import os
from collections.abc import Callable, Collection, Mapping
from pathlib import Path
from typing import Any

import javaproperties

# What a server passes as its error type: its ConfigError class (called with the message).
ErrorType = Callable[[str], Exception]


def read_text(path: str | os.PathLike[str], error: ErrorType) -> str:
    """The UTF-8 text of a config file; unreadable or not UTF-8: ``error``."""
    try:
        return Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise error(f"{path}: cannot read: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise error(f"{path}: not UTF-8 text") from None


def parse_properties(
    text: str, path: str, known: Collection[str], tool: str, error: ErrorType
) -> dict[str, str]:
    """The key/value pairs of a properties text, each key once and every key in ``known``
    (``tool``: the program whose ``--help`` lists the keys, named in the refusal)."""
    raw: dict[str, str] = {}
    try:
        for item in javaproperties.parse(io.StringIO(text)):
            if not isinstance(item, javaproperties.KeyValue):
                continue  # comments and blank lines
            if item.key in raw:
                raise error(f"{path}: key '{item.key}' is set twice")
            raw[item.key] = item.value
    except (ValueError, javaproperties.InvalidUEscapeError) as exc:
        raise error(f"{path}: not a properties file: {exc}") from None
    unknown = sorted(set(raw) - set(known))
    if unknown:
        raise error(f"{path}: unknown key '{unknown[0]}' ({tool} --help lists the keys)")
    return raw


def parse_values(
    raw: Mapping[str, str],
    parsers: Mapping[str, Callable[[str], Any]],
    path: str,
    error: ErrorType,
) -> dict[str, Any]:
    """Each value of ``raw`` through its key's parser; a ``ValueError`` becomes ``error``
    naming the file, the key, the value and the reason."""
    values: dict[str, Any] = {}
    for name, text in raw.items():
        try:
            values[name] = parsers[name](text)
        except ValueError as exc:
            raise error(f"{path}: key '{name}': {text!r} {exc}") from None
    return values


def int_in(low: int, high: int) -> Callable[[str], int]:
    """A parser of a decimal integer in ``[low, high]``."""

    def parse(text: str) -> int:
        try:
            value = int(text.strip())
        except ValueError:
            raise ValueError("is not an integer") from None
        if not low <= value <= high:
            raise ValueError(f"is out of range [{low}, {high}]")
        return value

    return parse


# A TCP port as a config value.
parse_port = int_in(1, 65535)
# A port, or 0: the service it names is off (grpcServerPort, metricsPort, ...).
parse_optional_port = int_in(0, 65535)


def parse_bool(text: str) -> bool:
    """``true``/``false`` (also ``1``/``0``, ``yes``/``no``), any case."""
    low = text.strip().lower()
    if low in ("true", "1", "yes"):
        return True
    if low in ("false", "0", "no"):
        return False
    raise ValueError("is not a boolean (true/false)")
