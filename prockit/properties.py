"""Strict Java properties files: RocketMQ's format for ``broker.conf`` and the NameServer's
config. Generic (no key of either server is known here): each server passes its key table and
its own ``ConfigError`` class, and every refusal is one line naming the file and the key.

- a key set twice, a malformed file, a value its parser refuses: refused;
- keys nobody knows (neither the server's nor RocketMQ's): refused all at once, in one message,
  each with the close matches among the known names (``difflib``);
- RocketMQ's keys the server does not use (``foreign``): accepted, returned apart so the server
  can say, in one warning, that it ignores them;
- comments and blank lines are skipped;
- values are parsed by the caller's parsers, which raise ``ValueError`` with the reason
  ("is not an integer"), quoted after the key and the value.
"""

from __future__ import annotations

import difflib
import io
import os
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
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


# An unknown-key refusal names at most this many keys (a file of junk gives one readable line,
# not a screenful); the rest are counted.
MAX_UNKNOWN_KEYS_NAMED = 20
# How alike a key must be to a known name to be suggested (difflib's ratio: 0.8 catches one
# wrong, missing or extra letter in a ten-letter key, and not unrelated keys sharing a word).
SUGGEST_CUTOFF = 0.8
# An unknown key is quoted up to this many characters (a pasted blob stays one short line), and
# only a key up to this long is compared with the known names (none is longer than 60).
MAX_KEY_CHARS_QUOTED = 80
# Suggestions per unknown key, and how far below the best one's ratio another may be (so a
# clear best match is shown alone: 'sendMessageThreadPoolNum' suggests only '...Nums').
MAX_SUGGESTIONS = 3
SUGGEST_TIE_RATIO = 0.02


@dataclass(frozen=True, slots=True)
class Properties:
    """A properties file split by who knows its keys: ``values`` of the server's own keys,
    ``ignored``: those of RocketMQ's keys it does not use (in key order)."""

    values: dict[str, str]
    ignored: dict[str, str]


def suggestions(name: str, own: Collection[str], foreign: Collection[str] = ()) -> list[str]:
    """The known names ``name`` may be a typo of: a name differing only in case first, then
    close matches among the server's own keys, then among RocketMQ's (``foreign``)."""
    lowered = name.lower()
    same_case = sorted(k for k in (*own, *foreign) if k.lower() == lowered)
    if same_case:
        return same_case[:MAX_SUGGESTIONS]
    for names in (own, foreign):
        close = difflib.get_close_matches(name, list(names), MAX_SUGGESTIONS, SUGGEST_CUTOFF)
        if close:
            best = _ratio(name, close[0])
            return [c for c in close if _ratio(name, c) >= best - SUGGEST_TIE_RATIO]
    return []


def _ratio(a: str, b: str) -> float:
    return difflib.SequenceMatcher(None, a, b).ratio()


def unknown_keys_message(
    path: str, unknown: Collection[str], own: Collection[str], foreign: Collection[str], tool: str
) -> str:
    """One line naming every unknown key (up to MAX_UNKNOWN_KEYS_NAMED) with its suggestions."""
    names = sorted(unknown)
    parts = []
    for name in names[:MAX_UNKNOWN_KEYS_NAMED]:
        long = len(name) > MAX_KEY_CHARS_QUOTED
        close = [] if long else suggestions(name, own, foreign)
        hint = "did you mean " + " or ".join(f"'{c}'" for c in close) + "?" if close else ""
        quoted = f"'{name[:MAX_KEY_CHARS_QUOTED]}...'" if long else f"'{name}'"
        parts.append(f"{quoted} ({hint})" if hint else quoted)
    if len(names) > MAX_UNKNOWN_KEYS_NAMED:
        parts.append(f"and {len(names) - MAX_UNKNOWN_KEYS_NAMED} more")
    noun = "unknown key" if len(names) == 1 else f"{len(names)} unknown keys"
    known = f"{tool} --help lists the keys"
    if foreign:
        known += "; RocketMQ's other keys are accepted and ignored"
    return f"{path}: {noun} {', '.join(parts)} ({known})"


def read_properties(
    text: str,
    path: str,
    known: Collection[str],
    tool: str,
    error: ErrorType,
    foreign: Collection[str] = (),
) -> Properties:
    """The key/value pairs of a properties text, each key once, split into the server's
    (``known``) and RocketMQ's keys it does not use (``foreign``); any other key is refused,
    all of them in one ``error`` (``tool``: the program whose ``--help`` lists the keys)."""
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
    own, others = frozenset(known), frozenset(foreign) - frozenset(known)
    unknown = set(raw) - own - others
    if unknown:
        raise error(unknown_keys_message(path, unknown, own, others, tool))
    return Properties(
        values={k: v for k, v in raw.items() if k in own},
        ignored={k: raw[k] for k in sorted(raw) if k in others},
    )


def parse_properties(
    text: str, path: str, known: Collection[str], tool: str, error: ErrorType
) -> dict[str, str]:
    """The key/value pairs of a properties text, each key once and every key in ``known``."""
    return read_properties(text, path, known, tool, error).values


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
