from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Entry(_message.Message):
    __slots__ = ("term", "index", "type", "body")
    TERM_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    BODY_FIELD_NUMBER: _ClassVar[int]
    term: int
    index: int
    type: int
    body: bytes
    def __init__(self, term: _Optional[int] = ..., index: _Optional[int] = ..., type: _Optional[int] = ..., body: _Optional[bytes] = ...) -> None: ...

class VoteRequest(_message.Message):
    __slots__ = ("group", "from_id", "to_id", "term", "last_log_index", "last_log_term", "pre_vote", "leadership_transfer", "last_log_chain")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    FROM_ID_FIELD_NUMBER: _ClassVar[int]
    TO_ID_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    LAST_LOG_INDEX_FIELD_NUMBER: _ClassVar[int]
    LAST_LOG_TERM_FIELD_NUMBER: _ClassVar[int]
    PRE_VOTE_FIELD_NUMBER: _ClassVar[int]
    LEADERSHIP_TRANSFER_FIELD_NUMBER: _ClassVar[int]
    LAST_LOG_CHAIN_FIELD_NUMBER: _ClassVar[int]
    group: str
    from_id: str
    to_id: str
    term: int
    last_log_index: int
    last_log_term: int
    pre_vote: bool
    leadership_transfer: bool
    last_log_chain: int
    def __init__(self, group: _Optional[str] = ..., from_id: _Optional[str] = ..., to_id: _Optional[str] = ..., term: _Optional[int] = ..., last_log_index: _Optional[int] = ..., last_log_term: _Optional[int] = ..., pre_vote: _Optional[bool] = ..., leadership_transfer: _Optional[bool] = ..., last_log_chain: _Optional[int] = ...) -> None: ...

class VoteResponse(_message.Message):
    __slots__ = ("from_id", "to_id", "term", "granted", "pre_vote", "reject_reason", "log_index", "log_term", "log_chain")
    FROM_ID_FIELD_NUMBER: _ClassVar[int]
    TO_ID_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    GRANTED_FIELD_NUMBER: _ClassVar[int]
    PRE_VOTE_FIELD_NUMBER: _ClassVar[int]
    REJECT_REASON_FIELD_NUMBER: _ClassVar[int]
    LOG_INDEX_FIELD_NUMBER: _ClassVar[int]
    LOG_TERM_FIELD_NUMBER: _ClassVar[int]
    LOG_CHAIN_FIELD_NUMBER: _ClassVar[int]
    from_id: str
    to_id: str
    term: int
    granted: bool
    pre_vote: bool
    reject_reason: str
    log_index: int
    log_term: int
    log_chain: int
    def __init__(self, from_id: _Optional[str] = ..., to_id: _Optional[str] = ..., term: _Optional[int] = ..., granted: _Optional[bool] = ..., pre_vote: _Optional[bool] = ..., reject_reason: _Optional[str] = ..., log_index: _Optional[int] = ..., log_term: _Optional[int] = ..., log_chain: _Optional[int] = ...) -> None: ...

class AppendRequest(_message.Message):
    __slots__ = ("group", "from_id", "to_id", "term", "prev_log_index", "prev_log_term", "entries", "leader_commit", "no_reply", "prev_log_chain")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    FROM_ID_FIELD_NUMBER: _ClassVar[int]
    TO_ID_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    PREV_LOG_INDEX_FIELD_NUMBER: _ClassVar[int]
    PREV_LOG_TERM_FIELD_NUMBER: _ClassVar[int]
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    LEADER_COMMIT_FIELD_NUMBER: _ClassVar[int]
    NO_REPLY_FIELD_NUMBER: _ClassVar[int]
    PREV_LOG_CHAIN_FIELD_NUMBER: _ClassVar[int]
    group: str
    from_id: str
    to_id: str
    term: int
    prev_log_index: int
    prev_log_term: int
    entries: _containers.RepeatedCompositeFieldContainer[Entry]
    leader_commit: int
    no_reply: bool
    prev_log_chain: int
    def __init__(self, group: _Optional[str] = ..., from_id: _Optional[str] = ..., to_id: _Optional[str] = ..., term: _Optional[int] = ..., prev_log_index: _Optional[int] = ..., prev_log_term: _Optional[int] = ..., entries: _Optional[_Iterable[_Union[Entry, _Mapping]]] = ..., leader_commit: _Optional[int] = ..., no_reply: _Optional[bool] = ..., prev_log_chain: _Optional[int] = ...) -> None: ...

