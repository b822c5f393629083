"""The forwarder of leader operations across a leader change, without gRPC servers
(broker/frontends/internal/forwarder.py), as the v2 front end uses it: a long poll whose leader
dies goes to the new leader with what is left of its window, one that finds no leader in its
window answers no message, and a hung leader costs the caller no deadline; retry hints are
honoured or answered at once."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace
from typing import Any

import grpc
import pytest
from raftmq.broker.internal.v1 import leaderops_pb2 as ipb

from broker.components.leaderops import ReceiveRequest, SendRequest
from broker.components.sending import OutgoingMessage
from broker.frontends.internal import forwarder as leader_mod
from broker.frontends.internal.forwarder import Failure, Forwarder
from broker.state.message import Message, encode_message
from dledger.core import Role

POLL_MS = 2000


def _error(code: grpc.StatusCode) -> grpc.aio.AioRpcError:
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(), "gone")


def _delivery() -> ipb.Delivery:
    msg = Message(topic="T", queue_id=1, body=b"x", uniq_id="A" * 32, store_timestamp_ms=1)
    return ipb.Delivery(
        stored=encode_message(msg), queue_id=1, queue_offset=7, attempt=1, receipt_handle="h"
    )


class _Leader:
    """A leader's LeaderOps.Call (a receive) as a forward sees it: ``dies_after_s`` into the
    call it fails as a killed process does (UNAVAILABLE); ``hangs``: never answers before the
    call's deadline; else one message at once. Records each request with its deadline."""

    def __init__(self, dies_after_s: float | None = None, hangs: bool = False) -> None:
        self.dies_after_s = dies_after_s
        self.hangs = hangs
        self.calls: list[tuple[ipb.Receive, float]] = []

    async def Call(self, request: ipb.LeaderCall, timeout: float, metadata: Any) -> Any:
        self.calls.append((request.receive, timeout))
        if self.hangs:
            await asyncio.sleep(timeout)
            raise _error(grpc.StatusCode.DEADLINE_EXCEEDED)
        if self.dies_after_s is not None:
            await asyncio.sleep(self.dies_after_s)
            raise _error(grpc.StatusCode.UNAVAILABLE)
        return ipb.LeaderAnswer(received=ipb.Deliveries(deliveries=[_delivery()]))


def _calls(leaders: list[_Leader | None]) -> Forwarder:
    """A follower's Forwarder whose leader is ``leaders[0]`` until a forward to it fails,
    then the next (None: no leader known)."""
    node = SimpleNamespace(role=Role.FOLLOWER)
    calls = Forwarder(node, ops=None)  # type: ignore[arg-type]
    current = list(leaders)

    def stub() -> _Leader:
        if current[0] is None:
            raise Failure("NO_LEADER", "no leader yet", retryable=True)
        if current[0].calls and len(current) > 1:  # the previous forward failed: re-elected
            current.pop(0)
            return stub()
        return current[0]

    calls._leader_stub = stub  # type: ignore[method-assign]
    return calls


def _query(poll_ms: int = POLL_MS) -> ReceiveRequest:
    return ReceiveRequest("G", "T", -1, 32, 20_000, "", poll_ms)


