"""``mqnamesrv -c FILE``: a properties file with strict keys, like broker.conf."""

from __future__ import annotations

import io
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import javaproperties

from nameserver.routes import (
    DEFAULT_BROKER_EXPIRED_TIME_MS,
    DEFAULT_SCAN_INTERVAL_MS,
    NameServerError,
)

# RocketMQ's NameServer port.
DEFAULT_PORT = 9876
# A day of silence is the most we let a node keep its routes; 1 s the least (the scan period
# is the real resolution of expiry).
MAX_EXPIRED_TIME_MS = 24 * 3600 * 1000
MIN_EXPIRED_TIME_MS = 1000
# Scan no faster than every 100 ms (pointless load), no slower than hourly.
MIN_SCAN_INTERVAL_MS = 100
MAX_SCAN_INTERVAL_MS = 3600 * 1000


class ConfigError(NameServerError):
    """A configuration the NameServer refuses to start with."""

    code = "CONFIG_ERROR"


@dataclass(frozen=True, slots=True)
class NameServerConfig:
    listenPort: int = DEFAULT_PORT
    brokerExpiredTime: int = DEFAULT_BROKER_EXPIRED_TIME_MS
    scanNotActiveBrokerInterval: int = DEFAULT_SCAN_INTERVAL_MS


def _int(low: int, high: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text.strip())
        except ValueError:
            raise ValueError("is not an integer") from None
        if not low <= value <= high:
            raise ValueError(f"is out of range [{low}, {high}]")
        return value

    return parse


# key -> (parser, description)
KEYS: Mapping[str, tuple[Callable[[str], int], str]] = {
    "listenPort": (_int(1, 65535), f"gRPC port (default {DEFAULT_PORT})"),
    "brokerExpiredTime": (
        _int(MIN_EXPIRED_TIME_MS, MAX_EXPIRED_TIME_MS),
        f"ms of silence after which a broker node is dropped (default "
        f"{DEFAULT_BROKER_EXPIRED_TIME_MS})",
    ),
    "scanNotActiveBrokerInterval": (
        _int(MIN_SCAN_INTERVAL_MS, MAX_SCAN_INTERVAL_MS),
        f"ms between scans for silent nodes (default {DEFAULT_SCAN_INTERVAL_MS})",
    ),
}


def parse_config(text: str, path: str = "namesrv.conf") -> NameServerConfig:
    raw: dict[str, str] = {}
    try:
        for item in javaproperties.parse(io.StringIO(text)):
            if not isinstance(item, javaproperties.KeyValue):
                continue
            if item.key in raw:
                raise ConfigError(f"{path}: key '{item.key}' is set twice")
            raw[item.key] = item.value
    except (ValueError, javaproperties.InvalidUEscapeError) as exc:
        raise ConfigError(f"{path}: not a properties file: {exc}") from None
    unknown = sorted(set(raw) - set(KEYS))
    if unknown:
        raise ConfigError(f"{path}: unknown key '{unknown[0]}' (mqnamesrv --help lists the keys)")
    values: dict[str, int] = {}
    for name, text_value in raw.items():
        parse, _ = KEYS[name]
        try:
            values[name] = parse(text_value)
        except ValueError as exc:
            raise ConfigError(f"{path}: key '{name}': {text_value!r} {exc}") from None
    return NameServerConfig(**values)


def load_config(path: str | os.PathLike[str]) -> NameServerConfig:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: not UTF-8 text") from None
    return parse_config(text, str(path))