class AppendResponse(_message.Message):
    __slots__ = ("from_id", "to_id", "term", "success", "match_index", "conflict_index", "conflict_term", "last_log_index", "rejected_index", "repairing", "match_chain", "supported_feature_level", "readers_waiting")
    FROM_ID_FIELD_NUMBER: _ClassVar[int]
    TO_ID_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    SUCCESS_FIELD_NUMBER: _ClassVar[int]
    MATCH_INDEX_FIELD_NUMBER: _ClassVar[int]
    CONFLICT_INDEX_FIELD_NUMBER: _ClassVar[int]
    CONFLICT_TERM_FIELD_NUMBER: _ClassVar[int]
    LAST_LOG_INDEX_FIELD_NUMBER: _ClassVar[int]
    REJECTED_INDEX_FIELD_NUMBER: _ClassVar[int]
    REPAIRING_FIELD_NUMBER: _ClassVar[int]
    MATCH_CHAIN_FIELD_NUMBER: _ClassVar[int]
    SUPPORTED_FEATURE_LEVEL_FIELD_NUMBER: _ClassVar[int]
    READERS_WAITING_FIELD_NUMBER: _ClassVar[int]
    from_id: str
    to_id: str
    term: int
    success: bool
    match_index: int
    conflict_index: int
    conflict_term: int
    last_log_index: int
    rejected_index: int
    repairing: bool
    match_chain: int
    supported_feature_level: int
    readers_waiting: bool
    def __init__(self, from_id: _Optional[str] = ..., to_id: _Optional[str] = ..., term: _Optional[int] = ..., success: _Optional[bool] = ..., match_index: _Optional[int] = ..., conflict_index: _Optional[int] = ..., conflict_term: _Optional[int] = ..., last_log_index: _Optional[int] = ..., rejected_index: _Optional[int] = ..., repairing: _Optional[bool] = ..., match_chain: _Optional[int] = ..., supported_feature_level: _Optional[int] = ..., readers_waiting: _Optional[bool] = ...) -> None: ...

class TimeoutNowRequest(_message.Message):
    __slots__ = ("group", "from_id", "to_id", "term")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    FROM_ID_FIELD_NUMBER: _ClassVar[int]
    TO_ID_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    group: str
    from_id: str
    to_id: str
    term: int
    def __init__(self, group: _Optional[str] = ..., from_id: _Optional[str] = ..., to_id: _Optional[str] = ..., term: _Optional[int] = ...) -> None: ...

class PeerMessage(_message.Message):
    __slots__ = ("vote_request", "vote_response", "append_request", "append_response", "timeout_now", "batch")
    VOTE_REQUEST_FIELD_NUMBER: _ClassVar[int]
    VOTE_RESPONSE_FIELD_NUMBER: _ClassVar[int]
    APPEND_REQUEST_FIELD_NUMBER: _ClassVar[int]
    APPEND_RESPONSE_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_NOW_FIELD_NUMBER: _ClassVar[int]
    BATCH_FIELD_NUMBER: _ClassVar[int]
    vote_request: VoteRequest
    vote_response: VoteResponse
    append_request: AppendRequest
    append_response: AppendResponse
    timeout_now: TimeoutNowRequest
    batch: PeerBatch
    def __init__(self, vote_request: _Optional[_Union[VoteRequest, _Mapping]] = ..., vote_response: _Optional[_Union[VoteResponse, _Mapping]] = ..., append_request: _Optional[_Union[AppendRequest, _Mapping]] = ..., append_response: _Optional[_Union[AppendResponse, _Mapping]] = ..., timeout_now: _Optional[_Union[TimeoutNowRequest, _Mapping]] = ..., batch: _Optional[_Union[PeerBatch, _Mapping]] = ...) -> None: ...

