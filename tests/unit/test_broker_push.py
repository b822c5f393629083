"""Push consumers' broker side without gRPC: subscription groups as replicated config (records,
limits, hostile records, the snapshot), FIFO blocking over the POP records, auto_renew's renew
(same handle), dead-letter forwards, per-group max attempts, and the renewal table."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path

import pytest
from broker_world import reopen, world
from raftmq.broker.v1 import broker_pb2 as pb

from broker.components.pop import Pops, ReceiveQuery
from broker.components.retry import Retries
from broker.components.sending import SendPath
from broker.components.subscriptions import SubscriptionGroups
from broker.frontends.v2.clients import ClientTable
from broker.frontends.v2.renewals import Renewals, RenewPolicy
from broker.state.errors import InvalidRequestError
from broker.state.message import UniqIdGenerator
from broker.state.popstate import (
    OP_POP,
    OP_POP_FIFO,
    InvalidReceiptHandleError,
    PopRecord,
    encode_pop_record,
)
from broker.state.records import ENTRY_POP
from broker.state.subgroups import (
    BACKOFF_EXPONENTIAL,
    MAX_SUBGROUPS,
    OP_CREATE_IF_ABSENT,
    OP_UPSERT,
    Backoff,
    InvalidSubGroupRecordError,
    SubGroup,
    SubGroupTable,
    TooManySubGroupsError,
    decode_subgroup_record,
    encode_subgroup_record,
)

IDS = UniqIdGenerator(ip="10.0.0.3", pid=9, instance_hash=3)
EXP = Backoff(BACKOFF_EXPONENTIAL, (), 100, 1000, 2000)


def outgoing(queue_id: int, n: int) -> pb.Message:
    return pb.Message(queue_id=queue_id, body=f"m-{n}".encode(), msg_id=IDS.next_id())


async def _setup(tmp_path: Path, messages: int, queues: int = 1) -> tuple[Pops, SubscriptionGroups]:
    _node, _sm, topics, applied = world(tmp_path)
    await topics.upsert("T", queues, queues, 6)
    sender = SendPath(topics.ctx, topics)
    if messages:
        await sender.send("T", [outgoing(i % queues, i) for i in range(messages)])
    pops = Pops(topics, applied, Retries(topics, applied, sender), 16, 1000)
    return pops, SubscriptionGroups(topics.ctx, 16)


def _query(batch: int = 4) -> ReceiveQuery:
    return ReceiveQuery("G", "T", -1, batch, 5000)


def test_subgroup_records_round_trip_and_hostile_ones_are_refused() -> None:
    for g in (SubGroup("G"), SubGroup("G-2", True, 3, EXP), SubGroup("G3", False, 1000)):
        assert decode_subgroup_record(encode_subgroup_record(OP_UPSERT, g)) == (OP_UPSERT, g)
    good = encode_subgroup_record(OP_UPSERT, SubGroup("G"))
    for bad in (
        b"",
        good[:-1],
        good + b"x",
        b"\x02" + good[1:],  # version
        good[:1] + b"\x09" + good[2:],  # op
        good[:2] + b"\x02" + good[3:],  # unknown flag
        encode_subgroup_record(OP_UPSERT, SubGroup("bad group!")),
        encode_subgroup_record(OP_UPSERT, SubGroup("G", max_attempts=0)),
        encode_subgroup_record(OP_UPSERT, SubGroup("G", backoff=Backoff(steps_ms=()))),
        encode_subgroup_record(OP_UPSERT, SubGroup("G", backoff=Backoff(steps_ms=(1,) * 33))),
        encode_subgroup_record(
            OP_UPSERT, SubGroup("G", backoff=Backoff(steps_ms=(13 * 3600_000,)))
        ),
        encode_subgroup_record(
            OP_UPSERT, SubGroup("G", backoff=replace(EXP, initial_ms=2000, max_ms=1000))
        ),
        encode_subgroup_record(
            OP_UPSERT, SubGroup("G", backoff=replace(EXP, multiplier_milli=500))
        ),
    ):
        with pytest.raises(InvalidSubGroupRecordError):
            decode_subgroup_record(bad)


def test_subgroup_table_keeps_admin_config_and_its_limit() -> None:
    table = SubGroupTable()
    table.apply(encode_subgroup_record(OP_UPSERT, SubGroup("G", True, 3)))
    # A consumer's Settings never replaces an admin's config.
    table.apply(encode_subgroup_record(OP_CREATE_IF_ABSENT, SubGroup("G")))
    assert table.get("G") == SubGroup("G", True, 3)
    for i in range(MAX_SUBGROUPS - 1):
        table.groups[f"X{i}"] = SubGroup(f"X{i}")
    with pytest.raises(TooManySubGroupsError):  # a BrokerError: every member skips it
        table.apply(encode_subgroup_record(OP_UPSERT, SubGroup("Y")))
    table.apply(encode_subgroup_record(OP_UPSERT, SubGroup("G", False, 5)))  # existing: fine
    assert table.get("G") == SubGroup("G", False, 5) and table.get("Y") is None
    rows = table.capture()
    other = SubGroupTable()
    assert other.load([*rows, ["bad", "yes", 1, "CUSTOMIZED", [1], 0, 0, 1000]]) == [
        str(["bad", "yes", 1, "CUSTOMIZED", [1], 0, 0, 1000])[:80]
    ]
    assert other.groups == table.groups


def test_backoff_delays() -> None:
    custom = Backoff(steps_ms=(1000, 5000))
    assert [custom.delay_ms(n) for n in (0, 1, 2, 3)] == [1000, 1000, 5000, 5000]
    assert [EXP.delay_ms(n) for n in (1, 2, 3, 4, 5)] == [100, 200, 400, 800, 1000]


def test_group_config_is_replicated_and_survives_a_restart(tmp_path: Path) -> None:
    async def body() -> list[object]:
        pops, groups = await _setup(tmp_path, messages=0)
        made = await groups.update(SubGroup("G", True, 2, EXP))
        assert made == SubGroup("G", True, 2, EXP) and pops.group("G").fifo
        assert await groups.update(SubGroup("G"), create_only=True) == made
        with pytest.raises(InvalidRequestError):
            await groups.update(SubGroup("G", max_attempts=1001))
        assert pops.group("Other") == SubGroup("Other", False, 16)  # the defaults
        captured = pops.ctx.sm.subgroups.capture()
        pops.ctx.sm.close()
        return captured

    captured = asyncio.run(body())
    sm = reopen(tmp_path)
    assert sm.subgroups.capture() == captured
    sm.close()


def test_fifo_group_gets_one_batch_per_queue_in_order(tmp_path: Path) -> None:
    async def body() -> None:
        pops, groups = await _setup(tmp_path, messages=10)
        await groups.update(SubGroup("G", fifo=True))
        first = await pops.receive(_query())
        assert [r.queue_offset for r in first] == [0, 1, 2, 3]
        assert await pops.receive(_query()) == []  # blocked: the batch is in flight
        await pops.ack("G", "T", [r.receipt_handle for r in first[:3]])
        assert await pops.receive(_query()) == []  # one message of the batch still out
        # It expires: it comes again alone (attempt 2), before any new message.
        q = pops.ctx.sm.pop.get(("G", "T", 0))
        assert q is not None
        await pops.revive_once(max(r.deadline_ms for r in q.inflight.values()))
        again = await pops.receive(_query())
        assert [(r.queue_offset, r.attempt) for r in again] == [(3, 2)]
        await pops.ack("G", "T", [again[0].receipt_handle])
        nxt = await pops.receive(_query())
        assert [r.queue_offset for r in nxt] == [4, 5, 6, 7]

    asyncio.run(body())


def test_fifo_pop_records_are_stale_while_the_batch_is_out(tmp_path: Path) -> None:
    async def body() -> None:
        pops, groups = await _setup(tmp_path, messages=4)
        await groups.update(SubGroup("G", fifo=True))
        await pops.receive(_query(batch=2))
        sm = pops.ctx.sm
        before = sm.pop.capture()
        # A deposed leader's FIFO pop of the next messages from the current position.
        q = sm.pop.get(("G", "T", 0))
        assert q is not None
        record = PopRecord(OP_POP_FIFO, "G", "T", 0, 1, 10, q.offset, q.offset + 1, ((2, 0),))
        await pops.ctx.node.propose([encode_pop_record(record)], ENTRY_POP)
        assert sm.pop.capture() == before
        # The same as a normal pop is taken (normal groups do not block).
        record = record._replace(op=OP_POP)
        await pops.ctx.node.propose([encode_pop_record(record)], ENTRY_POP)
        assert len(q.inflight) == 3

    asyncio.run(body())


def test_renew_keeps_the_handle_and_dead_letter_forward(tmp_path: Path) -> None:
    async def body() -> None:
        pops, groups = await _setup(tmp_path, messages=2)
        await groups.update(SubGroup("G", max_attempts=1))
        a, b = await pops.receive(_query())
        q = pops.ctx.sm.pop.get(("G", "T", 0))
        assert q is not None
        before = q.inflight[0].deadline_ms
        errors = await pops.renew("G", "T", [a.receipt_handle, "bad", b.receipt_handle], 30_000)
        assert errors[0] is None and errors[2] is None
        assert isinstance(errors[1], InvalidReceiptHandleError)
        assert q.inflight[0].deadline_ms > before  # renewed, same sequence: the handle works
        assert await pops.ack("G", "T", [a.receipt_handle]) == [None]
        await pops.dead_letter("G", "T", b.receipt_handle)
        await pops.dead_letter("G", "T", b.receipt_handle)  # again: nothing changes
        dlq = pops.ctx.sm.cqs.find("%DLQ%G", 0)
        assert dlq is not None and dlq.max_offset == 1
        assert pops.ctx.sm.pop.inflight_total == 0
        with pytest.raises(InvalidReceiptHandleError):
            await pops.dead_letter("G2", "T", b.receipt_handle)

    asyncio.run(body())


def test_group_max_attempts_decide_the_dead_letter(tmp_path: Path) -> None:
    async def body() -> None:
        pops, groups = await _setup(tmp_path, messages=1)
        await groups.update(SubGroup("G", max_attempts=1))
        await pops.receive(_query())
        q = pops.ctx.sm.pop.get(("G", "T", 0))
        assert q is not None
        await pops.revive_once(q.inflight[0].deadline_ms)
        dlq = pops.ctx.sm.cqs.find("%DLQ%G", 0)
        assert dlq is not None and dlq.max_offset == 1 and not q.inflight

    asyncio.run(body())


def test_renewals_renew_live_clients_only_and_forget_stale_handles() -> None:
    async def body() -> None:
        now = [0]
        clients = ClientTable(clock_ms=lambda: now[0])
        clients.settings("live", 3, 0, "G")
        renewed: list[str] = []

        async def renew(group: str, topic: str, handles: list[str], ms: int) -> list[str]:
            renewed.extend(h for h in handles if h != "stale")
            return ["INVALID_RECEIPT_HANDLE" if h == "stale" else "" for h in handles]

        r = Renewals(clients, renew, RenewPolicy(3000, 10_000), clock_ms=lambda: now[0])
        r.track("live", "G", "T", ["h1", "stale"])
        r.track("dead", "G", "T", ["h2"])
        await r.close()  # the loop is driven by hand here
        assert await r.pass_once() == 0  # nothing due yet
        now[0] = 2500
        assert await r.pass_once() == 1 and renewed == ["h1"]
        assert set(r.table) == {"h1"}  # the dead client's and the stale handle are gone
        now[0] = 40_000  # past the bound and the client's liveness
        assert await r.pass_once() == 0 and not r.table

    asyncio.run(body())
