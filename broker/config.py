"""``broker.conf``: RocketMQ's properties format and key names, validated strictly.

Every key has a type, a default (or is required) and a one-line description, in the table of
:mod:`broker.configkeys`; this module parses a file with it, checks the keys that go together,
and builds the node's and the service's configs from it. Unknown keys, bad
values, a duplicated key, a self id missing from ``dLegerPeers`` each raise :class:`ConfigError`
whose message names the file and the key, so the process can stop at start with one clear line.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from broker.components import disk
from broker.components.settings import ServiceConfig
from broker.configkeys import KEYS as KEYS
from broker.configkeys import SECRET_KEYS as SECRET_KEYS
from broker.configkeys import TARGETS, Peer, is_unspecified_host, parse_init_user
from broker.configkeys import _Key as _Key  # tests add keys to KEYS with it
from broker.configkeys import parse_peers as parse_peers
from broker.state import features as broker_features
from broker.state.delayrules import parse_delay_levels
from broker.state.errors import ConfigError as ConfigError  # the package's one ConfigError
from dledger.server.node import NodeConfig
from dledger.storage import FlushDiskType, StoreConfig
from dledger.storage.retention import SECONDS_PER_HOUR
from mqsecurity.channels import PLAINTEXT, ClientSecurity
from mqsecurity.credentials import Credentials
from mqsecurity.errors import CertificateError
from mqsecurity.pki import MemberIdentity, member_identity
from mqsecurity.tls import TlsFiles, check_server_files, metrics_over_tls, read_pem, tls_files_of
from prockit.properties import (
    parse_values,
    read_properties,
    read_text,
)
from prockit.rocketmq_keys import BROKER_KEYS


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
    dLegerPeerSocketPort: int
    dLegerPeerSocketEnable: bool
    listenPort: int
    grpcServerPort: int
    grpcServerPlaintextPort: int
    remotingListenPort: int
    metricsPort: int
    metricsTlsEnable: bool | None
    brokerIP1: str
    bindAddress: str
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
    scrubMinPassIntervalSeconds: int
    chainCheckIntervalMs: int
    maxMessageSize: int
    autoCreateTopicEnable: bool
    slaveReadEnable: bool
    defaultTopicQueueNums: int
    maxHashSlotNum: int
    maxIndexNum: int
    accessMessageInMemoryMaxRatio: int
    diskMaxUsedSpaceRatio: int
    diskSpaceWarningLevelRatio: int
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
    producersPerUser: int
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
    # RocketMQ's keys the file set that raftmq accepts and does not use (ignored_keys_warning).
    ignored_keys: tuple[str, ...] = ()
    # Warnings about how the file's keys were read (one line each; broker.__main__ logs them).
    notes: tuple[str, ...] = ()
    # The keys the file set (the others have their default): cross-key checks of a live change
    # say which values were defaults, and a left-out diskSpaceResumeRatio follows a live change
    # of diskSpaceWarningLevelRatio (broker.liveconfig.effective_config).
    file_keys: frozenset[str] = frozenset()

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
    def bind_host(self) -> str:
        """The host every port of the node binds: bindAddress, or brokerIP1 when not set."""
        return self.bindAddress or self.brokerIP1

    @property
    def rmq5_addr(self) -> str:
        """The RocketMQ 5 port's address (registered with NameServers); "" when not served."""
        return f"{self.brokerIP1}:{self.grpcServerPort}" if self.grpcServerPort else ""

    @property
    def remoting_addr(self) -> str:
        """The remoting port's address (registered with NameServers, the address their
        remoting routes give 4.x clients); "" when not served."""
        return f"{self.brokerIP1}:{self.remotingListenPort}" if self.remotingListenPort else ""

    @property
    def delay_levels_ms(self) -> tuple[int, ...]:
        return parse_delay_levels(self.messageDelayLevel, self.delayLevelScale)

    @property
    def namesrv_addrs(self) -> list[str]:
        return [a for a in self.namesrvAddr.split(";") if a]

    @property
    def disk_watermarks(self) -> disk.Watermarks:
        return disk.Watermarks(
            max_used_percent=self.diskSpaceWarningLevelRatio,
            resume_percent=self.diskSpaceResumeRatio,
            check_interval_ms=self.diskCheckIntervalMs,
        )

    @property
    def dledger_dir(self) -> Path:
        return Path(self.storePathRootDir) / f"dledger-{self.dLegerSelfId}"


