"""The demo's failover figure: from the kill to the first send the NEW leader acknowledged.
An answer the old leader sent just before it died, arriving after the kill, once made the
demo print "1 ms"."""

from __future__ import annotations

from raftmq.broker.v1 import broker_pb2 as pb

from broker.state.message import encode_offset_msg_id
from mqcluster.demo import Ack, answering_node, first_new_leader_ack

KILLED_AT_S = 100.0


def test_a_late_answer_of_the_killed_leader_does_not_end_the_failover() -> None:
    acks = [
        Ack(99.0, "n0"),
        Ack(100.001, "n0"),  # sent by n0 before the kill, read after it
        Ack(100.350, "n1"),
        Ack(100.400, "n1"),
    ]
    first = first_new_leader_ack(acks, KILLED_AT_S, "n0")
    assert first == Ack(100.350, "n1")


def test_only_acks_after_the_kill_count_and_the_earliest_wins() -> None:
    acks = [Ack(99.5, "n1"), Ack(100.9, "n2"), Ack(100.2, "n2")]
    assert first_new_leader_ack(acks, KILLED_AT_S, "n0") == Ack(100.2, "n2")


def test_no_ack_of_a_new_leader_and_unnamed_answers() -> None:
    assert first_new_leader_ack([], KILLED_AT_S, "n0") is None
    assert first_new_leader_ack([Ack(101.0, "n0"), Ack(99.0, "n1")], KILLED_AT_S, "n0") is None
    # An answer that does not say which node gave it is never taken for the new leader's.
    assert first_new_leader_ack([Ack(100.5, "")], KILLED_AT_S, "n0") is None


def test_answering_node_is_read_from_the_offset_msg_id_prefix() -> None:
    by_port = {10911: "n0", 10921: "n1"}
    prefix = encode_offset_msg_id("127.0.0.1", 10921, 7)[:16]
    resp = pb.SendMessageResponse(packed_msg_ids=["A"], offset_msg_id_prefix=prefix)
    assert answering_node(resp, by_port) == "n1"
    unknown_prefix = encode_offset_msg_id("127.0.0.1", 1, 7)[:16]
    unknown = pb.SendMessageResponse(packed_msg_ids=["A"], offset_msg_id_prefix=unknown_prefix)
    assert answering_node(unknown, by_port) == ""
    assert answering_node(pb.SendMessageResponse(), by_port) == ""
