"""The typed leader requests (:mod:`broker.components.leaderops`) on the wire of
``raftmq.broker.internal.v1.LeaderOps`` and back, each bounded on arrival.

Both directions of both messages live here: the forwarder encodes a request
(:func:`call_pb`) and decodes the leader's answer (:func:`answer_of`); the leader decodes the
call (:func:`request_of`) and encodes its answer (:func:`answer_pb`). A peer is hostile like any
input: a call over a bound raises :class:`InvalidRequestError` (``BAD_REQUEST``; for a receipt
handle or a transaction id the component's own error, so a forwarded call is answered as the
direct one) before anything runs, and a malformed answer raises :class:`MalformedAnswerError`.
The components check the rest as for any front end (names, batch sizes, invisible times, each
handle of a list, message sizes).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from raftmq.broker.internal.v1 import leaderops_pb2 as ipb

from broker.components.leaderops import (
    AckRequest,
    ChangeInvisibleRequest,
    CreateGroupRequest,
    DeadLetterRequest,
    EndTransactionRequest,
    LeaderRequest,
    ReceiveRequest,
    RenewRequest,
    SendRequest,
)
from broker.components.pop import Received
from broker.components.sending import MAX_SEND_BATCH, NO_PROPERTIES, OutgoingMessage
from broker.state.auth.model import MAX_USERNAME_CHARS
from broker.state.errors import BrokerError, InvalidRequestError
from broker.state.machine import SendResult
from broker.state.message import decode_message, encode_message
from broker.state.names import MAX_GROUP_LENGTH, MAX_TOPIC_LENGTH
from broker.state.popstate import (
    MALFORMED_HANDLE,
    MAX_HANDLE_CHARS,
    MAX_RECORD_ITEMS,
    InvalidReceiptHandleError,
)
from broker.state.transactions import InvalidTransactionIdError
from mqerrors import codes as E
from remoting.protocol import MAX_FRAME_BYTES

_A = TypeVar("_A")

# A message id: a RocketMQ uniq id is 32 hex characters; the v1 port takes the producer's
# own up to this many (the codec stores it as a property, whose total it bounds too).
MAX_MSG_ID_CHARS = 128
# A transaction id names a commitlog position (16 hex characters); some room above, so that the
# component's own check answers any near miss.
MAX_TRANSACTION_ID_CHARS = 64
# A receive's subscription expression (broker.components.pulling.MAX_SUBSCRIPTION_CHARS).
MAX_SUBSCRIPTION_CHARS = 4096
# A stable code in a per-handle answer (the error table's codes are under 40 characters).
MAX_CODE_CHARS = 64
# A verdict of end_transaction (COMMITTED, ROLLED_BACK).
MAX_OUTCOME_CHARS = 32
# A remoting caller's proof (RemotingProof): its AccessKey names a user (at most
# MAX_USERNAME_CHARS); a Signature is the base64 of a 20-byte HMAC-SHA1 (28 characters), with
# room; the signed material is a request's ext values and body, at most one remoting frame.
MAX_PROOF_ACCESS_KEY_CHARS = MAX_USERNAME_CHARS
MAX_PROOF_SIGNATURE_CHARS = 64
MAX_PROOF_SIGNED_BYTES = MAX_FRAME_BYTES


@dataclass(frozen=True, slots=True)
class RemotingProof:
    """What a remoting caller's request proves (docs/REMOTING.md, "ACL"): its AccessKey, its
    Signature and the exact material the signature covers."""

    access_key: str
    signature: str
    signed: bytes


class MalformedAnswerError(BrokerError):
    """The leader's answer does not fit the request it answers."""

    code = E.INTERNAL


def _text(value: str, limit: int, what: str) -> str:
    if len(value) > limit:
        raise InvalidRequestError(f"{what} of {len(value)} characters, more than {limit}")
    return value


def _handles(values: Sequence[str]) -> tuple[str, ...]:
    """The handles of an ack or renewal: their count bounded here; each handle's length by the
    call's size, and answered per handle by ``Pops`` (a malformed one:
    ``INVALID_RECEIPT_HANDLE``, as for the direct call)."""
    if len(values) > MAX_RECORD_ITEMS:
        raise InvalidRequestError(
            f"{len(values)} receipt handles in one call, more than {MAX_RECORD_ITEMS}"
        )
    return tuple(values)


def _handle(value: str) -> str:
    """One handle: refused as the component refuses a malformed one."""
    if len(value) > MAX_HANDLE_CHARS:
        raise InvalidReceiptHandleError(MALFORMED_HANDLE)
    return value


def _group(value: str) -> str:
    return _text(value, MAX_GROUP_LENGTH, "a group name")


