"""``mqnamesrv -c FILE``: a properties file with strict keys, like broker.conf."""

from __future__ import annotations

import ipaddress
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from mqerrors import codes as E
from mqsecurity.errors import CertificateError
from mqsecurity.tls import TlsFiles, check_server_files, metrics_over_tls, tls_files_of
from nameserver.routes import (
    DEFAULT_BROKER_EXPIRED_TIME_MS,
    DEFAULT_SCAN_INTERVAL_MS,
    NameServerError,
)
from prockit.properties import (
    int_in,
    parse_bool,
    parse_optional_port,
    parse_port,
    parse_values,
    read_properties,
    read_text,
)
from prockit.rocketmq_keys import NAMESRV_KEYS

# RocketMQ's NameServer port.
DEFAULT_PORT = 9876
# The RocketMQ remoting port (docs/REMOTING.md) is off unless set: RocketMQ's 9876 is the gRPC
# port here, and a second NameServer on one machine must not collide on a default; mqcluster
# gives its NameServer 9877.
DEFAULT_REMOTING_PORT = 0
# RocketMQ binds the NameServer on every interface; a local group sets listenHost=127.0.0.1.
DEFAULT_LISTEN_HOST = "0.0.0.0"
_HOST_NAME = re.compile(r"[A-Za-z0-9]([A-Za-z0-9.-]{0,251}[A-Za-z0-9])?")
# A day of silence is the most we let a node keep its routes; 1 s the least (the scan period
# is the real resolution of expiry).
MAX_EXPIRED_TIME_MS = 24 * 3600 * 1000
MIN_EXPIRED_TIME_MS = 1000
# Scan no faster than every 100 ms (pointless load), no slower than hourly.
MIN_SCAN_INTERVAL_MS = 100
MAX_SCAN_INTERVAL_MS = 3600 * 1000


class ConfigError(NameServerError):
    """A configuration the NameServer refuses to start with."""

    code = E.CONFIG_ERROR


@dataclass(frozen=True, slots=True)
class NameServerConfig:
    listenPort: int = DEFAULT_PORT
    remotingListenPort: int = DEFAULT_REMOTING_PORT
    brokerExpiredTime: int = DEFAULT_BROKER_EXPIRED_TIME_MS
    scanNotActiveBrokerInterval: int = DEFAULT_SCAN_INTERVAL_MS
    listenHost: str = DEFAULT_LISTEN_HOST
    tlsEnable: bool = False
    tlsServerCertPath: str = ""
    tlsServerKeyPath: str = ""
    tlsServerTrustCertPath: str = ""
    brokerAuthenticationEnabled: bool = False
    metricsPort: int = 0
    # None: as tlsEnable (docs/METRICS.md).
    metricsTlsEnable: bool | None = None
    # RocketMQ's NameServer keys the file set that raftmq accepts and does not use.
    ignored_keys: tuple[str, ...] = ()

    @property
    def tls_files(self) -> TlsFiles | None:
        """The port's certificate, key and CA when tlsEnable, else None (plaintext)."""
        files = tls_files_of(
            self.tlsServerCertPath, self.tlsServerKeyPath, self.tlsServerTrustCertPath
        )
        return files if self.tlsEnable else None

    @property
    def metrics_tls_files(self) -> TlsFiles | None:
        """The certificate and key /metrics is served with (HTTPS), None for plain HTTP."""
        return self.tls_files if metrics_over_tls(self.tlsEnable, self.metricsTlsEnable) else None


def _parse_host(text: str) -> str:
    """An IP address or a host name to bind."""
    host = text.strip()
    try:
        return str(ipaddress.ip_address(host))
    except ValueError:
        pass
    if not _HOST_NAME.fullmatch(host):
        raise ValueError("is not an IP address or a host name")
    return host


def _parse_path(text: str) -> str:
    return os.path.expanduser(text.strip())