class PeerBatch(_message.Message):
    __slots__ = ("messages",)
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    messages: _containers.RepeatedCompositeFieldContainer[PeerMessage]
    def __init__(self, messages: _Optional[_Iterable[_Union[PeerMessage, _Mapping]]] = ...) -> None: ...

class PeerAck(_message.Message):
    __slots__ = ("received",)
    RECEIVED_FIELD_NUMBER: _ClassVar[int]
    received: int
    def __init__(self, received: _Optional[int] = ...) -> None: ...

class SnapshotHeader(_message.Message):
    __slots__ = ("term", "snapshot_index", "snapshot_term", "config", "base_index", "base_term", "start_position", "segment_size_bytes", "base_chain", "snapshot_chain")
    TERM_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_INDEX_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_TERM_FIELD_NUMBER: _ClassVar[int]
    CONFIG_FIELD_NUMBER: _ClassVar[int]
    BASE_INDEX_FIELD_NUMBER: _ClassVar[int]
    BASE_TERM_FIELD_NUMBER: _ClassVar[int]
    START_POSITION_FIELD_NUMBER: _ClassVar[int]
    SEGMENT_SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    BASE_CHAIN_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_CHAIN_FIELD_NUMBER: _ClassVar[int]
    term: int
    snapshot_index: int
    snapshot_term: int
    config: bytes
    base_index: int
    base_term: int
    start_position: int
    segment_size_bytes: int
    base_chain: int
    snapshot_chain: int
    def __init__(self, term: _Optional[int] = ..., snapshot_index: _Optional[int] = ..., snapshot_term: _Optional[int] = ..., config: _Optional[bytes] = ..., base_index: _Optional[int] = ..., base_term: _Optional[int] = ..., start_position: _Optional[int] = ..., segment_size_bytes: _Optional[int] = ..., base_chain: _Optional[int] = ..., snapshot_chain: _Optional[int] = ...) -> None: ...

class SnapshotData(_message.Message):
    __slots__ = ("name", "offset", "data", "zeros")
    NAME_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    ZEROS_FIELD_NUMBER: _ClassVar[int]
    name: str
    offset: int
    data: bytes
    zeros: int
    def __init__(self, name: _Optional[str] = ..., offset: _Optional[int] = ..., data: _Optional[bytes] = ..., zeros: _Optional[int] = ...) -> None: ...

class SnapshotTrailer(_message.Message):
    __slots__ = ("total_bytes", "sha256")
    TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    SHA256_FIELD_NUMBER: _ClassVar[int]
    total_bytes: int
    sha256: bytes
    def __init__(self, total_bytes: _Optional[int] = ..., sha256: _Optional[bytes] = ...) -> None: ...

class SnapshotChunk(_message.Message):
    __slots__ = ("header", "data", "trailer")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    TRAILER_FIELD_NUMBER: _ClassVar[int]
    header: SnapshotHeader
    data: SnapshotData
    trailer: SnapshotTrailer
    def __init__(self, header: _Optional[_Union[SnapshotHeader, _Mapping]] = ..., data: _Optional[_Union[SnapshotData, _Mapping]] = ..., trailer: _Optional[_Union[SnapshotTrailer, _Mapping]] = ...) -> None: ...

class SnapshotReply(_message.Message):
    __slots__ = ("accepted", "received_bytes")
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    RECEIVED_BYTES_FIELD_NUMBER: _ClassVar[int]
    accepted: bool
    received_bytes: int
    def __init__(self, accepted: _Optional[bool] = ..., received_bytes: _Optional[int] = ...) -> None: ...

class JoinRequest(_message.Message):
    __slots__ = ("group", "node_id", "peer_addr", "client_addr", "shared_settings", "supported_feature_level")
    class SharedSettingsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    GROUP_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    PEER_ADDR_FIELD_NUMBER: _ClassVar[int]
    CLIENT_ADDR_FIELD_NUMBER: _ClassVar[int]
    SHARED_SETTINGS_FIELD_NUMBER: _ClassVar[int]
    SUPPORTED_FEATURE_LEVEL_FIELD_NUMBER: _ClassVar[int]
    group: str
    node_id: str
    peer_addr: str
    client_addr: str
    shared_settings: _containers.ScalarMap[str, str]
    supported_feature_level: int
    def __init__(self, group: _Optional[str] = ..., node_id: _Optional[str] = ..., peer_addr: _Optional[str] = ..., client_addr: _Optional[str] = ..., shared_settings: _Optional[_Mapping[str, str]] = ..., supported_feature_level: _Optional[int] = ...) -> None: ...