# RocketMQ's broker keys raftmq does not use: accepted, with one warning naming them
# (ignored_keys_warning), so an operator's broker.conf starts as it is.
ROCKETMQ_ONLY_KEYS = BROKER_KEYS - frozenset(KEYS)
# What the warning adds after some of them: where raftmq has the same thing under its own
# name, or why the key has no effect (as in RocketMQ's own DLedger mode).
IGNORED_KEY_NOTES: Mapping[str, str] = {
    "storePathCommitLog": "a DLedger commitlog lives in storePathRootDir/dledger-<dLegerSelfId>, "
    "in RocketMQ as here",
    "brokerId": "Raft elects the leader",
    "brokerRole": "Raft elects the leader",
    "registerNameServerPeriod": "raftmq's is registerBrokerPeriod",
    "metricsPromExporterPort": "raftmq's is metricsPort",
    "diskSpaceCleanForciblyRatio": "raftmq never deletes a segment before fileReservedTime: "
    "above diskMaxUsedSpaceRatio it deletes the expired ones at once",
}
# RocketMQ keys refused rather than ignored: ignoring them would leave the operator believing
# what is not so (the log on another disk, requests checked against an ACL). key -> (whether
# the value asks for it, why it is refused and what to use).
REFUSED_ROCKETMQ_KEYS: Mapping[str, tuple[Callable[[str], bool], str]] = {
    "storePathDLedgerCommitLog": (
        lambda text: bool(text.strip()),
        "raftmq keeps the Raft log in storePathRootDir/dledger-<dLegerSelfId> (RocketMQ's "
        "default for this key); set storePathRootDir to move it, and remove this key",
    ),
    "aclEnable": (
        lambda text: text.strip().lower() not in ("", "false", "0", "no"),
        "RocketMQ 4's plain ACL is not implemented: raftmq checks users and permissions with "
        "authenticationEnabled and authorizationEnabled (docs/SECURITY.md)",
    ),
}
# diskSpaceResumeRatio left out: this many points below diskSpaceWarningLevelRatio (85 below 90).
RESUME_GAP_PERCENT = disk.DEFAULT_MAX_USED_PERCENT - disk.DEFAULT_RESUME_PERCENT


def resume_percent_for(warning_percent: int) -> int:
    """diskSpaceResumeRatio left out: RESUME_GAP_PERCENT below the refusal mark (at least 1)."""
    return max(1, warning_percent - RESUME_GAP_PERCENT)


# The release whose broker.conf read diskMaxUsedSpaceRatio as the refusal mark (docs/UPGRADE.md).
OLD_DISK_MARK_RELEASE = "0.2.0"


def ignored_keys_warning(cfg: BrokerConfig) -> str | None:
    """The one warning line naming the RocketMQ keys the file set and raftmq ignores."""
    if not cfg.ignored_keys:
        return None
    names = [
        f"{k} ({IGNORED_KEY_NOTES[k]})" if k in IGNORED_KEY_NOTES else k for k in cfg.ignored_keys
    ]
    return (
        f"{cfg.path}: ignoring {len(names)} RocketMQ broker key(s) raftmq does not use: "
        f"{', '.join(names)} (docs/CONFIG.md lists the keys raftmq accepts and ignores)"
    )


def _texts(raw: Mapping[str, str], path: str) -> dict[str, str]:
    """Each key's text: the file's, or its default; a required key left out: refused."""
    given: dict[str, str] = {}
    for name, key in KEYS.items():
        text_value = raw.get(name, key.default)
        if text_value is None:
            raise ConfigError(f"{path}: key '{name}' is required ({key.doc})")
        assert isinstance(text_value, str), f"{name}: unresolved default {text_value!r}"
        given[name] = text_value
    return given


def _check_rocketmq_keys(ignored: Mapping[str, str], path: str) -> None:
    """A RocketMQ key whose silent ignoring would mislead is refused, naming what to use."""
    for name, text in ignored.items():
        refused = REFUSED_ROCKETMQ_KEYS.get(name)
        if refused is not None and refused[0](text):
            raise ConfigError(f"{path}: key '{name}': {text!r} refused: {refused[1]}")