def _topic(value: str) -> str:
    return _text(value, MAX_TOPIC_LENGTH, "a topic name")


# ------------------------------------------------------------------ requests


def _outgoing_pb(m: OutgoingMessage) -> ipb.Outgoing:
    return ipb.Outgoing(
        topic=m.topic,
        queue_id=m.queue_id,
        tags=m.tags,
        keys=m.keys,
        properties=m.properties,
        # protobuf takes bytes only: a body viewing a v1 request is copied here (forwarding).
        body=m.body if isinstance(m.body, bytes) else bytes(m.body),
        born_host=m.born_host,
        born_timestamp_ms=m.born_timestamp_ms,
        producer_group=m.producer_group,
        msg_id=m.msg_id,
        reconsume_times=m.reconsume_times,
        flag=m.flag,
        sys_flag=m.sys_flag,
    )


def outgoing_of(m: Any) -> OutgoingMessage:
    """A wire message of a send (``raftmq.broker.v1.Message`` or ``internal.v1.Outgoing``:
    the same field names) as the neutral message; the send path's codec bounds its sizes
    when it encodes it."""
    # Runs once per message of every send the v1 port receives: positional (a keyword call
    # costs more), no copy of an empty map or list, and the map copied key by key (dict() of
    # the runtime's map goes through the Mapping ABC's Python-level keys view: twice the CPU).
    keys = m.keys
    properties = m.properties
    return OutgoingMessage(
        m.topic,
        m.queue_id,
        m.body,
        m.tags,
        tuple(keys) if keys else (),
        {k: properties[k] for k in properties} if properties else NO_PROPERTIES,
        m.born_host,
        m.born_timestamp_ms,
        m.producer_group,
        m.msg_id,
        m.reconsume_times,
        m.flag,
        m.sys_flag,
    )


def call_pb(r: LeaderRequest[Any], proof: RemotingProof | None = None) -> ipb.LeaderCall:
    """``r`` as one call, carrying a remoting caller's ``proof`` when it has one."""
    call = _op_pb(r)
    if proof is not None:
        call.remoting.CopyFrom(
            ipb.RemotingProof(
                access_key=proof.access_key, signature=proof.signature, signed=proof.signed
            )
        )
    return call


def proof_of(call: ipb.LeaderCall) -> RemotingProof | None:
    """The remoting proof ``call`` carries (None: it carries none), every field bounded
    (:class:`InvalidRequestError`): the leader's guard reads it before the servicer runs."""
    if not call.HasField("remoting"):
        return None
    p = call.remoting
    if len(p.signed) > MAX_PROOF_SIGNED_BYTES:
        raise InvalidRequestError(
            f"remoting signed material of {len(p.signed)} bytes, more than {MAX_PROOF_SIGNED_BYTES}"
        )
    return RemotingProof(
        _text(p.access_key, MAX_PROOF_ACCESS_KEY_CHARS, "a remoting AccessKey"),
        _text(p.signature, MAX_PROOF_SIGNATURE_CHARS, "a remoting Signature"),
        p.signed,
    )


def _op_pb(r: LeaderRequest[Any]) -> ipb.LeaderCall:
    if isinstance(r, SendRequest):
        msgs = [_outgoing_pb(m) for m in r.messages]
        return ipb.LeaderCall(send=ipb.Send(topic=r.topic, messages=msgs))
    if isinstance(r, ReceiveRequest):
        return ipb.LeaderCall(
            receive=ipb.Receive(
                group=r.group,
                topic=r.topic,
                queue_id=r.queue_id,
                batch_size=r.batch_size,
                invisible_ms=r.invisible_ms,
                subscription=r.subscription,
                poll_timeout_ms=r.poll_timeout_ms,
            )
        )
    if isinstance(r, AckRequest):
        return ipb.LeaderCall(ack=ipb.Ack(group=r.group, topic=r.topic, receipt_handles=r.handles))
    if isinstance(r, RenewRequest):
        renew = ipb.Renew(
            group=r.group, topic=r.topic, receipt_handles=r.handles, invisible_ms=r.invisible_ms
        )
        return ipb.LeaderCall(renew=renew)
    if isinstance(r, ChangeInvisibleRequest):
        change = ipb.ChangeInvisible(
            group=r.group,
            topic=r.topic,
            receipt_handle=r.handle,
            invisible_ms=r.invisible_ms,
            backoff_floor=r.backoff_floor,
        )
        return ipb.LeaderCall(change_invisible=change)
    if isinstance(r, DeadLetterRequest):
        dead = ipb.DeadLetter(group=r.group, topic=r.topic, receipt_handle=r.handle)
        return ipb.LeaderCall(dead_letter=dead)
    if isinstance(r, EndTransactionRequest):
        end = ipb.EndTransaction(
            topic=r.topic, msg_id=r.msg_id, transaction_id=r.transaction_id, commit=r.commit
        )
        return ipb.LeaderCall(end_transaction=end)
    assert isinstance(r, CreateGroupRequest), f"no wire form for {type(r).__name__}"
    return ipb.LeaderCall(create_group=ipb.CreateGroup(group=r.group))


