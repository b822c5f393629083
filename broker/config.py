"""``broker.conf``: RocketMQ's properties format and key names, validated strictly.

Every key has a type, a default (or is required) and a one-line description. Unknown keys, bad
values, a duplicated key, a self id missing from ``dLegerPeers`` each raise :class:`ConfigError`
whose message names the file and the key, so the process can stop at start with one clear line.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from broker.components import disk
from broker.state.delayrules import DEFAULT_DELAY_LEVELS, parse_delay_levels
from broker.state.derived import DEFAULT_SCRUB_RECORDS_PER_SECOND
from broker.state.errors import ConfigError as ConfigError  # the package's one ConfigError
from broker.state.timerrules import DEFAULT_TIMER_MAX_DELAY_S, MAX_TIMER_MAX_DELAY_S
from dledger.properties import (
    int_in,
    parse_bool,
    parse_optional_port,
    parse_port,
    parse_properties,
    parse_values,
    read_text,
)
from dledger.server.chaincheck import (
    DEFAULT_CHAIN_CHECK_INTERVAL_MS,
    MAX_CHAIN_CHECK_INTERVAL_MS,
    MIN_CHAIN_CHECK_INTERVAL_MS,
)
from dledger.server.node import NodeConfig
from dledger.server.scrub import (
    DEFAULT_SCRUB_BYTES_PER_S,
    MAX_SCRUB_BYTES_PER_S,
    MIN_SCRUB_BYTES_PER_S,
)
from dledger.server.snapshots import (
    DEFAULT_SNAPSHOT_BYTES_PER_S,
    MAX_SNAPSHOT_BYTES_PER_S,
    MIN_SNAPSHOT_BYTES_PER_S,
)
from dledger.storage import FlushDiskType, StoreConfig
from dledger.storage.retention import SECONDS_PER_HOUR
from dledger.storage.store import DEFAULT_INDEX_SEGMENT_SIZE_BYTES, DEFAULT_RESERVE_BYTES
from mqsecurity import SecurityError
from mqsecurity.channels import PLAINTEXT, ClientSecurity
from mqsecurity.credentials import Credentials
from mqsecurity.errors import CertificateError
from mqsecurity.pki import MemberIdentity, member_identity
from mqsecurity.signing import DEFAULT_MAX_SKEW_MS
from mqsecurity.tls import TlsFiles, check_server_files, metrics_over_tls, read_pem, tls_files_of


@dataclass(frozen=True, slots=True)
class Peer:
    node_id: str
    host: str
    port: int

    @property
    def addr(self) -> str:
        return f"{self.host}:{self.port}"


_parse_bool = parse_bool  # shared with the NameServer's config


def _parse_scrub_rate(text: str) -> int:
    """scrubBytesPerSec: 0 (off) or a rate in [MIN_SCRUB_BYTES_PER_S, MAX_SCRUB_BYTES_PER_S]."""
    value = int_in(0, MAX_SCRUB_BYTES_PER_S)(text)
    if 0 < value < MIN_SCRUB_BYTES_PER_S:
        raise ValueError(f"is below {MIN_SCRUB_BYTES_PER_S} (0 turns the scrubber off)")
    return value


def _parse_chain_check_interval(text: str) -> int:
    """chainCheckIntervalMs: 0 (off) or [MIN_CHAIN_CHECK_INTERVAL_MS, MAX_...]."""
    value = int_in(0, MAX_CHAIN_CHECK_INTERVAL_MS)(text)
    if 0 < value < MIN_CHAIN_CHECK_INTERVAL_MS:
        raise ValueError(f"is below {MIN_CHAIN_CHECK_INTERVAL_MS} (0 turns the check off)")
    return value


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
    """``a:9876;b:9876`` (empty: no NameServer); normalized to ``;`` without spaces."""
    addrs = [a.strip() for a in text.split(";") if a.strip()]
    for addr in addrs:
        host, colon, port_text = addr.rpartition(":")
        if not colon or not host:
            raise ValueError(f"entry {addr!r} is not host:port")
        parse_port(port_text)
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


def _parse_advertised_addr(text: str) -> str:
    """``host:port`` or empty (advertise the bound ``brokerIP1:listenPort``)."""
    addr = text.strip()
    if addr:
        host, colon, port_text = addr.rpartition(":")
        if not colon or not host:
            raise ValueError("is not host:port")
        parse_port(port_text)
    return addr


def _parse_init_user(text: str) -> Credentials | None:
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


@dataclass(frozen=True, slots=True)
class _Key:
    parse: Callable[[str], Any]
    default: str | None  # None: required
    doc: str


# The keys we accept, with RocketMQ's names where RocketMQ has the key. Limits in the parsers.
KEYS: Mapping[str, _Key] = {
    "brokerClusterName": _Key(_parse_str, "DefaultCluster", "cluster this group belongs to"),
    "brokerName": _Key(_parse_str, "broker-a", "broker group name (one Raft group)"),
    "enableDLegerCommitLog": _Key(_parse_bool, "true", "must be true: raftmq is DLedger-only"),
    "dLegerGroup": _Key(_parse_optional_str, "", "Raft group name (default: brokerName)"),
    "dLegerPeers": _Key(parse_peers, None, "id-host:port;... peer (Raft) addresses"),
    "dLegerSelfId": _Key(_parse_str, None, "this node's id, one of dLegerPeers"),
    "dLegerPeerClientAddrs": _Key(
        _parse_peer_client_addrs,
        "",
        "id-host:port;... client addresses of the members, named in NOT_LEADER redirects "
        "(default: none, redirects name the leader's id only)",
    ),
    "dLegerJoinAddr": _Key(
        _parse_advertised_addr,
        "",
        "host:port (peer address) of a member of an existing group: a node started with "
        "an empty store asks it to be added as a learner (docs/CLUSTER.md); default: none",
    ),
    "listenPort": _Key(parse_port, "10911", "client gRPC port"),
    # RocketMQ's proxy key: the port of the RocketMQ 5 protocol (docs/RMQ5.md); mqcluster gives
    # the first node 8081 (the proxy's default), the next ones the following ports.
    "grpcServerPort": _Key(
        parse_optional_port,
        "0",
        "apache.rocketmq.v2 (RocketMQ 5 clients) gRPC port; 0: not served",
    ),
    # With tlsEnable the port above speaks TLS; RocketMQ's proxy keeps a plaintext port beside
    # its TLS one for old clients: this is that port, on 127.0.0.1 only (docs/RMQ5.md).
    "grpcServerPlaintextPort": _Key(
        int_in(0, 65535),
        "0",
        "with tlsEnable and grpcServerPort: an extra plaintext RocketMQ 5 port on 127.0.0.1 "
        "(0: none; users and permissions apply on it too)",
    ),
    # Prometheus metrics over HTTP (docs/METRICS.md): read-only, unauthenticated, bound to
    # brokerIP1 like the client port; mqcluster gives node i 5557 + i (rocketmq-exporter's port).
    "metricsPort": _Key(
        parse_optional_port, "0", "HTTP port of /metrics (Prometheus text format); 0: not served"
    ),
    # HTTPS on that port with tlsServerCertPath (no client certificate asked); false keeps it
    # plain HTTP for a scraper that cannot do TLS (docs/METRICS.md).
    "metricsTlsEnable": _Key(
        parse_optional_bool,
        "",
        "serve /metrics over HTTPS with this node's certificate (default: as tlsEnable; true "
        "needs tlsEnable)",
    ),
    "brokerIP1": _Key(_parse_str, "127.0.0.1", "address clients are told to use"),
    "storePathRootDir": _Key(_parse_str, "~/store", "root of this node's files"),
    "dLegerPromisePath": _Key(
        _parse_optional_str,
        "",
        "this member's promise file (docs/RAFT.md section 11); default: "
        "{storePathRootDir}/dledger-{dLegerSelfId}.promise, beside the store directory",
    ),
    "flushDiskType": _Key(_parse_flush, "SYNC_FLUSH", "SYNC_FLUSH or ASYNC_FLUSH"),
    "flushIntervalCommitLog": _Key(int_in(1, 60_000), "500", "ASYNC_FLUSH period, ms"),
    "mappedFileSizeCommitLog": _Key(
        int_in(64 * 1024, 1 << 40), str(1 << 30), "commitlog segment size, bytes"
    ),
    # DLedger's mappedFileSizeForEntryIndex: each index file (64 bytes per entry, the chain
    # included) is allocated in full when it is created (files.py: no SIGBUS on a full disk),
    # so its size is disk taken at start; 32 MiB (512 Ki entries) by default, 64 KiB (1,024
    # entries) at least.
    "mappedFileSizeEntryIndex": _Key(
        _parse_index_file_size,
        str(DEFAULT_INDEX_SEGMENT_SIZE_BYTES),
        "log index file size, bytes (a multiple of 64 KiB)",
    ),
    "namesrvAddr": _Key(_parse_namesrv_addr, "", "host:port;... of the NameServers"),
    # RocketMQ's registerNameServerPeriod default (30 s); at least 100 ms (a NameServer call
    # per node per period), at most 10 minutes (NameServers drop nodes silent for 2 minutes).
    "registerBrokerPeriod": _Key(
        int_in(100, 600_000), "30000", "ms between registrations with each NameServer"
    ),
    "preferredLeaderId": _Key(_parse_optional_str, "", "node id that should lead when healthy"),
    "fileReservedTime": _Key(int_in(1, 24 * 365 * 10), "72", "hours a segment is kept"),
    "deleteWhen": _Key(_parse_delete_when, "04", "hours of day when old segments are deleted"),
    "retentionCheckIntervalMs": _Key(
        int_in(100, 3_600_000), "60000", "how often retention looks for segments to delete, ms"
    ),
    # 0..10 years: after this long a member that lacks a segment (behind, or down) no longer
    # keeps it on the others' disks; it is caught up by a snapshot when it returns.
    "maxLagRetentionHours": _Key(
        int_in(0, 24 * 365 * 10),
        "48",
        "hours old segments are kept for a member that lacks them (then: snapshot)",
    ),
    # The pace of a leader's snapshot transfers (dledger.server.snapshots: 1 MiB/s to
    # 16 GiB/s; the default is reasoned there), so catching a member up leaves the leader's
    # event loop and link to its clients.
    "snapshotTransferBytesPerSec": _Key(
        int_in(MIN_SNAPSHOT_BYTES_PER_S, MAX_SNAPSHOT_BYTES_PER_S),
        str(DEFAULT_SNAPSHOT_BYTES_PER_S),
        "bytes per second of all snapshot transfers a leader sends",
    ),
    # The pace of the background scrubber that re-reads and checks the whole log
    # (dledger.server.scrub: 64 KiB/s to 1 GiB/s, or 0 for off; the default is reasoned
    # and measured there and in docs/STORAGE.md "Damage and repair").
    "scrubBytesPerSec": _Key(
        _parse_scrub_rate,
        str(DEFAULT_SCRUB_BYTES_PER_S),
        "bytes per second the scrubber checks of the log (0: off)",
    ),
    # How often the leader compares its chained checksum with each peer's at a common
    # committed index (dledger.server.chaincheck, docs/RAFT.md section 13): 1 s to 1 day,
    # or 0 for off; the default is reasoned there.
    "chainCheckIntervalMs": _Key(
        _parse_chain_check_interval,
        str(DEFAULT_CHAIN_CHECK_INTERVAL_MS),
        "ms between the leader's chain comparisons with its peers (0: off)",
    ),
    "maxMessageSize": _Key(int_in(1, 64 * 1024 * 1024), "4194304", "max message, bytes"),
    "autoCreateTopicEnable": _Key(_parse_bool, "false", "create unknown topics on send"),
    "slaveReadEnable": _Key(_parse_bool, "false", "let consumers read from followers"),
    "defaultTopicQueueNums": _Key(
        int_in(1, 1024), "8", "queues of an auto-created topic (and CreateTopic default)"
    ),
    "maxHashSlotNum": _Key(int_in(1, 50_000_000), "5000000", "key index hash slots per file"),
    "maxIndexNum": _Key(int_in(1, 200_000_000), "20000000", "key index records per file"),
    "accessMessageInMemoryMaxRatio": _Key(
        int_in(1, 100), "40", "% of RAM a pull may lag the write position before a follower"
    ),
    # Disk full (docs/STORAGE.md "Disk full"). RocketMQ's name, but here the mark at which the
    # leader refuses sends (RocketMQ's diskSpaceWarningLevelRatio, 90); in percent.
    "diskMaxUsedSpaceRatio": _Key(
        int_in(disk.MIN_USED_PERCENT, disk.MAX_USED_PERCENT),
        str(disk.DEFAULT_MAX_USED_PERCENT),
        "% of the store's file system used above which the leader refuses sends (DISK_FULL)",
    ),
    "diskSpaceResumeRatio": _Key(
        int_in(1, disk.MAX_USED_PERCENT - 1),
        str(disk.DEFAULT_RESUME_PERCENT),
        "% used below which sends are accepted again (< diskMaxUsedSpaceRatio)",
    ),
    "diskCheckIntervalMs": _Key(
        int_in(disk.MIN_CHECK_INTERVAL_MS, disk.MAX_CHECK_INTERVAL_MS),
        str(disk.DEFAULT_CHECK_INTERVAL_MS),
        "how stale the disk usage seen by the send path may be, ms",
    ),
    "diskSpaceReserveBytes": _Key(
        int_in(0, 1 << 30),
        str(DEFAULT_RESERVE_BYTES),
        "space set aside at start so hard state and checkpoints can be written on a full disk",
    ),
    # Our own broker keys.
    "dedupWindowSeconds": _Key(int_in(0, 7 * 24 * 3600), "600", "idempotent-send window, s"),
    "dedupWindowMaxIds": _Key(int_in(1, 10_000_000), "100000", "uniq ids kept for dedup"),
    "consumerOffsetCommitIntervalMs": _Key(
        int_in(1, 60_000), "100", "leader proposes coalesced consumer offsets this often, ms"
    ),
    "messageDelayLevel": _Key(
        _parse_delay_levels, DEFAULT_DELAY_LEVELS, "delay of each level (DELAY property), 1-based"
    ),
    # POP consumption (RocketMQ 5 SimpleConsumer, docs/RMQ5.md): RocketMQ's maxReconsumeTimes
    # default (16 deliveries, then %DLQ%{group}), and the proxy's shortest invisible time (10 s;
    # tests lower it so that a redelivery does not take 10 s).
    "popMaxDeliveryAttempts": _Key(
        int_in(1, 1000), "16", "deliveries of a received message before %DLQ%{group}"
    ),
    "popMinInvisibleTimeMs": _Key(
        int_in(100, 12 * 3600 * 1000), "10000", "shortest invisible time a receive may ask, ms"
    ),
    # Transactions (RocketMQ 5 clients, docs/RMQ5.md): RocketMQ's keys and defaults. A half
    # message is checked back transactionTimeOut after it was stored, then every
    # transactionCheckInterval, at most transactionCheckMax times, then discarded.
    "transactionTimeOut": _Key(
        int_in(100, 24 * 3600 * 1000),
        "6000",
        "immunity of a half before its first check, ms",
    ),
    "transactionCheckInterval": _Key(
        int_in(100, 24 * 3600 * 1000), "30000", "time between check-backs of a half message, ms"
    ),
    "transactionCheckMax": _Key(
        int_in(1, 1000), "15", "check-backs of a half message before it is discarded"
    ),
    # Push consumers' auto_renew (broker/rmq5/renewals.py): the invisible time the server picks
    # and renews while the consumer is alive (the proxy's 60 s), and how long it renews at most.
    "popAutoRenewInvisibleMs": _Key(
        int_in(100, 12 * 3600 * 1000), "60000", "auto_renew receives' invisible time, ms"
    ),
    "popAutoRenewMaxMs": _Key(
        int_in(1000, 24 * 3600 * 1000), "10800000", "auto_renew renews a message this long, ms"
    ),
    # Per-user quota on a node's table of RocketMQ 5 clients (broker/rmq5/clients.py, 10,000
    # records): a tenth by default, so one user's made-up client ids leave the rest to others.
    # Super users are bounded by the table's own size only.
    # Per-user quota on the replicated table of subscription groups (10,000): a tenth by
    # default, so that one user's Settings naming made-up groups leave the rest to others.
    "subscriptionGroupsPerUser": _Key(
        int_in(1, 10_000), "1000", "subscription groups one user may create in a broker group"
    ),
    # Per-user quota on a node's waiting receives (POP long polls, broker/pop.py: 10,000).
    "popWaitersPerUser": _Key(
        int_in(1, 10_000), "1000", "receives of one user that may wait for messages on a node"
    ),
    # Per-user quotas on the client port's other tables (docs/BROKER.md, "Limits"): a tenth of
    # each by default. Super users are bounded by the tables' own sizes only.
    "longPollsPerUser": _Key(
        int_in(1, 10_000), "1000", "pulls of one user that may be held waiting on a node"
    ),
    "consumersPerUser": _Key(
        int_in(1, 10_000), "1000", "live consumers (group, client id) one user may register"
    ),
    "queueLocksPerUser": _Key(
        int_in(1, 100_000), "10000", "queue locks one user's consumers may hold on a node"
    ),
    "pendingOffsetsPerUser": _Key(
        int_in(1, 100_000), "10000", "offsets of one user the leader buffers between flushes"
    ),
    # Per-user quota on the replicated topic table (100,000 per broker group): CreateTopic and
    # sends that auto-create a topic count against the user who made them.
    "topicsPerUser": _Key(
        int_in(1, 100_000), "10000", "topics one user may create in a broker group"
    ),
    # Per-user quota on the replicated consumer groups with offsets (10,000 per broker group,
    # broker.records.MAX_OFFSET_GROUPS): a commit giving a new group offsets counts against it.
    "offsetGroupsPerUser": _Key(
        int_in(1, 10_000), "1000", "consumer groups with offsets one user may create"
    ),
    "grpcClientsPerUser": _Key(
        int_in(1, 10_000), "1000", "RocketMQ 5 client records one user may hold on a node"
    ),
    # The derived-state scrubber (docs/BROKER.md, "Derived state"): ConsumeQueue and key
    # index records it checks against the commitlog a second; 0 turns it off. The default's
    # cost is measured there.
    "scrubRecordsPerSecond": _Key(
        int_in(0, 1_000_000),
        str(DEFAULT_SCRUB_RECORDS_PER_SECOND),
        "derived-state records the scrubber checks against the commitlog a second (0: off)",
    ),
    "delayLevelScale": _Key(
        _parse_scale, "1", "multiplies every delay level (tests: 0.01 turns 10 s into 100 ms)"
    ),
    # RocketMQ 5's timer messages (docs/RMQ5.md, "Timed delivery"): the furthest delivery time a
    # send may ask for. At most a year: the commitlog must keep a message until it is delivered.
    "timerMaxDelaySec": _Key(
        int_in(1, MAX_TIMER_MAX_DELAY_S),
        str(DEFAULT_TIMER_MAX_DELAY_S),
        "furthest delivery time of a timed message (TIMER_DELIVER_MS, v2 DELAY), s ahead",
    ),
    # Our own timer keys (RocketMQ/DLedger have no equivalent with these semantics).
    "raftTickMs": _Key(int_in(5, 1000), "50", "Raft logical clock period, ms"),
    "raftHeartbeatIntervalMs": _Key(int_in(5, 10_000), "100", "leader heartbeat period, ms"),
    "raftElectionTimeoutMs": _Key(
        int_in(20, 60_000), "500", "base election timeout (randomized to [T, 2T)), ms"
    ),
    "rpcTimeoutMs": _Key(int_in(10, 600_000), "3000", "deadline of a client append, ms"),
    # Test harness keys (jepsen_like): a proxy in front of the client port, and an unsafe ack.
    "advertisedClientAddr": _Key(
        _parse_advertised_addr, "", "host:port clients and peers are told (default: bound one)"
    ),
    "unsafeAckBeforeReplication": _Key(
        _parse_bool, "false", "TEST ONLY: ack appends before a majority holds them (loses data)"
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
        _parse_optional_str, "", "CA (PEM) that signs the members' and NameServers' certificates"
    ),
    "tlsPlaintextListenPort": _Key(
        int_in(0, 65535),
        "0",
        "with tlsEnable: an extra plaintext client port on 127.0.0.1 for local tools (0: none)",
    ),
    # Users and permissions (RocketMQ 5.3's names; docs/SECURITY.md "Users and permissions").
    "authenticationEnabled": _Key(
        _parse_bool, "false", "every client-port call must be signed by a known, enabled user"
    ),
    "authorizationEnabled": _Key(
        _parse_bool, "false", "every client-port call must be allowed by the caller's ACL rules"
    ),
    "initAuthenticationUser": _Key(
        _parse_init_user,
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
        int_in(1000, 24 * 3600 * 1000),
        str(DEFAULT_MAX_SKEW_MS),
        "how far a signed request's time may be from this node's clock, ms",
    ),
}

# Keys whose values are secrets (a user's password): kept in the node's own broker.conf only
# (0600 on a secure group), never copied into another file (mqcluster's cluster.json).
SECRET_KEYS = frozenset(k for k, key in KEYS.items() if key.parse is _parse_init_user)


@dataclass(frozen=True, slots=True)
class BrokerConfig:
    path: str
    brokerClusterName: str
    brokerName: str
    dLegerGroup: str
    dLegerPeers: tuple[Peer, ...]
    dLegerSelfId: str
    dLegerPeerClientAddrs: tuple[Peer, ...]
    dLegerJoinAddr: str
    listenPort: int
    grpcServerPort: int
    grpcServerPlaintextPort: int
    metricsPort: int
    metricsTlsEnable: bool | None
    brokerIP1: str
    storePathRootDir: str
    dLegerPromisePath: str
    flushDiskType: FlushDiskType
    flushIntervalCommitLog: int
    mappedFileSizeCommitLog: int
    mappedFileSizeEntryIndex: int
    namesrvAddr: str
    registerBrokerPeriod: int
    preferredLeaderId: str
    fileReservedTime: int
    deleteWhen: str
    retentionCheckIntervalMs: int
    maxLagRetentionHours: int
    snapshotTransferBytesPerSec: int
    scrubBytesPerSec: int
    chainCheckIntervalMs: int
    maxMessageSize: int
    autoCreateTopicEnable: bool
    slaveReadEnable: bool
    defaultTopicQueueNums: int
    maxHashSlotNum: int
    maxIndexNum: int
    accessMessageInMemoryMaxRatio: int
    diskMaxUsedSpaceRatio: int
    diskSpaceResumeRatio: int
    diskCheckIntervalMs: int
    diskSpaceReserveBytes: int
    dedupWindowSeconds: int
    dedupWindowMaxIds: int
    consumerOffsetCommitIntervalMs: int
    messageDelayLevel: str
    delayLevelScale: float
    popMaxDeliveryAttempts: int
    popMinInvisibleTimeMs: int
    transactionTimeOut: int
    transactionCheckInterval: int
    transactionCheckMax: int
    popAutoRenewInvisibleMs: int
    popAutoRenewMaxMs: int
    grpcClientsPerUser: int
    subscriptionGroupsPerUser: int
    popWaitersPerUser: int
    longPollsPerUser: int
    consumersPerUser: int
    queueLocksPerUser: int
    pendingOffsetsPerUser: int
    topicsPerUser: int
    offsetGroupsPerUser: int
    scrubRecordsPerSecond: int
    timerMaxDelaySec: int
    raftTickMs: int
    raftHeartbeatIntervalMs: int
    raftElectionTimeoutMs: int
    rpcTimeoutMs: int
    advertisedClientAddr: str
    unsafeAckBeforeReplication: bool
    tlsEnable: bool
    tlsServerCertPath: str
    tlsServerKeyPath: str
    tlsServerTrustCertPath: str
    tlsPlaintextListenPort: int
    authenticationEnabled: bool
    authorizationEnabled: bool
    initAuthenticationUser: Credentials | None
    innerClientAuthenticationCredentials: Credentials | None
    aclEncryptionKeyPath: str
    authenticationMaxClockSkewMs: int

    @property
    def tls_files(self) -> TlsFiles | None:
        """This node's certificate, key and CA (None: no certificate configured)."""
        return tls_files_of(
            self.tlsServerCertPath, self.tlsServerKeyPath, self.tlsServerTrustCertPath
        )

    @property
    def metrics_tls_files(self) -> TlsFiles | None:
        """The certificate and key /metrics is served with (HTTPS), None for plain HTTP."""
        return self.tls_files if metrics_over_tls(self.tlsEnable, self.metricsTlsEnable) else None

    @property
    def client_security(self) -> ClientSecurity:
        """How this node calls the group's ports and the NameServers."""
        return ClientSecurity(tls=self.tls_files) if self.tlsEnable else PLAINTEXT

    @property
    def inner_credentials(self) -> Credentials | None:
        """Who this node's own calls to the group's client ports sign as (None: unsigned,
        when the group checks no signatures)."""
        if not (self.authenticationEnabled or self.authorizationEnabled):
            return None
        return self.innerClientAuthenticationCredentials or self.initAuthenticationUser

    @property
    def self_peer(self) -> Peer:
        return next(p for p in self.dLegerPeers if p.node_id == self.dLegerSelfId)

    @property
    def client_addr(self) -> str:
        """The address clients are told to use (a proxy's, when advertisedClientAddr is set)."""
        return self.advertisedClientAddr or f"{self.brokerIP1}:{self.listenPort}"

    @property
    def rmq5_addr(self) -> str:
        """The RocketMQ 5 port's address (registered with NameServers); "" when not served."""
        return f"{self.brokerIP1}:{self.grpcServerPort}" if self.grpcServerPort else ""

    @property
    def delay_levels_ms(self) -> tuple[int, ...]:
        return parse_delay_levels(self.messageDelayLevel, self.delayLevelScale)

    @property
    def namesrv_addrs(self) -> list[str]:
        return [a for a in self.namesrvAddr.split(";") if a]

    @property
    def disk_watermarks(self) -> disk.Watermarks:
        return disk.Watermarks(
            max_used_percent=self.diskMaxUsedSpaceRatio,
            resume_percent=self.diskSpaceResumeRatio,
            check_interval_ms=self.diskCheckIntervalMs,
        )

    @property
    def dledger_dir(self) -> Path:
        return Path(self.storePathRootDir) / f"dledger-{self.dLegerSelfId}"