def _disk_marks_of_old_release(values: dict[str, Any], raw: Mapping[str, str]) -> list[str]:
    """Up to raftmq 0.2.0 ``diskMaxUsedSpaceRatio`` was the mark at which sends are refused;
    it now has RocketMQ's meaning (early deletion) and the refusal is
    ``diskSpaceWarningLevelRatio``'s. A file that sets it with ``diskSpaceResumeRatio`` (our own
    key, "below the refusal mark") and without ``diskSpaceWarningLevelRatio`` was written for
    0.2.0: it keeps its refusal mark. A file that sets it alone may be either (RocketMQ's stock
    75): read with RocketMQ's meaning. Both cases are named in a warning (docs/UPGRADE.md)."""
    mark = values["diskMaxUsedSpaceRatio"]
    if "diskMaxUsedSpaceRatio" not in raw or "diskSpaceWarningLevelRatio" in raw or not mark:
        return []  # (0, early deletion off, is this release's alone)
    default_early = KEYS["diskMaxUsedSpaceRatio"].parse(str(KEYS["diskMaxUsedSpaceRatio"].default))
    if "diskSpaceResumeRatio" in raw:
        values["diskSpaceWarningLevelRatio"] = mark
        values["diskMaxUsedSpaceRatio"] = default_early
        return [
            f"diskMaxUsedSpaceRatio={mark} with diskSpaceResumeRatio is a raftmq "
            f"{OLD_DISK_MARK_RELEASE} setting: read as then, sends are refused at {mark} % "
            f"used; rename the key to diskSpaceWarningLevelRatio (diskMaxUsedSpaceRatio now "
            f"has RocketMQ's meaning: expired segments are deleted at once above it, "
            f"{default_early} by default; docs/UPGRADE.md)"
        ]
    refuse = values["diskSpaceWarningLevelRatio"]
    return [
        f"diskMaxUsedSpaceRatio={mark} (set) has RocketMQ's meaning: expired segments are "
        f"deleted at once above {mark} % used; sends are refused at diskSpaceWarningLevelRatio="
        f"{refuse} % (default). A file written for raftmq {OLD_DISK_MARK_RELEASE} meant the "
        f"refusal mark by it: set diskSpaceWarningLevelRatio={mark} to refuse there "
        "(docs/UPGRADE.md)"
    ]


def _derive_defaults(values: dict[str, Any], raw: Mapping[str, str]) -> list[str]:
    """Keys left out whose default follows another key, so that no default makes a value the
    user set fail a check against it (RocketMQ's stock fileReservedTime=48 or
    diskSpaceWarningLevelRatio=0.80 start); the warnings about how keys were read."""
    if not values["dLegerGroup"]:
        values["dLegerGroup"] = values["brokerName"]
    notes = _disk_marks_of_old_release(values, raw)
    if "diskSpaceResumeRatio" not in raw:
        values["diskSpaceResumeRatio"] = resume_percent_for(values["diskSpaceWarningLevelRatio"])
    if "timerMaxDelaySec" not in raw:
        retention_s = values["fileReservedTime"] * SECONDS_PER_HOUR
        values["timerMaxDelaySec"] = min(values["timerMaxDelaySec"], retention_s)
    return notes


def parse_config(text: str, path: str = "broker.conf") -> BrokerConfig:
    """Parse and validate the text of a broker.conf."""
    props = read_properties(text, path, KEYS, "mqbroker", ConfigError, ROCKETMQ_ONLY_KEYS)
    _check_rocketmq_keys(props.ignored, path)
    raw = props.values
    given = _texts(raw, path)
    # Parsed apart: parse_values quotes a bad value in its error, and this one holds a password.
    init_user_text = given.pop("initAuthenticationUser")
    values = parse_values(given, {name: key.parse for name, key in KEYS.items()}, path, ConfigError)
    try:
        values["initAuthenticationUser"] = parse_init_user(init_user_text)
    except ValueError as exc:
        raise ConfigError(f"{path}: key 'initAuthenticationUser' {exc}") from None
    if not values["enableDLegerCommitLog"]:
        raise ConfigError(f"{path}: key 'enableDLegerCommitLog' must be true (DLedger-only)")
    notes = _derive_defaults(values, raw)
    _check_members(values, path)
    _check_ports(values, path)
    check_value_rules(values, raw, path)
    _check_advertised(values, path)
    _check_tls(values, path)
    _check_metrics_port(values, path)
    _check_auth_keys(values, path)
    values["storePathRootDir"] = os.path.expanduser(values["storePathRootDir"])
    values["dLegerPromisePath"] = os.path.expanduser(values["dLegerPromisePath"])
    values.pop("enableDLegerCommitLog")
    return BrokerConfig(
        path=path,
        ignored_keys=tuple(props.ignored),
        notes=tuple(f"{path}: {note}" for note in notes),
        file_keys=frozenset(raw),
        **values,
    )