def _send_of(c: ipb.Send) -> SendRequest:
    if not 1 <= len(c.messages) <= MAX_SEND_BATCH:
        raise InvalidRequestError(f"a send of {len(c.messages)} messages: 1 to {MAX_SEND_BATCH}")
    for m in c.messages:
        _text(m.msg_id, MAX_MSG_ID_CHARS, "a message id")
        _text(m.topic, MAX_TOPIC_LENGTH, "a message's topic")
    return SendRequest(_topic(c.topic), tuple(outgoing_of(m) for m in c.messages))


def _receive_of(c: ipb.Receive) -> ReceiveRequest:
    return ReceiveRequest(
        _group(c.group),
        _topic(c.topic),
        c.queue_id,
        c.batch_size,
        c.invisible_ms,
        _text(c.subscription, MAX_SUBSCRIPTION_CHARS, "a subscription"),
        c.poll_timeout_ms,
    )


def _change_of(c: ipb.ChangeInvisible) -> ChangeInvisibleRequest:
    return ChangeInvisibleRequest(
        _group(c.group), _topic(c.topic), _handle(c.receipt_handle), c.invisible_ms, c.backoff_floor
    )


def _end_of(c: ipb.EndTransaction) -> EndTransactionRequest:
    if len(c.transaction_id) > MAX_TRANSACTION_ID_CHARS:  # refused as the component does
        raise InvalidTransactionIdError(f"transaction id {c.transaction_id[:40]!r} is malformed")
    msg_id = _text(c.msg_id, MAX_MSG_ID_CHARS, "a message id")
    return EndTransactionRequest(_topic(c.topic), msg_id, c.transaction_id, c.commit)


_REQUEST_OF: Mapping[str, Callable[[Any], LeaderRequest[Any]]] = {
    "send": _send_of,
    "receive": _receive_of,
    "ack": lambda c: AckRequest(_group(c.group), _topic(c.topic), _handles(c.receipt_handles)),
    "renew": lambda c: RenewRequest(
        _group(c.group), _topic(c.topic), _handles(c.receipt_handles), c.invisible_ms
    ),
    "change_invisible": _change_of,
    "dead_letter": lambda c: DeadLetterRequest(
        _group(c.group), _topic(c.topic), _handle(c.receipt_handle)
    ),
    "end_transaction": _end_of,
    "create_group": lambda c: CreateGroupRequest(_group(c.group)),
}


def request_of(call: ipb.LeaderCall) -> LeaderRequest[Any]:
    """The typed request of ``call``, every field bounded (:class:`InvalidRequestError`)."""
    kind = call.WhichOneof("op")
    if kind is None:
        raise InvalidRequestError("a leader call names no operation")
    proof_of(call)
    return _REQUEST_OF[kind](getattr(call, kind))


# ------------------------------------------------------------------ answers


def _delivery_pb(r: Received, max_message_bytes: int) -> ipb.Delivery:
    return ipb.Delivery(
        stored=encode_message(r.message, max_message_bytes),
        queue_id=r.queue_id,
        queue_offset=r.queue_offset,
        position=r.position,
        attempt=r.attempt,
        receipt_handle=r.receipt_handle,
    )


def _sent_pb(results: list[SendResult], max_message_bytes: int) -> ipb.LeaderAnswer:
    stored = [
        ipb.Stored(
            msg_id=r.uniq_id,
            queue_id=r.queue_id,
            queue_offset=r.queue_offset,
            duplicate=r.duplicate,
            position=r.position,
            topic=r.topic,
            store_timestamp_ms=r.store_timestamp_ms,
        )
        for r in results
    ]
    return ipb.LeaderAnswer(sent=ipb.SendAnswer(stored=stored))


def _received_pb(received: list[Received], max_message_bytes: int) -> ipb.LeaderAnswer:
    deliveries = [_delivery_pb(r, max_message_bytes) for r in received]
    return ipb.LeaderAnswer(received=ipb.Deliveries(deliveries=deliveries))


def _done_pb(answer: None, max_message_bytes: int) -> ipb.LeaderAnswer:
    return ipb.LeaderAnswer(done=ipb.Done())