def parse_config(text: str, path: str = "broker.conf") -> BrokerConfig:
    """Parse and validate the text of a broker.conf."""
    raw = parse_properties(text, path, KEYS, "mqbroker", ConfigError)
    given: dict[str, str] = {}
    for name, key in KEYS.items():
        text_value = raw.get(name, key.default)
        if text_value is None:
            raise ConfigError(f"{path}: key '{name}' is required ({key.doc})")
        given[name] = text_value
    # Parsed apart: parse_values quotes a bad value in its error, and this one holds a password.
    init_user_text = given.pop("initAuthenticationUser")
    values = parse_values(given, {name: key.parse for name, key in KEYS.items()}, path, ConfigError)
    try:
        values["initAuthenticationUser"] = _parse_init_user(init_user_text)
    except ValueError as exc:
        raise ConfigError(f"{path}: key 'initAuthenticationUser' {exc}") from None
    if not values["enableDLegerCommitLog"]:
        raise ConfigError(f"{path}: key 'enableDLegerCommitLog' must be true (DLedger-only)")
    if not values["dLegerGroup"]:
        values["dLegerGroup"] = values["brokerName"]
    ids = [p.node_id for p in values["dLegerPeers"]]
    if values["dLegerSelfId"] not in ids:
        raise ConfigError(
            f"{path}: key 'dLegerSelfId': {values['dLegerSelfId']!r} is not in dLegerPeers {ids}"
        )
    unknown_ids = [p.node_id for p in values["dLegerPeerClientAddrs"] if p.node_id not in ids]
    if unknown_ids:
        raise ConfigError(
            f"{path}: key 'dLegerPeerClientAddrs': {unknown_ids[0]!r} is not in dLegerPeers {ids}"
        )
    if values["preferredLeaderId"] and values["preferredLeaderId"] not in ids:
        raise ConfigError(
            f"{path}: key 'preferredLeaderId': {values['preferredLeaderId']!r} "
            f"is not in dLegerPeers {ids}"
        )
    if values["listenPort"] in {p.port for p in values["dLegerPeers"]}:
        raise ConfigError(f"{path}: key 'listenPort': {values['listenPort']} is a peer port")
    if values["grpcServerPort"] in {values["listenPort"], *(p.port for p in values["dLegerPeers"])}:
        raise ConfigError(
            f"{path}: key 'grpcServerPort': {values['grpcServerPort']} is the client or a peer port"
        )
    tick = values["raftTickMs"]
    if values["raftHeartbeatIntervalMs"] < tick:
        raise ConfigError(f"{path}: key 'raftHeartbeatIntervalMs' must be >= raftTickMs ({tick})")
    if values["raftElectionTimeoutMs"] < 2 * values["raftHeartbeatIntervalMs"]:
        raise ConfigError(
            f"{path}: key 'raftElectionTimeoutMs' must be >= 2 x raftHeartbeatIntervalMs"
        )
    if values["diskSpaceResumeRatio"] >= values["diskMaxUsedSpaceRatio"]:
        raise ConfigError(
            f"{path}: key 'diskSpaceResumeRatio' ({values['diskSpaceResumeRatio']}) must be "
            f"below diskMaxUsedSpaceRatio ({values['diskMaxUsedSpaceRatio']})"
        )
    _check_timer_retention(values, path)
    _check_tls(values, path)
    _check_metrics_port(values, path)
    _check_auth_keys(values, path)
    values["storePathRootDir"] = os.path.expanduser(values["storePathRootDir"])
    values["dLegerPromisePath"] = os.path.expanduser(values["dLegerPromisePath"])
    values.pop("enableDLegerCommitLog")
    return BrokerConfig(path=path, **values)