def check_value_rules(values: Mapping[str, Any], raw: Mapping[str, str], path: str) -> None:
    """The cross-key checks between values (ConfigError naming what was compared and how to
    fix it): of a broker.conf, and of a live change laid over one (broker.liveconfig)."""
    _check_timers(values, raw, path)
    _check_disk_marks(values, raw, path)
    _check_timer_retention(values, raw, path)


def _shown(name: str, values: Mapping[str, Any], raw: Mapping[str, str]) -> str:
    """``key=value (set)`` or ``(default)``: what a cross-key check compared."""
    return f"{name}={values[name]} ({'set' if name in raw else 'default'})"


def _check_members(values: Mapping[str, Any], path: str) -> None:
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


def _check_ports(values: Mapping[str, Any], path: str) -> None:
    if values["listenPort"] in {p.port for p in values["dLegerPeers"]}:
        raise ConfigError(f"{path}: key 'listenPort': {values['listenPort']} is a peer port")
    if values["grpcServerPort"] in {values["listenPort"], *(p.port for p in values["dLegerPeers"])}:
        raise ConfigError(
            f"{path}: key 'grpcServerPort': {values['grpcServerPort']} is the client or a peer port"
        )


def _check_timers(values: Mapping[str, Any], raw: Mapping[str, str], path: str) -> None:
    """Raft's timers nest: a heartbeat is at least a tick, an election timeout at least two
    heartbeats (or followers would stand for election between a healthy leader's beats)."""
    tick, beat = _shown("raftTickMs", values, raw), _shown("raftHeartbeatIntervalMs", values, raw)
    if values["raftHeartbeatIntervalMs"] < values["raftTickMs"]:
        raise ConfigError(
            f"{path}: key 'raftHeartbeatIntervalMs' must be >= raftTickMs: compared {beat} with "
            f"{tick}; raise raftHeartbeatIntervalMs or lower raftTickMs"
        )
    if values["raftElectionTimeoutMs"] < 2 * values["raftHeartbeatIntervalMs"]:
        election = _shown("raftElectionTimeoutMs", values, raw)
        raise ConfigError(
            f"{path}: key 'raftElectionTimeoutMs' must be >= 2 x raftHeartbeatIntervalMs: "
            f"compared {election} with {beat}; raise raftElectionTimeoutMs to at least "
            f"{2 * values['raftHeartbeatIntervalMs']} or lower raftHeartbeatIntervalMs"
        )


def _check_disk_marks(values: Mapping[str, Any], raw: Mapping[str, str], path: str) -> None:
    """Sends are accepted again below the refusal mark, not at or above it (or a refused send
    would never be accepted again before the disk is emptied to the mark)."""
    if values["diskSpaceResumeRatio"] >= values["diskSpaceWarningLevelRatio"]:
        raise ConfigError(
            f"{path}: key 'diskSpaceResumeRatio' must be below diskSpaceWarningLevelRatio: "
            f"compared {_shown('diskSpaceResumeRatio', values, raw)} with "
            f"{_shown('diskSpaceWarningLevelRatio', values, raw)}; lower "
            "diskSpaceResumeRatio, or leave it out (then: diskSpaceWarningLevelRatio - "
            f"{RESUME_GAP_PERCENT})"
        )


def _check_advertised(values: Mapping[str, Any], path: str) -> None:
    """Addresses other processes dial (peers, redirects, the join target, a proxy) name a
    reachable host, never 0.0.0.0 or :: (bindAddress is where those go)."""
    dialled = [("dLegerPeers", p.addr) for p in values["dLegerPeers"]]
    dialled += [("dLegerPeerClientAddrs", p.addr) for p in values["dLegerPeerClientAddrs"]]
    dialled += [(k, values[k]) for k in ("dLegerJoinAddr", "advertisedClientAddr") if values[k]]
    for name, addr in dialled:
        if is_unspecified_host(addr.rpartition(":")[0]):
            raise ConfigError(
                f"{path}: key '{name}': {addr} is an every-interface address: other nodes and "
                "clients dial it, so give a routable address or name; bind every interface "
                "with bindAddress=0.0.0.0"
            )


