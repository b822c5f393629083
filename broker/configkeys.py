"""The table of ``broker.conf`` keys: each key written once, with its parser (bounds with
their reasons), its default, its one-line doc, and the setting it becomes.

:mod:`broker.config` parses a file with it and builds the node's and the service's configs from
it; :mod:`broker.configdocs` generates docs/CONFIG.md's key table from it. A key whose value
goes to a field of one of those configs takes that field's default (``INHERITED``), so a
default is written once, on the dataclass that uses it.
"""

from __future__ import annotations

import dataclasses
import decimal
import ipaddress
import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any

from broker.components import disk
from broker.components.locks import MAX_CONSUMERS, MAX_LOCKS
from broker.components.offsets import MAX_PENDING_OFFSETS
from broker.components.pop import MAX_POP_WAITERS
from broker.components.producers import MAX_PRODUCERS
from broker.components.pulling import MAX_LONG_POLLS
from broker.components.settings import ServiceConfig
from broker.frontends.v2.clients import DEFAULT_MAX_CLIENTS_PER_USER, MAX_CLIENTS
from broker.frontends.v2.renewals import DEFAULT_MAX_MS, DEFAULT_SLICE_MS
from broker.state.delayrules import DEFAULT_DELAY_LEVELS, parse_delay_levels
from broker.state.derived import DEFAULT_SCRUB_RECORDS_PER_SECOND
from broker.state.records import MAX_OFFSET_GROUPS, MAX_TOPICS
from broker.state.subgroups import MAX_SUBGROUPS
from broker.state.timerrules import DEFAULT_TIMER_MAX_DELAY_S, MAX_TIMER_MAX_DELAY_S
from dledger.server.chaincheck import (
    MAX_CHAIN_CHECK_INTERVAL_MS,
    MIN_CHAIN_CHECK_INTERVAL_MS,
)
from dledger.server.node import RETENTION_CHECK_INTERVAL_S, NodeConfig
from dledger.server.scrub import (
    MAX_SCRUB_BYTES_PER_S,
    MAX_SCRUB_PASS_INTERVAL_S,
    MIN_SCRUB_BYTES_PER_S,
    MIN_SCRUB_PASS_INTERVAL_S,
)
from dledger.server.snapshots import (
    MAX_SNAPSHOT_BYTES_PER_S,
    MIN_SNAPSHOT_BYTES_PER_S,
)
from dledger.storage import FlushDiskType, StoreConfig
from dledger.storage.retention import MAX_EARLY_USED_PERCENT, MIN_EARLY_USED_PERCENT
from mqcli.addrs import namesrv_addrs
from mqsecurity import SecurityError
from mqsecurity.credentials import Credentials
from mqsecurity.signing import DEFAULT_MAX_SKEW_MS
from prockit.livekeys import LIVE_BROKER_KEYS
from prockit.properties import (
    int_in,
    parse_bool,
    parse_optional_port,
    parse_port,
)


@dataclass(frozen=True, slots=True)
class Peer:
    node_id: str
    host: str
    port: int

    @property
    def addr(self) -> str:
        return f"{self.host}:{self.port}"


_parse_bool = parse_bool  # shared with the NameServer's config


class IntIn:
    """A parser of a decimal integer in ``[low, high]`` whose bounds can be read back (the
    tests check every key's bounds and the docs quote them). With ``off`` set, 0 is also
    accepted and turns ``off`` (e.g. "the scrubber") off, and the error for a value between 0
    and ``low`` says so."""

    __slots__ = ("high", "low", "off")

    def __init__(self, low: int, high: int, off: str = "") -> None:
        assert 0 <= low <= high or (not off and low <= high), (low, high, off)
        self.low, self.high, self.off = low, high, off

    def __call__(self, text: str) -> int:
        value = int_in(0 if self.off else self.low, self.high)(text)
        if self.off and 0 < value < self.low:
            raise ValueError(f"is below {self.low} (0 turns {self.off} off)")
        return value

    def __repr__(self) -> str:
        off = f", or 0: {self.off} off" if self.off else ""
        return f"{self.low} to {self.high}{off}"


class PercentOrFraction(IntIn):
    """RocketMQ's disk ratios: a whole percent ``90`` (the field of RocketMQ 5's
    MessageStoreConfig) or a fraction ``0.90`` (RocketMQ's ``-Drocketmq.broker...`` property
    and RocketMQ 4's unit), both read as the percent 90, in ``[low, high]``."""

    __slots__ = ()

    def __call__(self, text: str) -> int:
        value = text.strip()
        if "." in value:
            try:
                fraction = decimal.Decimal(value)
            except decimal.InvalidOperation:
                raise ValueError("is not a number") from None
            if not 0 < fraction < 1:
                raise ValueError("as a fraction is not between 0 and 1 (0.90 or 90: 90 %)")
            percent = fraction * 100
            if percent != percent.to_integral_value():
                raise ValueError("is not a whole percent (0.90 or 90: 90 %)")
            value = str(int(percent))
        return super().__call__(value)

    def __repr__(self) -> str:
        return f"{self.low} to {self.high} %, or 0.{self.low:02d} to 0.{self.high:02d}"


def _parse_str(text: str) -> str:
    value = text.strip()
    if not value:
        raise ValueError("is empty")
    return value


def _parse_optional_str(text: str) -> str:
    return text.strip()


def parse_optional_bool(text: str) -> bool | None:
    """A boolean, or None for an empty value (the key then follows another one)."""
    return parse_bool(text) if text.strip() else None


# Index file sizes: a multiple of this (every page size Linux uses divides it, and so does
# the 32-byte index record), up to 1 GiB (32 Mi entries per file).
INDEX_FILE_UNIT_BYTES = 64 * 1024
MAX_INDEX_FILE_BYTES = 1 << 30


