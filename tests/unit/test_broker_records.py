"""The broker's record vocabulary (broker.state.records) and the state machine's handler table:
every record type has exactly one apply handler, every record type's codec round-trips, and the
bytes of the topic and offsets records are pinned (docs/FORMAT.md, "Broker: control records")."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.state import brokerconf, records
from broker.state import machine as state
from broker.state.auth.records import OPS as AUTH_OPS
from broker.state.auth.records import decode_auth_record, encode_auth_record
from broker.state.delayrules import decode_schedule_header, encode_schedule_header
from broker.state.message import Message, decode_message, encode_batch
from broker.state.popstate import PopRecord, decode_pop_record, encode_pop_record
from broker.state.records import (
    ENTRY_AUTH,
    ENTRY_MESSAGES,
    ENTRY_OFFSETS,
    ENTRY_POP,
    ENTRY_SCHEDULE,
    ENTRY_SUBGROUP,
    ENTRY_TIMER,
    ENTRY_TOPIC,
    ENTRY_TXN,
    I64_MAX,
    MAX_QUEUE_NUMS,
    MAX_TOPIC_OWNER_BYTES,
    RECORD_TYPES,
    TOPIC_CREATE_IF_ABSENT,
    TOPIC_DELETE,
    TOPIC_MESSAGE_TYPES,
    TOPIC_UPSERT,
    OffsetKey,
    TopicConfig,
    decode_offsets_record,
    decode_offsets_record_owned,
    decode_topic_record,
    encode_offsets_record,
    encode_topic_record,
)
from broker.state.subgroups import (
    BACKOFF_CUSTOMIZED,
    BACKOFF_EXPONENTIAL,
    MAX_ATTEMPTS_LIMIT,
    MAX_BACKOFF_MS,
    MAX_BACKOFF_STEPS,
    MAX_MULTIPLIER_MILLI,
    MAX_OWNER_CHARS,
    MIN_MULTIPLIER_MILLI,
    Backoff,
    SubGroup,
    decode_subgroup_record,
    encode_subgroup_record,
)
from broker.state.subgroups import OP_CREATE_IF_ABSENT as SUBGROUP_CREATE_IF_ABSENT
from broker.state.subgroups import OP_DELETE as SUBGROUP_DELETE
from broker.state.subgroups import OP_UPSERT as SUBGROUP_UPSERT
from broker.state.timerrules import (
    HOP_RECORD_SIZE,
    MAX_TIMER_LEVELS,
    decode_hop,
    decode_timer_header,
    encode_hop,
    encode_timer_header,
)
from broker.state.transactions import (
    MAX_CHECKS,
    MAX_TIME_MS,
    OP_CHECK,
    OP_COMMIT,
    OP_DISCARD,
    OP_PREPARE,
    OP_ROLLBACK,
    TxnRecord,
    decode_txn_record,
    encode_checks,
    encode_commit,
    encode_prepare,
    encode_rollback,
)

# ------------------------------------------------------------------------- handler table


def test_every_record_type_has_exactly_one_apply_handler() -> None:
    assert set(state.APPLY_HANDLERS) == set(RECORD_TYPES)
    handlers = list(state.APPLY_HANDLERS.values())
    assert len(set(handlers)) == len(handlers), "one handler serves two record types"
    for handler in handlers:
        assert getattr(state.BrokerStateMachine, handler.__name__) is handler


def test_the_handler_table_refuses_a_type_twice_a_missing_type_and_an_unknown_one() -> None:
    sm = state.BrokerStateMachine
    pairs: list[tuple[int, state.ApplyHandler]] = [
        (t, sm._apply_auth) for t in sorted(RECORD_TYPES)
    ]
    assert state._handler_table(pairs).keys() == RECORD_TYPES.keys()
    with pytest.raises(AssertionError, match="two apply handlers"):
        state._handler_table([*pairs, (ENTRY_TOPIC, sm._apply_topic)])
    with pytest.raises(AssertionError, match=rf"\[{ENTRY_TXN}\] without one"):
        state._handler_table([p for p in pairs if p[0] != ENTRY_TXN])
    with pytest.raises(AssertionError, match=r"\[99\] unknown"):
        state._handler_table([*pairs, (99, sm._apply_auth)])


def test_record_types_are_in_dledgers_application_range_and_named_once() -> None:
    from dledger.log import APPLICATION_TYPE_MIN, ENTRY_TYPE_MAX

    assert all(APPLICATION_TYPE_MIN <= t <= ENTRY_TYPE_MAX for t in RECORD_TYPES)
    names = [n for n in dir(records) if n.startswith("ENTRY_")]
    assert sorted(getattr(records, n) for n in names) == sorted(RECORD_TYPES)
    assert len(set(RECORD_TYPES.values())) == len(RECORD_TYPES)


# ------------------------------------------------------------------------- pinned bytes
# Written by the codecs before they moved out of broker/state/machine.py: the format is on disk.

PINNED_TOPIC_RECORDS = [
    (
        TOPIC_UPSERT,
        TopicConfig("TopicA", 8, 4, 6),
        "010100000008000000040000000606546f70696341",
    ),
    (
        TOPIC_CREATE_IF_ABSENT,
        TopicConfig("Fifo_1", 2, 2, 6, "FIFO"),
        "0102000000020000000200000006064669666f5f3102",
    ),
    (
        TOPIC_UPSERT,
        TopicConfig("Own", 1, 1, 4, "MIXED", "alice"),
        "0201000000010000000100000004034f776e0005616c696365",
    ),
    (TOPIC_DELETE, TopicConfig("TopicA"), "010300000008000000080000000606546f70696341"),
]


@pytest.mark.parametrize(("op", "topic", "hex_bytes"), PINNED_TOPIC_RECORDS)
def test_topic_records_keep_their_bytes(op: int, topic: TopicConfig, hex_bytes: str) -> None:
    assert encode_topic_record(op, topic).hex() == hex_bytes
    assert decode_topic_record(bytes.fromhex(hex_bytes)) == (op, topic)


def test_offsets_records_keep_their_bytes() -> None:
    v1 = {("g1", "TopicA", 0): 5, ("g1", "TopicA", 3): 7, ("g2", "B", 1): 1 << 40}
    assert encode_offsets_record(v1).hex() == (
        "010000000202673106546f706963410002000000000000000000000005000000030000000000000007"
        "02673201420001000000010000010000000000"
    )
    v2 = {("g1", "TopicA", 0): 5, ("g2", "B", 1): 9}
    raw = encode_offsets_record(v2, {"g2": "bob"})
    assert raw.hex() == (
        "020000000202673106546f7069634100000100000000000000000000000502673201420362"
        "6f620001000000010000000000000009"
    )
    assert decode_offsets_record_owned(raw) == (v2, {"g2": "bob"})


# ------------------------------------------------------------------------- round trips

_NAME_CHARS = "%|abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-"
topic_names = st.text(alphabet=_NAME_CHARS, min_size=1, max_size=127)
group_names = st.text(alphabet=_NAME_CHARS, min_size=1, max_size=255)
owners = st.text(alphabet=st.characters(codec="utf-8"), min_size=1, max_size=60).filter(
    lambda s: len(s.encode()) <= MAX_TOPIC_OWNER_BYTES
)
i32 = st.integers(-(1 << 31), (1 << 31) - 1)
i64 = st.integers(-(1 << 63), I64_MAX)
u63 = st.integers(0, I64_MAX)
queue_ids = st.integers(0, MAX_QUEUE_NUMS - 1)
FEW = settings(max_examples=60, deadline=None)

topics = st.builds(
    TopicConfig,
    name=topic_names,
    read_queue_nums=st.integers(1, MAX_QUEUE_NUMS),
    write_queue_nums=st.integers(1, MAX_QUEUE_NUMS),
    perm=st.integers(0, 7),
    message_type=st.sampled_from(TOPIC_MESSAGE_TYPES),
    owner=st.one_of(st.just(""), owners),
)

messages = st.builds(
    Message,
    topic=topic_names,
    queue_id=queue_ids,
    body=st.binary(min_size=1, max_size=64),
    tags=st.text(alphabet=_NAME_CHARS, max_size=10),
    keys=st.lists(st.text(alphabet=_NAME_CHARS, min_size=1, max_size=10), max_size=3).map(tuple),
    store_timestamp_ms=st.integers(0, records.MAX_STORE_TIMESTAMP_MS),
    uniq_id=st.binary(min_size=16, max_size=16).map(lambda b: b.hex().upper()),
)


@FEW
@given(st.lists(messages, min_size=1, max_size=5))
def test_message_batches_round_trip(batch: list[Message]) -> None:
    body, offsets = encode_batch(batch)
    assert [decode_message(body, at) for at in offsets] == batch


@FEW
@given(
    st.dictionaries(st.tuples(group_names, topic_names, i32), u63, min_size=1, max_size=12),
    st.dictionaries(group_names, st.one_of(st.just(""), owners), max_size=4),
)
def test_offsets_records_round_trip(offsets: dict[OffsetKey, int], owners: dict[str, str]) -> None:
    raw = encode_offsets_record(offsets, owners)
    groups = {g for g, _, _ in offsets}
    named = {g: o for g, o in owners.items() if o and g in groups}
    assert decode_offsets_record_owned(raw) == (offsets, named)
    assert decode_offsets_record(raw) == offsets
    assert raw[0] == (records.OFFSETS_RECORD_VERSION_OWNED if named else records.CONTROL_VERSION)
    assert encode_offsets_record(offsets, named) == raw  # one encoding per content


@FEW
@given(st.sampled_from([TOPIC_UPSERT, TOPIC_CREATE_IF_ABSENT, TOPIC_DELETE]), topics)
def test_topic_records_round_trip(op: int, topic: TopicConfig) -> None:
    raw = encode_topic_record(op, topic)
    assert decode_topic_record(raw) == (op, topic)
    assert raw[0] == (records.TOPIC_RECORD_VERSION_OWNED if topic.owner else 1)


@FEW
@given(
    st.integers(1, 255),
    st.integers(0, I64_MAX - 1),
    st.integers(1, 1 << 40),
    st.lists(messages, max_size=3),
)
def test_schedule_records_round_trip(
    level: int, from_offset: int, span: int, copies: list[Message]
) -> None:
    to_offset = min(from_offset + span, I64_MAX)
    batch = encode_batch(copies)[0] if copies else b""
    raw = encode_schedule_header(level, from_offset, to_offset) + batch
    assert decode_schedule_header(raw) == (level, from_offset, to_offset)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(1 << 53), 1 << 53) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=12,
)


@FEW
@given(st.sampled_from(sorted(AUTH_OPS)), st.dictionaries(st.text(max_size=12), json_values))
def test_auth_records_round_trip(op: int, doc: dict[str, Any]) -> None:
    assert decode_auth_record(encode_auth_record(op, doc)) == (op, doc)


pairs = st.lists(st.tuples(i64, i64), max_size=6).map(tuple)
pop_records = st.builds(
    PopRecord,
    op=st.integers(1, 7),
    group=group_names,
    topic=topic_names,
    queue_id=i32,
    now_ms=i64,
    deadline_ms=i64,
    from_offset=i64,
    to_offset=i64,
    items=pairs,
    retakes=pairs,
)


@FEW
@given(pop_records)
def test_pop_records_round_trip(record: PopRecord) -> None:
    assert decode_pop_record(encode_pop_record(record)) == record


backoffs = st.one_of(
    st.builds(
        Backoff,
        kind=st.just(BACKOFF_CUSTOMIZED),
        steps_ms=st.lists(
            st.integers(0, MAX_BACKOFF_MS), min_size=1, max_size=MAX_BACKOFF_STEPS
        ).map(tuple),
    ),
    st.tuples(
        st.integers(0, MAX_BACKOFF_MS),
        st.integers(0, MAX_BACKOFF_MS),
        st.integers(MIN_MULTIPLIER_MILLI, MAX_MULTIPLIER_MILLI),
    ).map(lambda t: Backoff(BACKOFF_EXPONENTIAL, (), min(t[:2]), max(t[:2]), t[2])),
)
subgroups = st.builds(
    SubGroup,
    name=group_names,
    fifo=st.booleans(),
    max_attempts=st.integers(1, MAX_ATTEMPTS_LIMIT),
    backoff=backoffs,
    owner=st.one_of(st.just(""), owners.filter(lambda s: len(s.encode()) <= MAX_OWNER_CHARS)),
)


@FEW
@given(st.sampled_from([SUBGROUP_UPSERT, SUBGROUP_CREATE_IF_ABSENT, SUBGROUP_DELETE]), subgroups)
def test_subgroup_records_round_trip(op: int, group: SubGroup) -> None:
    assert decode_subgroup_record(encode_subgroup_record(op, group)) == (op, group)


hops = st.tuples(
    st.integers(0, MAX_TIMER_LEVELS - 1),
    st.integers(0, (1 << 64) - 1),
    st.integers(HOP_RECORD_SIZE + 1, (1 << 32) - 1),
    u63,
)


@FEW
@given(
    st.integers(0, MAX_TIMER_LEVELS - 1),
    st.integers(0, 1 << 50),
    u63,
    st.lists(hops, max_size=4),
    st.lists(messages, max_size=2),
)
def test_timer_records_round_trip(
    level: int,
    from_offset: int,
    now_ms: int,
    hop_rows: list[tuple[int, int, int, int]],
    copies: list[Message],
) -> None:
    to_offset = from_offset + len(hop_rows) + len(copies) + 1
    head = encode_timer_header(level, from_offset, to_offset, now_ms, len(hop_rows))
    raw = head + b"".join(encode_hop(*h) for h in hop_rows)
    raw += encode_batch(copies)[0] if copies else b""
    assert decode_timer_header(raw) == (level, from_offset, to_offset, now_ms, len(hop_rows))
    at = len(head)
    assert [decode_hop(raw, at + i * HOP_RECORD_SIZE) for i in range(len(hop_rows))] == hop_rows


def _txn_case(draw: st.DrawFn) -> tuple[bytes, TxnRecord, bytes]:
    """A record, what it decodes to, and the batch it carries (b"": none)."""
    op = draw(st.sampled_from([OP_PREPARE, OP_COMMIT, OP_ROLLBACK, OP_CHECK, OP_DISCARD]))
    batch = encode_batch([draw(messages)])[0]
    if op == OP_PREPARE:
        topic, queue_id = draw(topic_names), draw(queue_ids)
        raw = encode_prepare(topic, queue_id, batch)
        return raw, TxnRecord(op, topic, queue_id, batch_at=len(raw) - len(batch)), batch
    position = draw(u63)
    if op == OP_COMMIT:
        raw = encode_commit(position, batch)
        return raw, TxnRecord(op, items=((position, 0),), batch_at=len(raw) - len(batch)), batch
    if op == OP_ROLLBACK:
        return encode_rollback(position), TxnRecord(op, items=((position, 0),)), b""
    now_ms = draw(st.integers(0, MAX_TIME_MS))
    items = tuple(draw(st.lists(st.tuples(u63, st.integers(0, MAX_CHECKS)), min_size=1)))
    return encode_checks(op, now_ms, items), TxnRecord(op, now_ms=now_ms, items=items), b""


txn_cases: Callable[[], st.SearchStrategy[tuple[bytes, TxnRecord, bytes]]] = st.composite(_txn_case)


@FEW
@given(txn_cases())
def test_txn_records_round_trip(case: tuple[bytes, TxnRecord, bytes]) -> None:
    raw, record, batch = case
    decoded = decode_txn_record(raw)
    assert decoded == record
    assert raw[decoded.batch_at :] == batch if decoded.batch_at else not batch


@given(
    st.sampled_from([brokerconf.OP_SET, brokerconf.OP_CLEAR]),
    st.from_regex(r"[A-Za-z][A-Za-z0-9]{0,63}", fullmatch=True),
    st.text(st.characters(blacklist_characters="\r\n", blacklist_categories=("Cs",)), max_size=300),
)
@settings(max_examples=200, deadline=None)
def test_broker_config_records_round_trip(op: int, key: str, value: str) -> None:
    value = value if op == brokerconf.OP_SET else ""
    raw = brokerconf.encode_record(op, key, value)
    assert brokerconf.decode_record(raw) == (op, key, value)
    for cut in range(len(raw)):  # every truncation is refused, never misread
        with pytest.raises(brokerconf.InvalidConfigRecordError):
            brokerconf.decode_record(raw[:cut])


# Record type -> the round-trip test of its codec: a new record type needs one here.
ROUND_TRIPS = {
    records.ENTRY_BROKER_CONFIG: test_broker_config_records_round_trip,
    ENTRY_MESSAGES: test_message_batches_round_trip,
    ENTRY_OFFSETS: test_offsets_records_round_trip,
    ENTRY_TOPIC: test_topic_records_round_trip,
    ENTRY_SCHEDULE: test_schedule_records_round_trip,
    ENTRY_AUTH: test_auth_records_round_trip,
    ENTRY_POP: test_pop_records_round_trip,
    ENTRY_SUBGROUP: test_subgroup_records_round_trip,
    ENTRY_TIMER: test_timer_records_round_trip,
    ENTRY_TXN: test_txn_records_round_trip,
}


def test_every_record_type_has_a_round_trip_test() -> None:
    assert set(ROUND_TRIPS) == set(RECORD_TYPES)