class JoinResponse(_message.Message):
    __slots__ = ("members", "leader_id", "added")
    MEMBERS_FIELD_NUMBER: _ClassVar[int]
    LEADER_ID_FIELD_NUMBER: _ClassVar[int]
    ADDED_FIELD_NUMBER: _ClassVar[int]
    members: _containers.RepeatedCompositeFieldContainer[Member]
    leader_id: str
    added: bool
    def __init__(self, members: _Optional[_Iterable[_Union[Member, _Mapping]]] = ..., leader_id: _Optional[str] = ..., added: _Optional[bool] = ...) -> None: ...

class HoldingsRequest(_message.Message):
    __slots__ = ("group",)
    GROUP_FIELD_NUMBER: _ClassVar[int]
    group: str
    def __init__(self, group: _Optional[str] = ...) -> None: ...

class PeerSocketRequest(_message.Message):
    __slots__ = ("group", "max_version")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    MAX_VERSION_FIELD_NUMBER: _ClassVar[int]
    group: str
    max_version: int
    def __init__(self, group: _Optional[str] = ..., max_version: _Optional[int] = ...) -> None: ...

class PeerSocketInfo(_message.Message):
    __slots__ = ("port", "max_version")
    PORT_FIELD_NUMBER: _ClassVar[int]
    MAX_VERSION_FIELD_NUMBER: _ClassVar[int]
    port: int
    max_version: int
    def __init__(self, port: _Optional[int] = ..., max_version: _Optional[int] = ...) -> None: ...

class HoldingsResponse(_message.Message):
    __slots__ = ("first_index", "last_index", "last_term", "last_chain", "term", "repairing", "repair_target", "cut_from", "leader_id", "config", "config_index", "commit_index")
    FIRST_INDEX_FIELD_NUMBER: _ClassVar[int]
    LAST_INDEX_FIELD_NUMBER: _ClassVar[int]
    LAST_TERM_FIELD_NUMBER: _ClassVar[int]
    LAST_CHAIN_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    REPAIRING_FIELD_NUMBER: _ClassVar[int]
    REPAIR_TARGET_FIELD_NUMBER: _ClassVar[int]
    CUT_FROM_FIELD_NUMBER: _ClassVar[int]
    LEADER_ID_FIELD_NUMBER: _ClassVar[int]
    CONFIG_FIELD_NUMBER: _ClassVar[int]
    CONFIG_INDEX_FIELD_NUMBER: _ClassVar[int]
    COMMIT_INDEX_FIELD_NUMBER: _ClassVar[int]
    first_index: int
    last_index: int
    last_term: int
    last_chain: int
    term: int
    repairing: bool
    repair_target: int
    cut_from: int
    leader_id: str
    config: bytes
    config_index: int
    commit_index: int
    def __init__(self, first_index: _Optional[int] = ..., last_index: _Optional[int] = ..., last_term: _Optional[int] = ..., last_chain: _Optional[int] = ..., term: _Optional[int] = ..., repairing: _Optional[bool] = ..., repair_target: _Optional[int] = ..., cut_from: _Optional[int] = ..., leader_id: _Optional[str] = ..., config: _Optional[bytes] = ..., config_index: _Optional[int] = ..., commit_index: _Optional[int] = ...) -> None: ...

class AppendEntriesRequest(_message.Message):
    __slots__ = ("group", "bodies", "type")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    BODIES_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    group: str
    bodies: _containers.RepeatedScalarFieldContainer[bytes]
    type: int
    def __init__(self, group: _Optional[str] = ..., bodies: _Optional[_Iterable[bytes]] = ..., type: _Optional[int] = ...) -> None: ...