# key -> (parser, description)
KEYS: Mapping[str, tuple[Callable[[str], Any], str]] = {
    "listenPort": (parse_port, f"gRPC port (default {DEFAULT_PORT})"),
    "remotingListenPort": (
        parse_optional_port,
        "RocketMQ remoting port for 4.x clients (their namesrvAddr; docs/REMOTING.md), on "
        "listenHost, TLS with tlsEnable (default 0: not served)",
    ),
    "listenHost": (
        _parse_host,
        f"address to bind (default {DEFAULT_LISTEN_HOST}, every interface; 127.0.0.1: this "
        "machine only)",
    ),
    "brokerExpiredTime": (
        int_in(MIN_EXPIRED_TIME_MS, MAX_EXPIRED_TIME_MS),
        f"ms of silence after which a broker node is dropped (default "
        f"{DEFAULT_BROKER_EXPIRED_TIME_MS})",
    ),
    "scanNotActiveBrokerInterval": (
        int_in(MIN_SCAN_INTERVAL_MS, MAX_SCAN_INTERVAL_MS),
        f"ms between scans for silent nodes (default {DEFAULT_SCAN_INTERVAL_MS})",
    ),
    "metricsPort": (
        parse_optional_port,
        "HTTP port of /metrics (Prometheus text format) on listenHost, read-only and "
        "unauthenticated (default 0: not served)",
    ),
    "metricsTlsEnable": (
        parse_bool,
        "serve /metrics over HTTPS with tlsServerCertPath, no client certificate asked "
        "(default: as tlsEnable; true needs tlsEnable)",
    ),
    "tlsEnable": (parse_bool, "serve TLS only (default false)"),
    "tlsServerCertPath": (_parse_path, "the NameServer's certificate (PEM), with tlsEnable"),
    "tlsServerKeyPath": (_parse_path, "its private key (PEM, 0600)"),
    "tlsServerTrustCertPath": (
        _parse_path,
        "CA (PEM) that issues the brokers' member certificates (brokerAuthenticationEnabled)",
    ),
    "brokerAuthenticationEnabled": (
        parse_bool,
        "only a group's members may RegisterBroker/UnregisterBroker it: calls signed with a "
        "member certificate of tlsServerTrustCertPath's CA (default false)",
    ),
}


# RocketMQ's NameServer keys raftmq does not use (NamesrvConfig's and the Netty configs'):
# accepted with one warning naming them (ignored_keys_warning). bindAddress is not one of them:
# it is RocketMQ's name for listenHost, and read as such.
ROCKETMQ_ONLY_KEYS = NAMESRV_KEYS - frozenset(KEYS) - {"bindAddress"}
# RocketMQ's key (NettyServerConfig) for what raftmq calls listenHost.
_BIND_ALIAS = "bindAddress"


def ignored_keys_warning(cfg: NameServerConfig, path: str) -> str | None:
    """The one warning line naming the RocketMQ keys the file set and raftmq ignores."""
    if not cfg.ignored_keys:
        return None
    return (
        f"{path}: ignoring {len(cfg.ignored_keys)} RocketMQ NameServer key(s) raftmq does not "
        f"use: {', '.join(cfg.ignored_keys)} (docs/NAMESERVER.md lists them)"
    )


def parse_config(text: str, path: str = "namesrv.conf") -> NameServerConfig:
    props = read_properties(
        text, path, [*KEYS, _BIND_ALIAS], "mqnamesrv", ConfigError, ROCKETMQ_ONLY_KEYS
    )
    raw = dict(props.values)
    if _BIND_ALIAS in raw:
        if "listenHost" in raw:
            raise ConfigError(
                f"{path}: keys 'bindAddress' and 'listenHost' name the same address (RocketMQ's "
                "name and raftmq's): keep one"
            )
        raw["listenHost"] = raw.pop(_BIND_ALIAS)
    values = parse_values(
        raw, {name: parse for name, (parse, _) in KEYS.items()}, path, ConfigError
    )
    cfg = NameServerConfig(**values, ignored_keys=tuple(props.ignored))
    if cfg.metricsPort and cfg.metricsPort == cfg.listenPort:
        raise ConfigError(f"{path}: key 'metricsPort': {cfg.metricsPort} is the listenPort")
    remoting = cfg.remotingListenPort
    if remoting and remoting in {cfg.listenPort, cfg.metricsPort}:
        raise ConfigError(f"{path}: key 'remotingListenPort': {remoting} is already used")
    _check_security(cfg, path)
    return cfg


def _check_security(cfg: NameServerConfig, path: str) -> None:
    """The TLS and authentication keys agree and their files are sound (one line naming the
    key otherwise, before the NameServer starts)."""
    if cfg.tlsEnable:
        for name in ("tlsServerCertPath", "tlsServerKeyPath"):
            if not getattr(cfg, name):
                raise ConfigError(f"{path}: key '{name}' is required with tlsEnable=true")
        try:
            check_server_files(
                TlsFiles(cfg.tlsServerCertPath, cfg.tlsServerKeyPath, None),
            )
        except CertificateError as exc:
            raise ConfigError(f"{path}: {exc}") from None
    if cfg.metricsTlsEnable and not cfg.tlsEnable:
        raise ConfigError(f"{path}: key 'metricsTlsEnable' needs tlsEnable=true")
    if cfg.brokerAuthenticationEnabled and not cfg.tlsServerTrustCertPath:
        raise ConfigError(
            f"{path}: key 'tlsServerTrustCertPath' is required with brokerAuthenticationEnabled"
        )


def load_config(path: str | os.PathLike[str]) -> NameServerConfig:
    return parse_config(read_text(path, ConfigError), str(path))