def _check_timer_retention(values: dict[str, Any], path: str) -> None:
    """A timed message waits in the commitlog until its delivery time, at most
    ``timerMaxDelaySec`` after its send: retention (``fileReservedTime``) must not be allowed to
    delete its segment before then, or the broker would lose a message it accepted."""
    delay_s, hours = values["timerMaxDelaySec"], values["fileReservedTime"]
    if delay_s > hours * SECONDS_PER_HOUR:
        raise ConfigError(
            f"{path}: key 'timerMaxDelaySec' ({delay_s} s) exceeds fileReservedTime ({hours} h"
            f" = {hours * SECONDS_PER_HOUR} s): retention would delete timed messages before"
            f" their delivery time; raise fileReservedTime or lower timerMaxDelaySec"
        )


def _check_tls(values: dict[str, Any], path: str) -> None:
    """The TLS keys agree, and their files are readable, parse, and the key is the
    certificate's (checked now: a wrong file stops the start with one line naming its key)."""
    cert, key, ca = (
        values["tlsServerCertPath"],
        values["tlsServerKeyPath"],
        values["tlsServerTrustCertPath"],
    )
    if values["tlsEnable"]:
        for name in ("tlsServerCertPath", "tlsServerKeyPath", "tlsServerTrustCertPath"):
            if not values[name]:
                raise ConfigError(f"{path}: key '{name}' is required with tlsEnable=true")
    if bool(cert) != bool(key):
        raise ConfigError(f"{path}: keys 'tlsServerCertPath' and 'tlsServerKeyPath' go together")
    if cert:
        try:
            check_server_files(TlsFiles(cert, key, ca or None))
        except CertificateError as exc:
            raise ConfigError(f"{path}: {exc}") from None
        expected = MemberIdentity(values["dLegerGroup"], values["dLegerSelfId"])
        named = member_identity(read_pem(cert, "tlsServerCertPath"))
        if named != expected:
            raise ConfigError(
                f"{path}: key 'tlsServerCertPath': {cert} names "
                f"{named.uri if named else 'no raftmq member'}, not this node ({expected.uri})"
            )
    if values["metricsTlsEnable"] and not values["tlsEnable"]:
        raise ConfigError(f"{path}: key 'metricsTlsEnable' needs tlsEnable=true")
    plain = values["tlsPlaintextListenPort"]
    if plain and not values["tlsEnable"]:
        raise ConfigError(f"{path}: key 'tlsPlaintextListenPort' needs tlsEnable=true")
    if plain and plain in {values["listenPort"], *(p.port for p in values["dLegerPeers"])}:
        raise ConfigError(f"{path}: key 'tlsPlaintextListenPort': {plain} is already used")
    v2_plain = values["grpcServerPlaintextPort"]
    if v2_plain and not (values["tlsEnable"] and values["grpcServerPort"]):
        raise ConfigError(
            f"{path}: key 'grpcServerPlaintextPort' needs tlsEnable=true and grpcServerPort"
        )
    used = {values["listenPort"], values["grpcServerPort"], plain}
    if v2_plain and v2_plain in used | {p.port for p in values["dLegerPeers"]}:
        raise ConfigError(f"{path}: key 'grpcServerPlaintextPort': {v2_plain} is already used")