class AppendEntriesResponse(_message.Message):
    __slots__ = ("first_index", "last_index", "term")
    FIRST_INDEX_FIELD_NUMBER: _ClassVar[int]
    LAST_INDEX_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    first_index: int
    last_index: int
    term: int
    def __init__(self, first_index: _Optional[int] = ..., last_index: _Optional[int] = ..., term: _Optional[int] = ...) -> None: ...

class GetRequest(_message.Message):
    __slots__ = ("group", "index", "max_count", "max_bytes")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    MAX_COUNT_FIELD_NUMBER: _ClassVar[int]
    MAX_BYTES_FIELD_NUMBER: _ClassVar[int]
    group: str
    index: int
    max_count: int
    max_bytes: int
    def __init__(self, group: _Optional[str] = ..., index: _Optional[int] = ..., max_count: _Optional[int] = ..., max_bytes: _Optional[int] = ...) -> None: ...

class GetResponse(_message.Message):
    __slots__ = ("entries", "commit_index")
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    COMMIT_INDEX_FIELD_NUMBER: _ClassVar[int]
    entries: _containers.RepeatedCompositeFieldContainer[Entry]
    commit_index: int
    def __init__(self, entries: _Optional[_Iterable[_Union[Entry, _Mapping]]] = ..., commit_index: _Optional[int] = ...) -> None: ...

class MetadataRequest(_message.Message):
    __slots__ = ("group", "chain_index")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    CHAIN_INDEX_FIELD_NUMBER: _ClassVar[int]
    group: str
    chain_index: int
    def __init__(self, group: _Optional[str] = ..., chain_index: _Optional[int] = ...) -> None: ...

class PeerProgress(_message.Message):
    __slots__ = ("id", "match_index", "next_index")
    ID_FIELD_NUMBER: _ClassVar[int]
    MATCH_INDEX_FIELD_NUMBER: _ClassVar[int]
    NEXT_INDEX_FIELD_NUMBER: _ClassVar[int]
    id: str
    match_index: int
    next_index: int
    def __init__(self, id: _Optional[str] = ..., match_index: _Optional[int] = ..., next_index: _Optional[int] = ...) -> None: ...