_ANSWER_PB: Mapping[type, Callable[[Any, int], ipb.LeaderAnswer]] = {
    SendRequest: _sent_pb,
    ReceiveRequest: _received_pb,
    AckRequest: lambda codes, _: ipb.LeaderAnswer(codes=ipb.HandleCodes(codes=codes)),
    RenewRequest: lambda codes, _: ipb.LeaderAnswer(codes=ipb.HandleCodes(codes=codes)),
    ChangeInvisibleRequest: lambda r, size: ipb.LeaderAnswer(changed=_delivery_pb(r, size)),
    DeadLetterRequest: _done_pb,
    EndTransactionRequest: lambda o, _: ipb.LeaderAnswer(outcome=ipb.Outcome(outcome=o)),
    CreateGroupRequest: _done_pb,
}


def answer_pb(r: LeaderRequest[_A], answer: _A, max_message_bytes: int) -> ipb.LeaderAnswer:
    """The answer to ``r`` on the wire. ``max_message_bytes``: the largest stored message this
    node re-encodes."""
    return _ANSWER_PB[type(r)](answer, max_message_bytes)


def _malformed(what: str) -> MalformedAnswerError:
    return MalformedAnswerError(f"the leader's answer is malformed: {what}")


def _received_of(d: ipb.Delivery) -> Received:
    try:
        message = decode_message(d.stored)
    except BrokerError as exc:
        raise _malformed(f"a received message does not decode ({exc.code})") from None
    if len(d.receipt_handle) > MAX_HANDLE_CHARS:
        raise _malformed("a receipt handle is too long")
    return Received(message, d.queue_id, d.queue_offset, d.position, d.attempt, d.receipt_handle)


def _sent_of(r: SendRequest, a: ipb.LeaderAnswer) -> list[SendResult]:
    stored = a.sent.stored
    if a.WhichOneof("answer") != "sent" or len(stored) != len(r.messages):
        raise _malformed("not one result per message sent")
    return [
        SendResult(
            s.msg_id,
            s.topic,
            s.queue_id,
            s.queue_offset,
            s.position,
            s.store_timestamp_ms,
            s.duplicate,
        )
        for s in stored
    ]


def _codes_of(r: AckRequest | RenewRequest, a: ipb.LeaderAnswer) -> list[str]:
    codes = a.codes.codes
    if a.WhichOneof("answer") != "codes" or len(codes) != len(r.handles):
        raise _malformed("not one code per receipt handle")
    if any(len(c) > MAX_CODE_CHARS for c in codes):
        raise _malformed("a code is too long")
    return list(codes)


def _deliveries_of(r: ReceiveRequest, a: ipb.LeaderAnswer) -> list[Received]:
    deliveries = a.received.deliveries
    if a.WhichOneof("answer") != "received" or len(deliveries) > max(r.batch_size, 0):
        raise _malformed("not a receive's answer within its batch size")
    return [_received_of(d) for d in deliveries]


def _changed_of(r: ChangeInvisibleRequest, a: ipb.LeaderAnswer) -> Received:
    if a.WhichOneof("answer") != "changed":
        raise _malformed("not a changed message")
    return _received_of(a.changed)


def _outcome_of(r: EndTransactionRequest, a: ipb.LeaderAnswer) -> str:
    outcome = a.outcome.outcome
    if a.WhichOneof("answer") != "outcome" or len(outcome) > MAX_OUTCOME_CHARS:
        raise _malformed("not a transaction's outcome")
    return str(outcome)


def _done_of(r: LeaderRequest[None], a: ipb.LeaderAnswer) -> None:
    if a.WhichOneof("answer") != "done":
        raise _malformed("not a done")


_ANSWER_OF: Mapping[type, Callable[[Any, ipb.LeaderAnswer], Any]] = {
    SendRequest: _sent_of,
    ReceiveRequest: _deliveries_of,
    AckRequest: _codes_of,
    RenewRequest: _codes_of,
    ChangeInvisibleRequest: _changed_of,
    DeadLetterRequest: _done_of,
    EndTransactionRequest: _outcome_of,
    CreateGroupRequest: _done_of,
}


def answer_of(r: LeaderRequest[Any], a: ipb.LeaderAnswer) -> Any:
    """The typed answer to ``r`` the leader sent (:class:`MalformedAnswerError` when it is
    not one)."""
    return _ANSWER_OF[type(r)](r, a)


__all__ = [
    "MalformedAnswerError",
    "RemotingProof",
    "answer_of",
    "answer_pb",
    "call_pb",
    "outgoing_of",
    "proof_of",
    "request_of",
]