def _check_timer_retention(values: Mapping[str, Any], raw: Mapping[str, str], path: str) -> None:
    """A timed message waits in the commitlog until its delivery time, at most
    ``timerMaxDelaySec`` after its send: retention (``fileReservedTime``) must not be allowed to
    delete its segment before then, or the broker would lose a message it accepted. (Left out,
    timerMaxDelaySec follows fileReservedTime down: _derive_defaults.)"""
    delay_s, hours = values["timerMaxDelaySec"], values["fileReservedTime"]
    if delay_s > hours * SECONDS_PER_HOUR:
        needed_hours = -(-delay_s // SECONDS_PER_HOUR)
        raise ConfigError(
            f"{path}: key 'timerMaxDelaySec' must not exceed fileReservedTime in seconds "
            f"(retention would delete timed messages before their delivery time): compared "
            f"{_shown('timerMaxDelaySec', values, raw)} with "
            f"{_shown('fileReservedTime', values, raw)} h = {hours * SECONDS_PER_HOUR} s; raise "
            f"fileReservedTime to at least {needed_hours}, or lower timerMaxDelaySec or leave it "
            "out (then: at most fileReservedTime)"
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
    remoting = values["remotingListenPort"]
    if remoting and remoting in used | {v2_plain} | {p.port for p in values["dLegerPeers"]}:
        raise ConfigError(f"{path}: key 'remotingListenPort': {remoting} is already used")


def _check_metrics_port(values: Mapping[str, Any], path: str) -> None:
    port = values["metricsPort"]
    used = {
        values["listenPort"],
        values["grpcServerPort"],
        values["grpcServerPlaintextPort"],
        values["tlsPlaintextListenPort"],
        values["remotingListenPort"],
        *(p.port for p in values["dLegerPeers"]),
    }
    if port and port in used:
        raise ConfigError(f"{path}: key 'metricsPort': {port} is already used by another port")
    socket_port = values["dLegerPeerSocketPort"]
    if socket_port and socket_port in used | {port}:
        raise ConfigError(
            f"{path}: key 'dLegerPeerSocketPort': {socket_port} is already used by another port"
        )


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


def settings_for(cfg: BrokerConfig, target: str) -> dict[str, Any]:
    """The fields of ``target`` (one of TARGETS) that keys of the table go to, from ``cfg``."""
    assert target in TARGETS, target
    fields: dict[str, Any] = {}
    for name, key in KEYS.items():
        for into in key.to:
            if into.target == target:
                assert into.field not in fields, f"two keys go to {target}.{into.field}"
                fields[into.field] = into.value_of(getattr(cfg, name))
    return fields


def node_config(cfg: BrokerConfig) -> NodeConfig:
    """The DLedger member this broker runs (dledger knows nothing of brokers): the table's
    node and store keys, and what several keys make together."""
    return SignedNodeConfig(
        **settings_for(cfg, "node"),
        store=StoreConfig(**settings_for(cfg, "store")),
        store_dir=str(cfg.dledger_dir),
        # What a joining node must share with the group (a Join with other values is refused):
        # the segment size (replicas share data positions, a snapshot carries segments as they
        # are) and the dedup window, which every member's apply uses.
        segment_size_setting="mappedFileSizeCommitLog",
        shared_settings={k: str(getattr(cfg, k)) for k in SHARED_KEYS},
        tls=cfg.tls_files if cfg.tlsEnable else None,
        credentials=cfg.inner_credentials,
        # The group feature level this broker supports: its own table's and dledger's.
        supported_feature_level=broker_features.NODE_SUPPORTED_LEVEL,
    )


def service_config(cfg: BrokerConfig) -> ServiceConfig:
    """The broker service's settings: the table's service keys, and the delay levels
    (messageDelayLevel scaled by delayLevelScale)."""
    return ServiceConfig(**settings_for(cfg, "service"), delay_levels_ms=cfg.delay_levels_ms)


def v2_settings(cfg: BrokerConfig) -> dict[str, Any]:
    """The RocketMQ 5 front end's ``V2Config`` fields (built by the caller: its module loads
    the v2 stubs, only when grpcServerPort is served)."""
    return settings_for(cfg, "v2")