def _check_metrics_port(values: Mapping[str, Any], path: str) -> None:
    port = values["metricsPort"]
    used = {
        values["listenPort"],
        values["grpcServerPort"],
        values["grpcServerPlaintextPort"],
        values["tlsPlaintextListenPort"],
        *(p.port for p in values["dLegerPeers"]),
    }
    if port and port in used:
        raise ConfigError(f"{path}: key 'metricsPort': {port} is already used by another port")


def _check_auth_keys(values: Mapping[str, Any], path: str) -> None:
    needs_key = (
        values["authenticationEnabled"]
        or values["authorizationEnabled"]
        or values["initAuthenticationUser"] is not None
    )
    if needs_key and not values["aclEncryptionKeyPath"]:
        raise ConfigError(
            f"{path}: key 'aclEncryptionKeyPath' is required when authenticationEnabled, "
            "authorizationEnabled or initAuthenticationUser is set (user secrets are kept "
            "encrypted under it)"
        )


def load_config(path: str | os.PathLike[str]) -> BrokerConfig:
    """Read and validate a broker.conf file."""
    return parse_config(read_text(path, ConfigError), str(path))


def render_config(values: Mapping[str, object]) -> str:
    """A broker.conf text for ``values`` (used by mqcluster to write node configs)."""
    unknown = sorted(set(values) - set(KEYS))
    if unknown:
        raise ConfigError(f"render_config: unknown key '{unknown[0]}'")
    return "".join(f"{k}={v}\n" for k, v in values.items())