class MetadataResponse(_message.Message):
    __slots__ = ("group", "self_id", "role", "term", "leader_id", "leader_client_addr", "commit_index", "applied_index", "first_index", "last_index", "flushed_index", "peers", "store_path", "refusals", "disk_total_bytes", "disk_free_bytes", "repairing", "promised_index", "repairs_completed", "commit_chain", "chain_index", "chain", "chain_known", "corruption_found", "chain_mismatches", "committed_repairs", "chain_check_mismatches", "scrub_last_pass_end_ms", "scrub_bytes_verified", "derived_mismatches", "release", "feature_level", "supported_feature_level", "state_rebuilds", "rewind_restarts_recent")
    class RefusalsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    class CorruptionFoundEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    class DerivedMismatchesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    class StateRebuildsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    GROUP_FIELD_NUMBER: _ClassVar[int]
    SELF_ID_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    LEADER_ID_FIELD_NUMBER: _ClassVar[int]
    LEADER_CLIENT_ADDR_FIELD_NUMBER: _ClassVar[int]
    COMMIT_INDEX_FIELD_NUMBER: _ClassVar[int]
    APPLIED_INDEX_FIELD_NUMBER: _ClassVar[int]
    FIRST_INDEX_FIELD_NUMBER: _ClassVar[int]
    LAST_INDEX_FIELD_NUMBER: _ClassVar[int]
    FLUSHED_INDEX_FIELD_NUMBER: _ClassVar[int]
    PEERS_FIELD_NUMBER: _ClassVar[int]
    STORE_PATH_FIELD_NUMBER: _ClassVar[int]
    REFUSALS_FIELD_NUMBER: _ClassVar[int]
    DISK_TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    DISK_FREE_BYTES_FIELD_NUMBER: _ClassVar[int]
    REPAIRING_FIELD_NUMBER: _ClassVar[int]
    PROMISED_INDEX_FIELD_NUMBER: _ClassVar[int]
    REPAIRS_COMPLETED_FIELD_NUMBER: _ClassVar[int]
    COMMIT_CHAIN_FIELD_NUMBER: _ClassVar[int]
    CHAIN_INDEX_FIELD_NUMBER: _ClassVar[int]
    CHAIN_FIELD_NUMBER: _ClassVar[int]
    CHAIN_KNOWN_FIELD_NUMBER: _ClassVar[int]
    CORRUPTION_FOUND_FIELD_NUMBER: _ClassVar[int]
    CHAIN_MISMATCHES_FIELD_NUMBER: _ClassVar[int]
    COMMITTED_REPAIRS_FIELD_NUMBER: _ClassVar[int]
    CHAIN_CHECK_MISMATCHES_FIELD_NUMBER: _ClassVar[int]
    SCRUB_LAST_PASS_END_MS_FIELD_NUMBER: _ClassVar[int]
    SCRUB_BYTES_VERIFIED_FIELD_NUMBER: _ClassVar[int]
    DERIVED_MISMATCHES_FIELD_NUMBER: _ClassVar[int]
    RELEASE_FIELD_NUMBER: _ClassVar[int]
    FEATURE_LEVEL_FIELD_NUMBER: _ClassVar[int]
    SUPPORTED_FEATURE_LEVEL_FIELD_NUMBER: _ClassVar[int]
    STATE_REBUILDS_FIELD_NUMBER: _ClassVar[int]
    REWIND_RESTARTS_RECENT_FIELD_NUMBER: _ClassVar[int]
    group: str
    self_id: str
    role: str
    term: int
    leader_id: str
    leader_client_addr: str
    commit_index: int
    applied_index: int
    first_index: int
    last_index: int
    flushed_index: int
    peers: _containers.RepeatedCompositeFieldContainer[PeerProgress]
    store_path: str
    refusals: _containers.ScalarMap[str, int]
    disk_total_bytes: int
    disk_free_bytes: int
    repairing: bool
    promised_index: int
    repairs_completed: int
    commit_chain: int
    chain_index: int
    chain: int
    chain_known: bool
    corruption_found: _containers.ScalarMap[str, int]
    chain_mismatches: int
    committed_repairs: int
    chain_check_mismatches: int
    scrub_last_pass_end_ms: int
    scrub_bytes_verified: int
    derived_mismatches: _containers.ScalarMap[str, int]
    release: str
    feature_level: int
    supported_feature_level: int
    state_rebuilds: _containers.ScalarMap[str, int]
    rewind_restarts_recent: int
    def __init__(self, group: _Optional[str] = ..., self_id: _Optional[str] = ..., role: _Optional[str] = ..., term: _Optional[int] = ..., leader_id: _Optional[str] = ..., leader_client_addr: _Optional[str] = ..., commit_index: _Optional[int] = ..., applied_index: _Optional[int] = ..., first_index: _Optional[int] = ..., last_index: _Optional[int] = ..., flushed_index: _Optional[int] = ..., peers: _Optional[_Iterable[_Union[PeerProgress, _Mapping]]] = ..., store_path: _Optional[str] = ..., refusals: _Optional[_Mapping[str, int]] = ..., disk_total_bytes: _Optional[int] = ..., disk_free_bytes: _Optional[int] = ..., repairing: _Optional[bool] = ..., promised_index: _Optional[int] = ..., repairs_completed: _Optional[int] = ..., commit_chain: _Optional[int] = ..., chain_index: _Optional[int] = ..., chain: _Optional[int] = ..., chain_known: _Optional[bool] = ..., corruption_found: _Optional[_Mapping[str, int]] = ..., chain_mismatches: _Optional[int] = ..., committed_repairs: _Optional[int] = ..., chain_check_mismatches: _Optional[int] = ..., scrub_last_pass_end_ms: _Optional[int] = ..., scrub_bytes_verified: _Optional[int] = ..., derived_mismatches: _Optional[_Mapping[str, int]] = ..., release: _Optional[str] = ..., feature_level: _Optional[int] = ..., supported_feature_level: _Optional[int] = ..., state_rebuilds: _Optional[_Mapping[str, int]] = ..., rewind_restarts_recent: _Optional[int] = ...) -> None: ...

class TransferLeadershipRequest(_message.Message):
    __slots__ = ("group", "target_id")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    TARGET_ID_FIELD_NUMBER: _ClassVar[int]
    group: str
    target_id: str
    def __init__(self, group: _Optional[str] = ..., target_id: _Optional[str] = ...) -> None: ...

