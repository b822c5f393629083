"""A pull's answer written to wire bytes by hand (broker.frontends.v1.pullwire) is the protobuf
runtime's own encoding of the same PullMessageResponse, byte for byte, and is sent as it is."""

from __future__ import annotations

import grpc
from hypothesis import given, settings
from hypothesis import strategies as st
from raftmq.broker.v1 import broker_pb2 as pb

from broker.components.pulling import PullResult, PullStatus
from broker.frontends.v1.pullwire import (
    PULL_STATUS_WIRE,
    PullAnswer,
    encode_pull_response,
    serialize_response,
    varint,
)
from rpckit import decodeguard

I64 = st.integers(-(1 << 63), (1 << 63) - 1)


@st.composite
def results(draw: st.DrawFn) -> PullResult:
    count = draw(st.integers(0, 6))
    raw = draw(st.binary(min_size=count, max_size=count * 300)) if count else b""
    return PullResult(
        draw(st.sampled_from(list(PullStatus))),
        draw(I64),
        draw(I64),
        draw(I64),
        raw,
        draw(st.lists(I64, min_size=count, max_size=count)),
        draw(st.lists(I64, min_size=count, max_size=count)),
        draw(st.booleans()),
    )


def runtime_bytes(r: PullResult, node_id: str, prefix: str) -> bytes:
    """What the front end sent before: the answer built as a protobuf object."""
    return pb.PullMessageResponse(
        status=PULL_STATUS_WIRE[r.status],
        next_begin_offset=r.next_begin_offset,
        min_offset=r.min_offset,
        max_offset=r.max_offset,
        suggest_pull_from_follower=r.suggest_pull_from_follower,
        node_id=node_id,
        raw_messages=r.raw,
        raw_queue_offsets=r.queue_offsets,
        raw_positions=r.positions,
        offset_msg_id_prefix=prefix if r.positions else "",
    ).SerializeToString()


@settings(max_examples=500, deadline=None)
@given(results(), st.text(max_size=12), st.sampled_from(["", "0A00000100002A9F"]))
def test_the_hand_written_answer_is_the_runtimes_encoding(
    r: PullResult, node_id: str, prefix: str
) -> None:
    wire = encode_pull_response(r, node_id, prefix)
    assert wire == runtime_bytes(r, node_id, prefix)
    answer = PullAnswer(wire)
    assert serialize_response(answer) is wire
    assert answer.raw_messages == r.raw and list(answer.raw_positions) == r.positions
    assert answer.node_id == node_id and answer.status == PULL_STATUS_WIRE[r.status]


@given(I64)
def test_varints_are_the_runtimes(n: int) -> None:
    # field 3 is an int64: its key (0x18) then the value's varint, left out when 0
    expected = pb.PullMessageResponse(next_begin_offset=n).SerializeToString()
    assert (b"\x18" + varint(n) if n else b"") == expected


def test_a_protobuf_answer_is_still_serialized_by_the_runtime() -> None:
    resp = pb.PullMessageResponse(status=pb.NO_NEW_MSG, node_id="n1")
    assert serialize_response(resp) == resp.SerializeToString()


def test_the_port_sends_the_answers_bytes_with_the_given_serializer() -> None:
    handler = grpc.unary_unary_rpc_method_handler(
        lambda request, context: None,
        request_deserializer=pb.PullMessageRequest.FromString,
        response_serializer=pb.PullMessageResponse.SerializeToString,
    )
    guarded = decodeguard.guard_handler(
        handler, "/raftmq.broker.v1.Broker/PullMessage", serializer=serialize_response
    )
    assert guarded.response_serializer is serialize_response
    assert guarded.response_serializer(PullAnswer(b"\x08\x01")) == b"\x08\x01"
    plain = decodeguard.guard_handler(handler, "/raftmq.broker.v1.Broker/PullMessage")
    assert plain.response_serializer is pb.PullMessageResponse.SerializeToString
