"""``mqnamesrv -c FILE``: a properties file with strict keys, like broker.conf."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from dledger.properties import int_in, parse_port, parse_properties, parse_values, read_text
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


# key -> (parser, description)
KEYS: Mapping[str, tuple[Callable[[str], int], str]] = {
    "listenPort": (parse_port, f"gRPC port (default {DEFAULT_PORT})"),
    "brokerExpiredTime": (
        int_in(MIN_EXPIRED_TIME_MS, MAX_EXPIRED_TIME_MS),
        f"ms of silence after which a broker node is dropped (default "
        f"{DEFAULT_BROKER_EXPIRED_TIME_MS})",
    ),
    "scanNotActiveBrokerInterval": (
        int_in(MIN_SCAN_INTERVAL_MS, MAX_SCAN_INTERVAL_MS),
        f"ms between scans for silent nodes (default {DEFAULT_SCAN_INTERVAL_MS})",
    ),
}


def parse_config(text: str, path: str = "namesrv.conf") -> NameServerConfig:
    raw = parse_properties(text, path, KEYS, "mqnamesrv", ConfigError)
    values = parse_values(
        raw, {name: parse for name, (parse, _) in KEYS.items()}, path, ConfigError
    )
    return NameServerConfig(**values)


def load_config(path: str | os.PathLike[str]) -> NameServerConfig:
    return parse_config(read_text(path, ConfigError), str(path))