def _parse_index_file_size(text: str) -> int:
    value = int_in(INDEX_FILE_UNIT_BYTES, MAX_INDEX_FILE_BYTES)(text)
    if value % INDEX_FILE_UNIT_BYTES:
        raise ValueError(f"is not a multiple of {INDEX_FILE_UNIT_BYTES}")
    return value


def _parse_namesrv_addr(text: str) -> str:
    """``a:9876;b:9876`` (empty: no NameServer); normalized to ``;`` without spaces. An entry
    without a port is at RocketMQ's NameServer port, 9876 (mqcli.addrs)."""
    addrs = namesrv_addrs(text) if text.strip() else []
    if len(set(addrs)) != len(addrs):
        raise ValueError(f"repeats an address: {addrs}")
    return ";".join(addrs)


def _parse_delay_levels(text: str) -> str:
    """RocketMQ's ``messageDelayLevel``: ``1s 5s 10s 30s 1m ...`` (s, m, h, d units)."""
    parse_delay_levels(text)
    return " ".join(text.split())


def _parse_scale(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{text!r} is not a number") from None
    if not 1e-6 <= value <= 1000:
        raise ValueError(f"{value} is outside [0.000001, 1000]")
    return value


# A DNS host name (RFC 1123 labels, at most 253 characters).
_HOST_NAME = re.compile(r"[A-Za-z0-9]([A-Za-z0-9.-]{0,251}[A-Za-z0-9])?")
# Addresses that mean "every interface" to bind(), and nothing to a peer or a client dialling
# them: a node that advertised one would be unreachable (or reach the dialler's own machine).
UNSPECIFIED_HOSTS = frozenset({"0.0.0.0", "::", "[::]", "*", ""})


def is_unspecified_host(host: str) -> bool:
    """True for a host a node may bind but never advertise (0.0.0.0, ::)."""
    text = host.strip()
    if text in UNSPECIFIED_HOSTS:
        return True
    try:
        return ipaddress.ip_address(text.strip("[]")).is_unspecified
    except ValueError:
        return False


def _parse_advertised_host(text: str) -> str:
    """The IPv4 address clients and NameServers dial: RocketMQ's offsetMsgId embeds it (4
    bytes), so neither a name nor IPv6; and not 0.0.0.0, which names no machine."""
    host = _parse_str(text)
    try:
        address = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        raise ValueError(
            "is not an IPv4 address (message ids embed it, as RocketMQ's do)"
        ) from None
    if address.is_unspecified:
        raise ValueError(
            "is an every-interface address: it can be bound (bindAddress), not advertised; "
            "give the address clients and peers reach this node by"
        )
    if address.version != 4:
        raise ValueError("is not an IPv4 address (message ids embed it, as RocketMQ's do)")
    return str(address)


def _parse_bind_host(text: str) -> str:
    """Empty (bind the advertised brokerIP1), an IP address (0.0.0.0 and :: included) or a
    host name."""
    host = text.strip()
    if not host:
        return ""
    try:
        return str(ipaddress.ip_address(host.strip("[]")))
    except ValueError:
        pass
    if not _HOST_NAME.fullmatch(host):
        raise ValueError("is not an IP address or a host name")
    return host


def _parse_advertised_addr(text: str) -> str:
    """``host:port`` or empty (advertise the bound ``brokerIP1:listenPort``)."""
    addr = text.strip()
    if addr:
        host, colon, port_text = addr.rpartition(":")
        if not colon or not host:
            raise ValueError("is not host:port")
        parse_port(port_text)
    return addr


def parse_init_user(text: str) -> Credentials | None:
    """``{"username": "...", "password": "..."}`` (RocketMQ's initAuthenticationUser) or empty.
    A ValueError's message never holds the password."""
    if not text.strip():
        return None
    try:
        doc = json.loads(text)
    except ValueError:
        raise ValueError('is not JSON {"username": .., "password": ..}') from None
    if not isinstance(doc, dict) or set(doc) != {"username", "password"}:
        raise ValueError('must be JSON {"username": .., "password": ..}')
    try:
        return Credentials(str(doc["username"]), str(doc["password"]))
    except SecurityError as exc:
        raise ValueError(str(exc)) from None


def _parse_inner_credentials(text: str) -> Credentials | None:
    """``{"accessKey": "...", "secretKey": "..."}`` (RocketMQ 5.3's
    innerClientAuthenticationCredentials) or empty. A ValueError's message never holds the
    secret."""
    if not text.strip():
        return None
    try:
        doc = json.loads(text)
    except ValueError:
        raise ValueError('is not JSON {"accessKey": .., "secretKey": ..}') from None
    if not isinstance(doc, dict) or set(doc) != {"accessKey", "secretKey"}:
        raise ValueError('must be JSON {"accessKey": .., "secretKey": ..}')
    try:
        return Credentials(str(doc["accessKey"]), str(doc["secretKey"]))
    except SecurityError as exc:
        raise ValueError(str(exc)) from None


def _parse_flush(text: str) -> FlushDiskType:
    try:
        return FlushDiskType[text.strip()]
    except KeyError:
        raise ValueError("must be SYNC_FLUSH or ASYNC_FLUSH") from None


def _parse_delete_when(text: str) -> str:
    hours = [h.strip() for h in text.split(";") if h.strip()]
    if not hours or not all(h.isdigit() and 0 <= int(h) <= 23 for h in hours):
        raise ValueError("must be hours 00-23 separated by ';' (e.g. 04 or 04;05)")
    return ";".join(hours)


def parse_peers(text: str) -> tuple[Peer, ...]:
    """``n0-127.0.0.1:40911;n1-127.0.0.1:40912`` -> peers, in the order given."""
    peers: list[Peer] = []
    for item in (part.strip() for part in text.split(";")):
        if not item:
            continue
        node_id, sep, addr = item.partition("-")
        host, colon, port_text = addr.rpartition(":")
        if not sep or not colon or not node_id or not host:
            raise ValueError(f"entry {item!r} is not id-host:port")
        peers.append(Peer(node_id.strip(), host.strip(), parse_port(port_text)))
    if not peers:
        raise ValueError("lists no peers")
    ids = [p.node_id for p in peers]
    if len(set(ids)) != len(ids):
        raise ValueError(f"repeats a node id: {ids}")
    addrs = [p.addr for p in peers]
    if len(set(addrs)) != len(addrs):
        raise ValueError(f"repeats an address: {addrs}")
    return tuple(peers)


def _parse_peer_client_addrs(text: str) -> tuple[Peer, ...]:
    """``dLegerPeers``' format, or empty."""
    return parse_peers(text) if text.strip() else ()


# What each parser accepts, for the docs' key table (configdocs; IntIn says it itself).
_ACCEPTS: Mapping[Callable[[str], Any], str] = {
    parse_port: "a port, 1 to 65535",
    parse_optional_port: "a port, or 0: not served",
    _parse_bool: "true or false",
    parse_optional_bool: "true, false or empty",
    _parse_str: "text, not empty",
    _parse_optional_str: "text",
    _parse_index_file_size: f"{INDEX_FILE_UNIT_BYTES} to {MAX_INDEX_FILE_BYTES}, "
    f"a multiple of {INDEX_FILE_UNIT_BYTES}",
    _parse_namesrv_addr: "host[:port];... (distinct; no port: 9876), or empty",
    _parse_delay_levels: "durations with units s, m, h, d, separated by spaces",
    _parse_scale: "a number, 0.000001 to 1000",
    _parse_advertised_addr: "host:port, or empty",
    _parse_advertised_host: "an IPv4 address, not 0.0.0.0",
    _parse_bind_host: "an IP address (0.0.0.0, :: included) or host name, or empty",
    parse_init_user: 'JSON {"username": .., "password": ..}, or empty',
    _parse_inner_credentials: 'JSON {"accessKey": .., "secretKey": ..}, or empty',
    _parse_flush: "SYNC_FLUSH or ASYNC_FLUSH",
    _parse_delete_when: "hours 00 to 23 separated by ';'",
    parse_peers: "id-host:port;... (distinct ids and addresses)",
    _parse_peer_client_addrs: "id-host:port;..., or empty",
}


def accepted_values(key: _Key) -> str:
    """What ``key`` accepts, in words (the docs' key table)."""
    if isinstance(key.parse, IntIn):
        return repr(key.parse)
    return _ACCEPTS[key.parse]


# The configs a broker.conf is translated into (node_config, service_config, v2_settings):
# dledger's NodeConfig and its StoreConfig, the broker service's ServiceConfig, and the
# RocketMQ 5 front end's V2Config (broker.frontends.v2.service, imported only when that port is
# served).
TARGETS = ("node", "store", "service", "v2")
TARGET_TYPES: Mapping[str, type] = {
    "node": NodeConfig,
    "store": StoreConfig,
    "service": ServiceConfig,
}


@dataclass(frozen=True, slots=True)
class Into:
    """Where a key's parsed value goes: ``field`` of the ``target`` config, through
    ``convert`` when the two differ in unit or shape (ms -> s, peers -> an address map)."""

    target: str
    field: str
    convert: Callable[[Any], Any] | None = None

    def __post_init__(self) -> None:
        assert self.target in TARGETS, self.target

    def value_of(self, parsed: Any) -> Any:
        return parsed if self.convert is None else self.convert(parsed)


class _Inherited:
    """The sentinel default of a key whose default is its target field's (one default per
    setting: the dataclass that uses the value keeps it, the key takes it from there)."""

    def __repr__(self) -> str:
        return "INHERITED"


INHERITED = _Inherited()


@dataclass(frozen=True, slots=True)
class _Key:
    parse: Callable[[str], Any]
    default: str | _Inherited | None  # None: required; INHERITED: see _resolved
    doc: str
    to: tuple[Into, ...] = ()
    # True: UpdateBrokerConfig may change the key while the group runs (a replicated override,
    # docs/CONFIG.md "Live keys"): every reader of its value reads it at each use. False: the
    # value is read once at start (a table's size, a port, a file, a thread's pace...), so a
    # change needs a restart.
    live: bool = False


def _addresses(peers: tuple[Peer, ...]) -> dict[str, str]:
    """id-host:port list -> {id: host:port}"""
    return {p.node_id: p.addr for p in peers}


def _none_if_empty(text: str) -> str | None:
    """empty -> None"""
    return text or None


def _ms_to_s(ms: int) -> float:
    """ms -> s"""
    return ms / 1000


def _s_to_ms(seconds: int) -> int:
    """s -> ms"""
    return seconds * 1000


def _text_of(value: object) -> str:
    """A value as broker.conf writes it (the inverse of the key's parser)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, Enum):
        return value.name
    return str(value)


def _field_default(into: Into) -> object:
    """The default of the field ``into`` names (the dataclass keeps it, with its reason)."""
    target = TARGET_TYPES[into.target]
    (spec,) = (f for f in dataclasses.fields(target) if f.name == into.field)
    if spec.default_factory is not dataclasses.MISSING:
        return spec.default_factory()
    assert spec.default is not dataclasses.MISSING, f"{into} has no default to inherit"
    return spec.default


def _resolved(table: Mapping[str, _Key]) -> Mapping[str, _Key]:
    """The table with each INHERITED default replaced by the text of its first target
    field's default, so that a setting's default is written once."""
    out: dict[str, _Key] = {}
    for name, key in table.items():
        if key.default is INHERITED:
            (into, *_) = key.to
            assert into.convert is None, f"{name}: a converted default cannot be inherited"
            key = dataclasses.replace(key, default=_text_of(_field_default(into)))
        out[name] = key
    return out


@dataclass(frozen=True, slots=True)
class _Quota:
    """A per-user quota key (docs/SECURITY.md, "Quotas per user"): one user's share of a table
    the node (or the replicated state of the broker group) bounds at ``table_size``, so that one
    user's made-up names leave the rest to others. Super users are bounded by the table only.
    The bound is the table's size; the default, on the field the value goes to, is a tenth of it
    (tests/unit/test_config_table.py holds them to that)."""

    into: Into
    table_size: int
    doc: str
    default: str | _Inherited = INHERITED  # a v2 field's: V2Config is not a TARGET_TYPE
    live: bool = False  # the quota is read at each call (not when its table is built)

    def key(self) -> _Key:
        return _Key(
            IntIn(1, self.table_size), self.default, self.doc, to=(self.into,), live=self.live
        )


# The per-user quota keys, each with the table it shares out (its size is the bound).
QUOTAS: Mapping[str, _Quota] = {
    # Replicated subscription groups (broker.state.subgroups): Settings naming made-up groups.
    "subscriptionGroupsPerUser": _Quota(
        Into("service", "subgroups_per_user"),
        MAX_SUBGROUPS,
        "subscription groups one user may create in a broker group",
        live=True,
    ),
    # A node's waiting receives (POP long polls, broker.components.pop).
    "popWaitersPerUser": _Quota(
        Into("service", "pop_waiters_per_user"),
        MAX_POP_WAITERS,
        "receives of one user that may wait for messages on a node",
        live=True,
    ),
    # The client port's other tables (docs/BROKER.md, "Limits"): pulls held waiting
    # (broker.components.pulling), live consumers and queue locks (broker.components.locks), offsets
    # the leader buffers (broker.components.offsets).
    "longPollsPerUser": _Quota(
        Into("service", "long_polls_per_user"),
        MAX_LONG_POLLS,
        "pulls of one user that may be held waiting on a node",
    ),
    "consumersPerUser": _Quota(
        Into("service", "consumers_per_user"),
        MAX_CONSUMERS,
        "live consumers (group, client id) one user may register",
    ),
    "producersPerUser": _Quota(
        Into("service", "producers_per_user"),
        MAX_PRODUCERS,
        "live producers (group, client id) one user may register",
    ),
    "queueLocksPerUser": _Quota(
        Into("service", "queue_locks_per_user"),
        MAX_LOCKS,
        "queue locks one user's consumers may hold on a node",
    ),
    "pendingOffsetsPerUser": _Quota(
        Into("service", "pending_offsets_per_user"),
        MAX_PENDING_OFFSETS,
        "offsets of one user the leader buffers between flushes",
        live=True,
    ),
    # The replicated topic table (broker.state.records): CreateTopic and sends that auto-create a
    # topic count against the user who made them.
    "topicsPerUser": _Quota(
        Into("service", "topics_per_user"),
        MAX_TOPICS,
        "topics one user may create in a broker group",
        live=True,
    ),
    # The replicated consumer groups with offsets (broker.state.records): a commit giving a new
    # group offsets counts against it.
    "offsetGroupsPerUser": _Quota(
        Into("service", "offset_groups_per_user"),
        MAX_OFFSET_GROUPS,
        "consumer groups with offsets one user may create",
        live=True,
    ),
    # A node's table of RocketMQ 5 clients (broker.frontends.v2.clients): one user's made-up client
    # ids.
    "grpcClientsPerUser": _Quota(
        Into("v2", "clients_per_user"),
        MAX_CLIENTS,
        "RocketMQ 5 client records one user may hold on a node",
        default=str(DEFAULT_MAX_CLIENTS_PER_USER),
    ),
}


def _quota_keys() -> dict[str, _Key]:
    return {name: quota.key() for name, quota in QUOTAS.items()}


# The keys we accept, with RocketMQ's names where RocketMQ has the key: each written once with
# its parser (limits in it: IntIn's bounds), its default (INHERITED: the default of the field it
# goes to), its one-line doc, and where its value goes (``to``). Keys that go nowhere are read
# from BrokerConfig by the broker's own wiring; node_config and service_config add the values
# that several keys make together (TLS files, the delay levels, the store directory).
_TABLE: Mapping[str, _Key] = {
    "brokerClusterName": _Key(_parse_str, "DefaultCluster", "cluster this group belongs to"),
    "brokerName": _Key(
        _parse_str,
        "broker-a",
        "broker group name (one Raft group)",
        to=(Into("v2", "group"),),
    ),
    "enableDLegerCommitLog": _Key(_parse_bool, "true", "must be true: raftmq is DLedger-only"),
    "dLegerGroup": _Key(
        _parse_optional_str,
        "",
        "Raft group name (default: brokerName)",
        to=(Into("node", "group"),),
    ),
    "dLegerPeers": _Key(
        parse_peers,
        None,
        "id-host:port;... peer (Raft) addresses",
        to=(Into("node", "peers", _addresses),),
    ),
    "dLegerSelfId": _Key(
        _parse_str,
        None,
        "this node's id, one of dLegerPeers",
        to=(Into("node", "self_id"),),
    ),
    "dLegerPeerClientAddrs": _Key(
        _parse_peer_client_addrs,
        "",
        "id-host:port;... client addresses of the members, named in NOT_LEADER redirects "
        "(default: none, redirects name the leader's id only)",
        to=(Into("node", "peer_client_addrs", _addresses),),
    ),
    "dLegerJoinAddr": _Key(
        _parse_advertised_addr,
        INHERITED,
        "host:port (peer address) of a member of an existing group: a node started with "
        "an empty store asks it to be added as a learner (docs/CLUSTER.md); default: none",
        to=(Into("node", "join_addr"),),
    ),
    # The peer socket (docs/RAFT.md "Peer sockets"): the Raft message stream on a TCP port of
    # its own, bound on bindAddress like the peer port; mqcluster gives node i its peer
    # port + 100. A member without it (0, or an older release) is sent to over the gRPC stream.
    "dLegerPeerSocketPort": _Key(
        parse_optional_port,
        INHERITED,
        "TCP port of the peer socket (the Raft messages without gRPC; mutual TLS with "
        "tlsEnable); 0: not offered, peers send over the peer port's gRPC stream",
        to=(Into("node", "peer_socket_port"),),
    ),
    "dLegerPeerSocketEnable": _Key(
        _parse_bool,
        INHERITED,
        "offer dLegerPeerSocketPort and send to the peers' sockets; false: the gRPC stream only",
        to=(Into("node", "peer_socket_enable"),),
    ),
    "listenPort": _Key(
        parse_port,
        "10911",
        "client gRPC port",
        to=(
            Into("node", "client_port"),
            Into("service", "store_port"),
        ),
    ),
    # RocketMQ's proxy key: the port of the RocketMQ 5 protocol (docs/RMQ5.md); mqcluster gives
    # the first node 8081 (the proxy's default), the next ones the following ports.
    "grpcServerPort": _Key(
        parse_optional_port,
        "0",
        "apache.rocketmq.v2 (RocketMQ 5 clients) gRPC port; 0: not served",
        to=(Into("v2", "port"),),
    ),
    # RocketMQ's proxy key: the port of RocketMQ's remoting protocol for 4.x clients
    # (docs/REMOTING.md), registered with the NameServers so that their remoting routes name it;
    # mqcluster gives node i its client port + 1.
    "remotingListenPort": _Key(
        parse_optional_port,
        "0",
        "RocketMQ remoting port (4.x clients, docs/REMOTING.md), TLS with tlsEnable; 0: not served",
    ),
    # With tlsEnable the port above speaks TLS; RocketMQ's proxy keeps a plaintext port beside
    # its TLS one for old clients: this is that port, on 127.0.0.1 only (docs/RMQ5.md).
    "grpcServerPlaintextPort": _Key(
        IntIn(0, 65535),
        "0",
        "with tlsEnable and grpcServerPort: an extra plaintext RocketMQ 5 port on 127.0.0.1 "
        "(0: none; users and permissions apply on it too)",
    ),
    # Prometheus metrics over HTTP (docs/METRICS.md): read-only, unauthenticated, bound to
    # bindAddress like the client port; mqcluster gives node i 5557 + i (rocketmq-exporter's port).
    "metricsPort": _Key(
        parse_optional_port,
        "0",
        "HTTP port of /metrics (Prometheus text format); 0: not served",
    ),
    # HTTPS on that port with tlsServerCertPath (no client certificate asked); false keeps it
    # plain HTTP for a scraper that cannot do TLS (docs/METRICS.md).
    "metricsTlsEnable": _Key(
        parse_optional_bool,
        "",
        "serve /metrics over HTTPS with this node's certificate (default: as tlsEnable; true "
        "needs tlsEnable)",
    ),
    # RocketMQ's pair: brokerIP1 is what the node advertises (registered with NameServers,
    # named in routes and redirects), bindAddress (RocketMQ's NettyServerConfig key) what its
    # ports bind. RocketMQ binds 0.0.0.0 by default; we bind brokerIP1 unless told, so that a
    # node configured for one interface is not exposed on the others (docs/DEPLOY.md).
    "brokerIP1": _Key(
        _parse_advertised_host,
        "127.0.0.1",
        "IPv4 address clients, peers' redirects and NameServers are told to use (never "
        "0.0.0.0: bind every interface with bindAddress)",
        to=(
            Into("node", "client_host"),
            Into("service", "store_host"),
            Into("v2", "host"),
        ),
    ),
    "bindAddress": _Key(
        _parse_bind_host,
        INHERITED,
        "address the client, peer, grpcServerPort and metrics ports bind: 0.0.0.0 (every "
        "interface), :: or one interface's address (default: brokerIP1); the peer port takes "
        "its port from this node's dLegerPeers entry",
        to=(Into("node", "bind_host"),),
    ),
    "storePathRootDir": _Key(_parse_str, "~/store", "root of this node's files"),
    "dLegerPromisePath": _Key(
        _parse_optional_str,
        INHERITED,
        "this member's promise file (docs/RAFT.md section 11); default: "
        "{storePathRootDir}/dledger-{dLegerSelfId}.promise, beside the store directory",
        to=(Into("node", "promise_path"),),
    ),
    "flushDiskType": _Key(
        _parse_flush,
        INHERITED,
        "SYNC_FLUSH or ASYNC_FLUSH",
        to=(Into("store", "flush_disk_type"),),
    ),
    "flushIntervalCommitLog": _Key(
        IntIn(1, 60_000),
        INHERITED,
        "ASYNC_FLUSH period, ms",
        to=(Into("store", "flush_interval_ms"),),
    ),
    "mappedFileSizeCommitLog": _Key(
        IntIn(64 * 1024, 1 << 40),
        INHERITED,
        "commitlog segment size, bytes",
        to=(Into("store", "segment_size_bytes"),),
    ),
    # DLedger's mappedFileSizeForEntryIndex: each index file (64 bytes per entry, the chain
    # included) is allocated in full when it is created (files.py: no SIGBUS on a full disk),
    # so its size is disk taken at start; 32 MiB (512 Ki entries) by default, 64 KiB (1,024
    # entries) at least.
    "mappedFileSizeEntryIndex": _Key(
        _parse_index_file_size,
        INHERITED,
        "log index file size, bytes (a multiple of 64 KiB)",
        to=(Into("store", "index_segment_size_bytes"),),
    ),
    "namesrvAddr": _Key(
        _parse_namesrv_addr, "", "host:port;... of the NameServers (no port: 9876, as RocketMQ)"
    ),
    # RocketMQ's registerNameServerPeriod default (30 s); at least 100 ms (a NameServer call
    # per node per period), at most 10 minutes (NameServers drop nodes silent for 2 minutes).
    "registerBrokerPeriod": _Key(
        IntIn(100, 600_000), "30000", "ms between registrations with each NameServer"
    ),
    "preferredLeaderId": _Key(
        _parse_optional_str,
        "",
        "node id that should lead when healthy",
        to=(Into("node", "preferred_leader_id", _none_if_empty),),
    ),
    "fileReservedTime": _Key(
        IntIn(1, 24 * 365 * 10),
        INHERITED,
        "hours a segment is kept",
        to=(Into("node", "file_reserved_time_hours"),),
    ),
    "deleteWhen": _Key(
        _parse_delete_when,
        INHERITED,
        "hours of day when old segments are deleted",
        to=(Into("node", "delete_when"),),
    ),
    "retentionCheckIntervalMs": _Key(
        IntIn(100, 3_600_000),
        str(int(RETENTION_CHECK_INTERVAL_S * 1000)),
        "how often retention looks for segments to delete, ms",
        to=(Into("node", "retention_check_interval_s", _ms_to_s),),
    ),
    # 0..10 years: after this long a member that lacks a segment (behind, or down) no longer
    # keeps it on the others' disks; it is caught up by a snapshot when it returns.
    "maxLagRetentionHours": _Key(
        IntIn(0, 24 * 365 * 10),
        INHERITED,
        "hours old segments are kept for a member that lacks them (then: snapshot)",
        to=(Into("node", "max_lag_retention_hours"),),
    ),
    # The pace of a leader's snapshot transfers (dledger.server.snapshots: 1 MiB/s to
    # 16 GiB/s; the default is reasoned there), so catching a member up leaves the leader's
    # event loop and link to its clients.
    "snapshotTransferBytesPerSec": _Key(
        IntIn(MIN_SNAPSHOT_BYTES_PER_S, MAX_SNAPSHOT_BYTES_PER_S),
        INHERITED,
        "bytes per second of all snapshot transfers a leader sends",
        to=(Into("node", "snapshot_bytes_per_s"),),
    ),
    # The pace of the background scrubber that re-reads and checks the whole log
    # (dledger.server.scrub: 64 KiB/s to 1 GiB/s, or 0 for off; the default is reasoned
    # and measured there and in docs/STORAGE.md "Damage and repair").
    "scrubBytesPerSec": _Key(
        IntIn(MIN_SCRUB_BYTES_PER_S, MAX_SCRUB_BYTES_PER_S, off="the scrubber"),
        INHERITED,
        "bytes per second the scrubber checks of the log (0: off)",
        to=(Into("node", "scrub_bytes_per_s"),),
        live=True,
    ),
    # How soon after a scrub pass began the next may begin (dledger.server.scrub): a small log
    # is not re-read in a tight loop; 1 s to 1 day.
    "scrubMinPassIntervalSeconds": _Key(
        IntIn(MIN_SCRUB_PASS_INTERVAL_S, MAX_SCRUB_PASS_INTERVAL_S),
        INHERITED,
        "seconds from one scrub pass's start to the next's, at least",
        to=(Into("node", "scrub_min_pass_interval_s"),),
    ),
    # How often the leader compares its chained checksum with each peer's at a common
    # committed index (dledger.server.chaincheck, docs/RAFT.md section 13): 1 s to 1 day,
    # or 0 for off; the default is reasoned there.
    "chainCheckIntervalMs": _Key(
        IntIn(MIN_CHAIN_CHECK_INTERVAL_MS, MAX_CHAIN_CHECK_INTERVAL_MS, off="the check"),
        INHERITED,
        "ms between the leader's chain comparisons with its peers (0: off)",
        to=(Into("node", "chain_check_interval_ms"),),
    ),
    "maxMessageSize": _Key(
        IntIn(1, 64 * 1024 * 1024),
        INHERITED,
        "max message, bytes",
        to=(
            Into("service", "max_message_size_bytes"),
            Into("v2", "max_message_size_bytes"),
        ),
    ),
    "autoCreateTopicEnable": _Key(
        _parse_bool,
        INHERITED,
        "create unknown topics on send",
        to=(Into("service", "auto_create_topic"),),
        live=True,
    ),
    "slaveReadEnable": _Key(
        _parse_bool,
        INHERITED,
        "let consumers read from followers",
        to=(Into("service", "slave_read_enable"),),
        live=True,
    ),
    "defaultTopicQueueNums": _Key(
        IntIn(1, 1024),
        INHERITED,
        "queues of an auto-created topic (and CreateTopic default)",
        to=(Into("service", "default_topic_queue_nums"),),
        live=True,
    ),
    "maxHashSlotNum": _Key(IntIn(1, 50_000_000), "5000000", "key index hash slots per file"),
    "maxIndexNum": _Key(IntIn(1, 200_000_000), "20000000", "key index records per file"),
    "accessMessageInMemoryMaxRatio": _Key(
        IntIn(1, 100),
        INHERITED,
        "% of RAM a pull may lag the write position before a follower",
        to=(Into("service", "memory_ratio_percent"),),
    ),
    # Disk space (docs/STORAGE.md "Disk full"): RocketMQ's keys with RocketMQ's meanings. Above
    # diskMaxUsedSpaceRatio retention deletes expired segments at once (not only at deleteWhen);
    # above diskSpaceWarningLevelRatio the leader refuses sends (RocketMQ's 90 %, a fraction or a
    # percent as RocketMQ takes it), until usage falls below diskSpaceResumeRatio (our own key:
    # RocketMQ accepts writes again below the same mark). All four change live, applied to the
    # node's retention and disk guard by broker.liveconfig.LiveSettings.
    "diskMaxUsedSpaceRatio": _Key(
        IntIn(MIN_EARLY_USED_PERCENT, MAX_EARLY_USED_PERCENT, off="early deletion"),
        INHERITED,
        "% of the store's file system used above which retention deletes expired segments "
        "at once, not only at deleteWhen's hours (RocketMQ's meaning)",
        to=(Into("node", "retention_early_used_percent"),),
        live=True,
    ),
    "diskSpaceWarningLevelRatio": _Key(
        PercentOrFraction(disk.MIN_USED_PERCENT, disk.MAX_USED_PERCENT),
        f"0.{disk.DEFAULT_MAX_USED_PERCENT}",
        "share of the store's file system used above which the leader refuses sends "
        "(DISK_FULL): 0.90 or 90",
        live=True,
    ),
    "diskSpaceResumeRatio": _Key(
        IntIn(1, disk.MAX_USED_PERCENT - 1),
        str(disk.DEFAULT_RESUME_PERCENT),
        "% used below which sends are accepted again (< diskSpaceWarningLevelRatio; left out: "
        "diskSpaceWarningLevelRatio - 5, so 85 with the default)",
        live=True,
    ),
    "diskCheckIntervalMs": _Key(
        IntIn(disk.MIN_CHECK_INTERVAL_MS, disk.MAX_CHECK_INTERVAL_MS),
        str(disk.DEFAULT_CHECK_INTERVAL_MS),
        "how stale the disk usage seen by the send path may be, ms",
        live=True,
    ),
    "diskSpaceReserveBytes": _Key(
        IntIn(0, 1 << 30),
        INHERITED,
        "space set aside at start so hard state and checkpoints can be written on a full disk",
        to=(Into("store", "reserve_bytes"),),
    ),
    # Our own broker keys.
    # The idempotent-send window (broker.state.machine): every member's apply uses it, so a change
    # is applied by every member at the record's index (broker.liveconfig.LiveSettings).
    "dedupWindowSeconds": _Key(
        IntIn(0, 7 * 24 * 3600), "600", "idempotent-send window, s", live=True
    ),
    "dedupWindowMaxIds": _Key(IntIn(1, 10_000_000), "100000", "uniq ids kept for dedup", live=True),
    "consumerOffsetCommitIntervalMs": _Key(
        IntIn(1, 60_000),
        INHERITED,
        "leader proposes coalesced consumer offsets this often, ms",
        to=(Into("service", "offset_commit_interval_ms"),),
        live=True,
    ),
    "messageDelayLevel": _Key(
        _parse_delay_levels,
        DEFAULT_DELAY_LEVELS,
        "delay of each level (DELAY property), 1-based",
    ),
    # POP consumption (RocketMQ 5 SimpleConsumer, docs/RMQ5.md): RocketMQ's maxReconsumeTimes
    # default (16 deliveries, then %DLQ%{group}), and the proxy's shortest invisible time (10 s;
    # tests lower it so that a redelivery does not take 10 s).
    "popMaxDeliveryAttempts": _Key(
        IntIn(1, 1000),
        INHERITED,
        "deliveries of a received message before %DLQ%{group}",
        to=(Into("service", "pop_max_attempts"),),
    ),
    "popMinInvisibleTimeMs": _Key(
        IntIn(100, 12 * 3600 * 1000),
        INHERITED,
        "shortest invisible time a receive may ask, ms",
        to=(Into("service", "pop_min_invisible_ms"),),
    ),
    # Transactions (RocketMQ 5 clients, docs/RMQ5.md): RocketMQ's keys and defaults. A half
    # message is checked back transactionTimeOut after it was stored, then every
    # transactionCheckInterval, at most transactionCheckMax times, then discarded.
    "transactionTimeOut": _Key(
        IntIn(100, 24 * 3600 * 1000),
        INHERITED,
        "immunity of a half before its first check, ms",
        to=(Into("service", "txn_timeout_ms"),),
    ),
    "transactionCheckInterval": _Key(
        IntIn(100, 24 * 3600 * 1000),
        INHERITED,
        "time between check-backs of a half message, ms",
        to=(Into("service", "txn_check_interval_ms"),),
    ),
    "transactionCheckMax": _Key(
        IntIn(1, 1000),
        INHERITED,
        "check-backs of a half message before it is discarded",
        to=(Into("service", "txn_check_max"),),
    ),
    # Push consumers' auto_renew (broker/frontends/v2/renewals.py): the invisible time the server
    # picks and renews while the consumer is alive (the proxy's 60 s), and how long it renews at
    # most.
    "popAutoRenewInvisibleMs": _Key(
        IntIn(100, 12 * 3600 * 1000),
        str(DEFAULT_SLICE_MS),
        "auto_renew receives' invisible time, ms",
        to=(Into("v2", "renew_slice_ms"),),
    ),
    "popAutoRenewMaxMs": _Key(
        IntIn(1000, 24 * 3600 * 1000),
        str(DEFAULT_MAX_MS),
        "auto_renew renews a message this long, ms",
        to=(Into("v2", "renew_max_ms"),),
    ),
    **_quota_keys(),
    # The derived-state scrubber (docs/BROKER.md, "Derived state"): ConsumeQueue and key
    # index records it checks against the commitlog a second; 0 turns it off. The default's
    # cost is measured there.
    "scrubRecordsPerSecond": _Key(
        IntIn(0, 1_000_000),
        str(DEFAULT_SCRUB_RECORDS_PER_SECOND),
        "derived-state records the scrubber checks against the commitlog a second (0: off)",
        live=True,
    ),
    "delayLevelScale": _Key(
        _parse_scale, "1", "multiplies every delay level (tests: 0.01 turns 10 s into 100 ms)"
    ),
    # RocketMQ 5's timer messages (docs/RMQ5.md, "Timed delivery"): the furthest delivery time a
    # send may ask for. At most a year: the commitlog must keep a message until it is delivered.
    "timerMaxDelaySec": _Key(
        IntIn(1, MAX_TIMER_MAX_DELAY_S),
        str(DEFAULT_TIMER_MAX_DELAY_S),
        "furthest delivery time of a timed message (TIMER_DELIVER_MS, v2 DELAY), s ahead "
        "(at most fileReservedTime; left out: the default, or fileReservedTime when shorter)",
        to=(Into("service", "timer_max_delay_ms", _s_to_ms),),
        live=True,
    ),
    # Our own timer keys (RocketMQ/DLedger have no equivalent with these semantics).
    "raftTickMs": _Key(
        IntIn(5, 1000),
        INHERITED,
        "Raft logical clock period, ms",
        to=(Into("node", "tick_ms"),),
    ),
    "raftHeartbeatIntervalMs": _Key(
        IntIn(5, 10_000),
        INHERITED,
        "leader heartbeat period, ms",
        to=(Into("node", "heartbeat_interval_ms"),),
    ),
    "raftElectionTimeoutMs": _Key(
        IntIn(20, 60_000),
        INHERITED,
        "base election timeout (randomized to [T, 2T)), ms",
        to=(Into("node", "election_timeout_ms"),),
    ),
    "rpcTimeoutMs": _Key(
        IntIn(10, 600_000),
        INHERITED,
        "deadline of a client append, ms",
        to=(Into("node", "append_timeout_ms"),),
    ),
    # Test harness keys (jepsen_like): a proxy in front of the client port, and an unsafe ack.
    "advertisedClientAddr": _Key(
        _parse_advertised_addr,
        INHERITED,
        "host:port clients and peers are told (default: bound one)",
        to=(Into("node", "advertised_client_addr"),),
    ),
    "unsafeAckBeforeReplication": _Key(
        _parse_bool,
        INHERITED,
        "TEST ONLY: ack appends before a majority holds them (loses data)",
        to=(Into("node", "unsafe_ack_before_replication"),),
    ),
    # TLS (RocketMQ's names; docs/SECURITY.md "TLS" and "Members").
    "tlsEnable": _Key(
        _parse_bool,
        "false",
        "client port TLS, peer port mutual TLS (member certificates only), TLS to NameServers",
    ),
    "tlsServerCertPath": _Key(
        _parse_optional_str,
        "",
        "this node's member certificate (PEM): serves its ports, identifies it to peers, signs "
        "its NameServer registrations",
    ),
    "tlsServerKeyPath": _Key(_parse_optional_str, "", "the certificate's private key (0600)"),
    "tlsServerTrustCertPath": _Key(
        _parse_optional_str,
        "",
        "CA (PEM) that signs the members' and NameServers' certificates",
    ),
    "tlsPlaintextListenPort": _Key(
        IntIn(0, 65535),
        INHERITED,
        "with tlsEnable: an extra plaintext client port on 127.0.0.1 for local tools (0: none)",
        to=(Into("node", "plaintext_client_port"),),
    ),
    # Users and permissions (RocketMQ 5.3's names; docs/SECURITY.md "Users and permissions").
    "authenticationEnabled": _Key(
        _parse_bool, "false", "every client-port call must be signed by a known, enabled user"
    ),
    "authorizationEnabled": _Key(
        _parse_bool, "false", "every client-port call must be allowed by the caller's ACL rules"
    ),
    "initAuthenticationUser": _Key(
        parse_init_user,
        "",
        'JSON {"username": .., "password": ..}: the first Super user, created by the first '
        "leader that finds no users",
    ),
    # The identity of the node's own calls to the group's client ports (a follower's status
    # call to its leader, a joining node's calls): a Super user, or one with Cluster Get.
    # Empty: initAuthenticationUser's (mqcluster up writes it on every node).
    "innerClientAuthenticationCredentials": _Key(
        _parse_inner_credentials,
        "",
        'JSON {"accessKey": .., "secretKey": ..}: who the node\'s own calls to members sign as',
    ),
    "aclEncryptionKeyPath": _Key(
        _parse_optional_str, "", "file (0600, same on every member) of the key sealing secrets"
    ),
    "authenticationMaxClockSkewMs": _Key(
        IntIn(1000, 24 * 3600 * 1000),
        str(DEFAULT_MAX_SKEW_MS),
        "how far a signed request's time may be from this node's clock, ms",
    ),
}


KEYS: Mapping[str, _Key] = _resolved(_TABLE)

# The keys UpdateBrokerConfig changes while the group runs (the others need a restart).
LIVE_KEYS = frozenset(name for name, key in KEYS.items() if key.live)
# Live keys whose readers are not ServiceConfig's: the disk guard, the node's retention and
# scrubber, the derived-state scrubber, the state machine's dedup window. Each member applies
# them to those when the group's override table changes (as a record is applied, or a snapshot
# loaded): broker.liveconfig.LiveSettings.
APPLIED_LIVE_KEYS = frozenset(
    {
        "dedupWindowMaxIds",
        "dedupWindowSeconds",
        "diskCheckIntervalMs",
        "diskMaxUsedSpaceRatio",
        "diskSpaceResumeRatio",
        "diskSpaceWarningLevelRatio",
        "scrubBytesPerSec",
        "scrubRecordsPerSecond",
    }
)
# The other live keys go to ServiceConfig fields only: a component reads ``ctx.cfg`` at each
# use, and the node's overrides are laid over it (broker.liveconfig); the node's, store's and
# RocketMQ 5 front end's settings are read once at start.
_SERVICE_LIVE = LIVE_KEYS - APPLIED_LIVE_KEYS
assert APPLIED_LIVE_KEYS <= LIVE_KEYS, APPLIED_LIVE_KEYS - LIVE_KEYS
assert all(into.target == "service" for k in _SERVICE_LIVE for into in KEYS[k].to), LIVE_KEYS
assert all(KEYS[k].to for k in _SERVICE_LIVE), "a live key the broker's wiring reads at start"
assert LIVE_KEYS == LIVE_BROKER_KEYS, "prockit.livekeys lists the live keys for mqadmin"

# Keys whose values are secrets (a user's password): kept in the node's own broker.conf only
# (0600 on a secure group), never copied into another file (mqcluster's cluster.json).
SECRET_KEYS = frozenset(k for k, key in KEYS.items() if key.parse is parse_init_user)
