"""``host:port`` addresses as users type them (``-n``, ``NAMESRV_ADDR``, ``namesrvAddr``,
``-b``): one reading for every tool, client and server.

A NameServer address without a port takes RocketMQ's NameServer port, 9876 (``-n 127.0.0.1``
means ``127.0.0.1:9876``, as in RocketMQ); gRPC would otherwise dial port 443. A broker address
has no such default (its client port is whatever its broker.conf says), so one without a port
is refused with a message saying so. IPv6 addresses are written in brackets (``[::1]:9876``).
"""

from __future__ import annotations

# RocketMQ's NameServer port, taken by a NameServer address written without one.
DEFAULT_NAMESRV_PORT = 9876
# Longest address accepted (a DNS name is at most 253 characters, then ":65535"): a longer
# one is a pasted mistake, refused before it reaches an error message in full.
MAX_ADDR_CHARS = 300
# How much of a refused address an error message quotes.
QUOTED_CHARS = 80


def _quoted(addr: str) -> str:
    return repr(addr if len(addr) <= QUOTED_CHARS else addr[:QUOTED_CHARS] + "...")


def _port(text: str, addr: str) -> int:
    if not text.isdigit() or not 1 <= int(text) <= 65535:
        raise ValueError(f"address {_quoted(addr)}: port {text[:10]!r} is not 1 to 65535")
    return int(text)


def host_port(addr: str, what: str, default_port: int | None = None) -> str:
    """``addr`` as ``host:port`` (spaces stripped); without a port: ``default_port``, or a
    ``ValueError`` that names ``what`` (e.g. "broker") and says to add one."""
    text = addr.strip()
    if not text:
        raise ValueError(f"{what} address is empty")
    if len(text) > MAX_ADDR_CHARS:
        raise ValueError(f"{what} address {_quoted(text)} is longer than {MAX_ADDR_CHARS} chars")
    if "://" in text or "/" in text:
        raise ValueError(
            f"{what} address {_quoted(text)}: write host:port, without a scheme or path"
        )
    if text.startswith("["):  # [v6] or [v6]:port
        host, bracket, rest = text.partition("]")
        if not bracket or len(host) < 2 or (rest and not rest.startswith(":")):
            raise ValueError(f"{what} address {_quoted(text)} is not [IPv6]:port")
        host, port_text = host + "]", rest[1:]
    elif text.count(":") > 1:
        raise ValueError(
            f"{what} address {_quoted(text)}: write an IPv6 address in brackets, e.g. "
            f"[::1]:{default_port or 10911}"
        )
    else:
        host, _, port_text = text.partition(":")
        if not host:
            raise ValueError(f"{what} address {_quoted(text)} has no host")
    if port_text or text.endswith(":"):
        return f"{host}:{_port(port_text, text)}"
    if default_port is None:
        raise ValueError(
            f"{what} address {_quoted(text)} has no port: write host:port (e.g. {host}:10911, "
            "the listenPort of its broker.conf)"
        )
    return f"{host}:{default_port}"


def namesrv_addrs(text: str) -> list[str]:
    """A NameServer list ``host[:port];host[:port]...`` as ``host:port`` entries (9876 where
    none is given), in order, blanks dropped; ``ValueError`` for an empty list or a bad entry."""
    addrs = [host_port(a, "NameServer", DEFAULT_NAMESRV_PORT) for a in text.split(";") if a.strip()]
    if not addrs:
        raise ValueError("the NameServer address list is empty (host:port;host:port...)")
    return addrs


def broker_addr(text: str) -> str:
    """A broker node's client address: ``host:port``, a port required."""
    return host_port(text, "broker")