class TransferLeadershipResponse(_message.Message):
    __slots__ = ("leader_id", "term")
    LEADER_ID_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    leader_id: str
    term: int
    def __init__(self, leader_id: _Optional[str] = ..., term: _Optional[int] = ...) -> None: ...

class Member(_message.Message):
    __slots__ = ("id", "role", "peer_addr", "client_addr", "match_index", "recent_active", "supported_feature_level")
    ID_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    PEER_ADDR_FIELD_NUMBER: _ClassVar[int]
    CLIENT_ADDR_FIELD_NUMBER: _ClassVar[int]
    MATCH_INDEX_FIELD_NUMBER: _ClassVar[int]
    RECENT_ACTIVE_FIELD_NUMBER: _ClassVar[int]
    SUPPORTED_FEATURE_LEVEL_FIELD_NUMBER: _ClassVar[int]
    id: str
    role: str
    peer_addr: str
    client_addr: str
    match_index: int
    recent_active: bool
    supported_feature_level: int
    def __init__(self, id: _Optional[str] = ..., role: _Optional[str] = ..., peer_addr: _Optional[str] = ..., client_addr: _Optional[str] = ..., match_index: _Optional[int] = ..., recent_active: _Optional[bool] = ..., supported_feature_level: _Optional[int] = ...) -> None: ...

class ListMembersRequest(_message.Message):
    __slots__ = ("group",)
    GROUP_FIELD_NUMBER: _ClassVar[int]
    group: str
    def __init__(self, group: _Optional[str] = ...) -> None: ...

class ListMembersResponse(_message.Message):
    __slots__ = ("members", "leader_id", "config_index", "config_committed", "term", "feature_level")
    MEMBERS_FIELD_NUMBER: _ClassVar[int]
    LEADER_ID_FIELD_NUMBER: _ClassVar[int]
    CONFIG_INDEX_FIELD_NUMBER: _ClassVar[int]
    CONFIG_COMMITTED_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    FEATURE_LEVEL_FIELD_NUMBER: _ClassVar[int]
    members: _containers.RepeatedCompositeFieldContainer[Member]
    leader_id: str
    config_index: int
    config_committed: bool
    term: int
    feature_level: int
    def __init__(self, members: _Optional[_Iterable[_Union[Member, _Mapping]]] = ..., leader_id: _Optional[str] = ..., config_index: _Optional[int] = ..., config_committed: _Optional[bool] = ..., term: _Optional[int] = ..., feature_level: _Optional[int] = ...) -> None: ...

class ChangeMemberRequest(_message.Message):
    __slots__ = ("group", "kind", "node_id", "peer_addr", "client_addr")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    PEER_ADDR_FIELD_NUMBER: _ClassVar[int]
    CLIENT_ADDR_FIELD_NUMBER: _ClassVar[int]
    group: str
    kind: str
    node_id: str
    peer_addr: str
    client_addr: str
    def __init__(self, group: _Optional[str] = ..., kind: _Optional[str] = ..., node_id: _Optional[str] = ..., peer_addr: _Optional[str] = ..., client_addr: _Optional[str] = ...) -> None: ...

class ChangeMemberResponse(_message.Message):
    __slots__ = ("members", "index", "term")
    MEMBERS_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    members: _containers.RepeatedCompositeFieldContainer[Member]
    index: int
    term: int
    def __init__(self, members: _Optional[_Iterable[_Union[Member, _Mapping]]] = ..., index: _Optional[int] = ..., term: _Optional[int] = ...) -> None: ...

class SetFeatureLevelRequest(_message.Message):
    __slots__ = ("group", "level")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    LEVEL_FIELD_NUMBER: _ClassVar[int]
    group: str
    level: int
    def __init__(self, group: _Optional[str] = ..., level: _Optional[int] = ...) -> None: ...

class SetFeatureLevelResponse(_message.Message):
    __slots__ = ("level", "index")
    LEVEL_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    level: int
    index: int
    def __init__(self, level: _Optional[int] = ..., index: _Optional[int] = ...) -> None: ...