# broker.conf keys besides mappedFileSizeCommitLog that every member must set alike: the
# members' apply decides with them (a different window makes a member store a retried
# message the others answered as a duplicate). See docs/CLUSTER.md, "Changing a group's
# members".
SHARED_KEYS = ("dedupWindowSeconds", "dedupWindowMaxIds")


@dataclass(frozen=True, slots=True)
class SignedNodeConfig(NodeConfig):
    """A member's config whose own calls to the group's ports are signed as ``credentials``
    (innerClientAuthenticationCredentials): on a group that checks signatures, a follower's
    status call to its leader and a joining node's calls are a known user's, like every
    other caller's (dledger knows nothing of users: it only opens channels this way)."""

    credentials: Credentials | None = None

    @property
    def client_security(self) -> ClientSecurity:
        base = NodeConfig.client_security.fget(self)  # type: ignore[attr-defined]
        assert isinstance(base, ClientSecurity)
        if self.credentials is None:
            return base
        return ClientSecurity(base.tls, self.credentials, base.server_name)


def node_config(cfg: BrokerConfig) -> NodeConfig:
    """The DLedger member this broker runs (dledger knows nothing of brokers)."""
    return SignedNodeConfig(
        group=cfg.dLegerGroup,
        self_id=cfg.dLegerSelfId,
        peers={p.node_id: p.addr for p in cfg.dLegerPeers},
        client_host=cfg.brokerIP1,
        client_port=cfg.listenPort,
        store_dir=str(cfg.dledger_dir),
        store=StoreConfig(
            segment_size_bytes=cfg.mappedFileSizeCommitLog,
            index_segment_size_bytes=cfg.mappedFileSizeEntryIndex,
            flush_disk_type=cfg.flushDiskType,
            flush_interval_ms=cfg.flushIntervalCommitLog,
            reserve_bytes=cfg.diskSpaceReserveBytes,
        ),
        tick_ms=cfg.raftTickMs,
        heartbeat_interval_ms=cfg.raftHeartbeatIntervalMs,
        election_timeout_ms=cfg.raftElectionTimeoutMs,
        append_timeout_ms=cfg.rpcTimeoutMs,
        preferred_leader_id=cfg.preferredLeaderId or None,
        advertised_client_addr=cfg.advertisedClientAddr,
        peer_client_addrs={p.node_id: p.addr for p in cfg.dLegerPeerClientAddrs},
        unsafe_ack_before_replication=cfg.unsafeAckBeforeReplication,
        file_reserved_time_hours=cfg.fileReservedTime,
        delete_when=cfg.deleteWhen,
        retention_check_interval_s=cfg.retentionCheckIntervalMs / 1000,
        max_lag_retention_hours=cfg.maxLagRetentionHours,
        snapshot_bytes_per_s=cfg.snapshotTransferBytesPerSec,
        scrub_bytes_per_s=cfg.scrubBytesPerSec,
        chain_check_interval_ms=cfg.chainCheckIntervalMs,
        # What a joining node must share with the group (a Join with other values is refused):
        # the segment size (replicas share data positions, a snapshot carries segments as they
        # are) and the dedup window, which every member's apply uses.
        segment_size_setting="mappedFileSizeCommitLog",
        shared_settings={k: str(getattr(cfg, k)) for k in SHARED_KEYS},
        tls=cfg.tls_files if cfg.tlsEnable else None,
        plaintext_client_port=cfg.tlsPlaintextListenPort,
        join_addr=cfg.dLegerJoinAddr,
        credentials=cfg.inner_credentials,
        promise_path=cfg.dLegerPromisePath,
    )