def test_a_long_poll_whose_leader_dies_goes_on_at_the_new_leader(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The leader dies after the forward budget: the receive must not fail for it.
    monkeypatch.setattr(leader_mod, "FORWARD_BUDGET_MS", 100)
    dying, new = _Leader(dies_after_s=0.3), _Leader()
    calls = _calls([dying, new])
    started = time.monotonic()
    received = asyncio.run(calls.receive(_query(), answer_within_ms=4500))
    assert [r.message.uniq_id for r in received] == ["A" * 32]
    request, timeout_s = new.calls[0]
    # What is left of the window, not the whole poll again; the answer back in time.
    assert 1000 < request.poll_timeout_ms < POLL_MS - 250
    assert timeout_s <= 4.5 - (time.monotonic() - started) + 0.05
    assert timeout_s - request.poll_timeout_ms / 1000 >= leader_mod.FORWARD_ANSWER_MARGIN_S - 0.01


def test_a_long_poll_without_a_leader_answers_no_message_at_its_end(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(leader_mod, "FORWARD_BUDGET_MS", 100)
    calls = _calls([None])
    started = time.monotonic()
    assert asyncio.run(calls.receive(_query(400), answer_within_ms=900)) == []
    assert 0.35 < time.monotonic() - started < 0.9
    # Without long polling, the missing leader is the answer (after the forward budget).
    with pytest.raises(Failure) as failure:
        asyncio.run(calls.receive(_query(0), answer_within_ms=900))
    assert failure.value.code == "NO_LEADER"


def test_a_hung_leader_costs_the_caller_no_deadline() -> None:
    hung = _Leader(hangs=True)
    calls = _calls([hung])
    started = time.monotonic()
    assert asyncio.run(calls.receive(_query(1000), answer_within_ms=1200)) == []
    assert time.monotonic() - started < 1.2 + 0.15
    request, timeout_s = hung.calls[0]
    assert request.poll_timeout_ms <= 1200 - 500 and timeout_s <= 1.2


def test_a_refusal_that_no_new_leader_changes_is_the_answer() -> None:
    refusing = _Leader()

    async def refuse(request: ipb.LeaderCall, timeout: float, metadata: Any) -> Any:
        raise Failure("TOPIC_NOT_FOUND", "no topic T")

    refusing.Call = refuse  # type: ignore[method-assign]
    with pytest.raises(Failure) as failure:
        asyncio.run(_calls([refusing]).receive(_query(), answer_within_ms=4500))
    assert failure.value.code == "TOPIC_NOT_FOUND"


_SEND = SendRequest("T", (OutgoingMessage("T", 0, b"x", msg_id="B" * 32),))


def _forwards(answers: list[Failure | None]) -> tuple[Forwarder, list[float]]:
    """A follower's Forwarder whose forwarded sends fail with ``answers`` in turn (None: the
    call succeeds, the message stored); returns it and the monotonic time of each try."""
    leader = _Leader()
    calls = _calls([leader])
    tries: list[float] = []

    async def send(request: ipb.LeaderCall, timeout: float, metadata: Any) -> Any:
        tries.append(time.monotonic())
        answer = answers[len(tries) - 1]
        if answer is not None:
            raise answer
        stored = ipb.Stored(msg_id="B" * 32, topic="T", queue_offset=3)
        return ipb.LeaderAnswer(sent=ipb.SendAnswer(stored=[stored]))

    leader.Call = send  # type: ignore[method-assign]

    async def run() -> str:
        [stored] = await calls.call(_SEND)
        return "stored" if stored.queue_offset == 3 else "?"

    calls.run = run  # type: ignore[attr-defined]
    return calls, tries


def test_the_forwarder_retries_what_the_leader_calls_retryable() -> None:
    # An outcome-unknown write is retryable (the send path deduplicates by message id): the
    # forwarder tries again instead of answering MASTER_PERSISTENCE_TIMEOUT at once.
    lost = Failure("LEADERSHIP_LOST", "outcome unknown", retryable=True, retry_after_ms=100)
    calls, tries = _forwards([lost, None])
    assert asyncio.run(calls.run()) == "stored"  # type: ignore[attr-defined]
    assert len(tries) == 2


def test_the_forwarder_waits_the_retry_hint() -> None:
    moving = Failure("TRANSFER_IN_PROGRESS", "to n2", retryable=True, retry_after_ms=100)
    calls, tries = _forwards([moving, None])
    assert asyncio.run(calls.run()) == "stored"  # type: ignore[attr-defined]
    assert tries[1] - tries[0] >= 0.1


@pytest.mark.parametrize(
    "answer",
    [
        # the leader says no retry helps, whatever the code
        Failure("NOT_LEADER", "a leader that says no retry helps", retryable=False),
        # retryable, but only on another group's disk: answered at once
        Failure("DISK_FULL", "used=91%", retryable=True, retry_after_ms=1000),
        # a full table: the client hears TOO_MANY_REQUESTS and backs off itself
        Failure("RESOURCE_EXHAUSTED", "quota", retryable=True, retry_after_ms=1000),
    ],
)
def test_the_forwarder_answers_at_once_what_no_retry_here_cures(answer: Failure) -> None:
    calls, tries = _forwards([answer, None])
    with pytest.raises(Failure) as failure:
        asyncio.run(calls.run())  # type: ignore[attr-defined]
    assert failure.value is answer and len(tries) == 1
