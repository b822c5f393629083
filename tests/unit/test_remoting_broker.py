"""The broker's remoting front end (RocketMQ 4.x requests, docs/REMOTING.md "Broker") against one
node in this process: the real service on a real remoting server on 127.0.0.1, over a real state
machine and an in-memory log (tests/broker_world.py), spoken to with the remoting package's own
client. Covers what ali-ons cannot send (batches, lock codes, lookups) and every refusal."""

from __future__ import annotations

import asyncio
import json
import struct
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from remoting_support import (
    PUB_KEY,
    PUB_SECRET,
    QUEUES,
    SUB_KEY,
    SUB_SECRET,
    TIMEOUT_S,
    G,
    Node,
    T,
    run,
    sign,
)

from broker.frontends.remoting import checkback
from broker.frontends.remoting.sends import encode_batch_message
from broker.state.names import SCHEDULE_TOPIC
from dledger.core import Role
from remoting.client import RemotingClient
from remoting.codes import RequestCode as Q
from remoting.codes import ResponseCode as R
from remoting.protocol import RemotingCommand

# ---------------------------------------------------------------------------- a 4.x decoder


def decode_messages(body: bytes) -> list[dict[str, Any]]:
    """RocketMQ's MessageExt layout read back field by field, as ali-ons's decoder reads it."""
    out = []
    at = 0
    while at < len(body):
        total, magic, _crc, queue_id, flag, qoff, phys, sys_flag, born = struct.unpack_from(
            ">iIiiiqqiq", body, at
        )
        assert magic == 0xDAA320A7
        p = at + 48
        born_host = body[p : p + 8]
        (store_ts,) = struct.unpack_from(">q", body, p + 8)
        store_host = body[p + 16 : p + 24]
        reconsume, _ptx, body_len = struct.unpack_from(">iqi", body, p + 24)
        p += 40
        payload = body[p : p + body_len]
        p += body_len
        topic_len = body[p]
        topic = body[p + 1 : p + 1 + topic_len].decode()
        p += 1 + topic_len
        (props_len,) = struct.unpack_from(">h", body, p)
        props_text = body[p + 2 : p + 2 + props_len].decode()
        p += 2 + props_len
        assert p - at == total
        props = dict(i.split("\x01", 1) for i in props_text.split("\x02") if i)
        out.append(
            {
                "queue_id": queue_id,
                "flag": flag,
                "queue_offset": qoff,
                "position": phys,
                "sys_flag": sys_flag,
                "born_ms": born,
                "born_host": born_host,
                "store_ms": store_ts,
                "store_host": store_host,
                "reconsume": reconsume,
                "body": payload,
                "topic": topic,
                "props": props,
                "msg_id": (store_host + phys.to_bytes(8, "big")).hex().upper(),
            }
        )
        at = p
    return out


def send_v2(queue_id: int, props: str, topic: str = T, sys_flag: int = 0) -> dict[str, object]:
    return {
        "a": "PG",
        "b": topic,
        "c": "TBW102",
        "d": 4,
        "e": queue_id,
        "f": sys_flag,
        "g": 1_700_000_000_000,
        "h": 5,
        "i": props,
        "j": 0,
        "k": "false",
    }


def pull_ext(queue_offset: int, queue_id: int = 0, **kw: object) -> dict[str, object]:
    return {
        "consumerGroup": G,
        "topic": T,
        "queueId": queue_id,
        "queueOffset": queue_offset,
        "maxMsgNums": 32,
        "sysFlag": 0,
        "commitOffset": 0,
        "suspendTimeoutMillis": 0,
        "subVersion": 0,
        **kw,
    }


# ---------------------------------------------------------------------------- sends and pulls


def test_a_v2_send_is_pulled_back_in_rocketmq_layout(tmp_path: Path) -> None:
    async def body(n: Node) -> None:
        props = "TAGS\x01TagA\x02KEYS\x01k1 k2\x02UNIQ_KEY\x01" + "AB" * 16 + "\x02color\x01red\x02"
        sent = await n.call(Q.SEND_MESSAGE_V2, send_v2(1, props), b"hello")
        assert sent.code == R.SUCCESS, sent.remark
        assert sent.ext_fields["queueId"] == "1" and sent.ext_fields["queueOffset"] == "0"
        pulled = await n.call(Q.PULL_MESSAGE, pull_ext(0, queue_id=1))
        assert pulled.code == R.SUCCESS, pulled.remark
        assert pulled.ext_fields["nextBeginOffset"] == "1"
        assert pulled.ext_fields["suggestWhichBrokerId"] == "0"
        (m,) = decode_messages(pulled.body)
        assert m["body"] == b"hello" and m["topic"] == T and m["queue_id"] == 1
        assert m["props"] == {
            "TAGS": "TagA",
            "KEYS": "k1 k2",
            "UNIQ_KEY": "AB" * 16,
            "color": "red",
        }
        assert m["flag"] == 5 and m["born_ms"] == 1_700_000_000_000
        assert m["store_host"] == bytes([10, 1, 2, 3]) + (9876).to_bytes(4, "big")
        assert m["msg_id"] == sent.ext_fields["msgId"]  # the offsetMsgId the producer was told

    run(tmp_path, body)


def test_a_compressed_body_is_stored_inflated(tmp_path: Path) -> None:
    async def body(n: Node) -> None:
        import zlib

        raw = b"x" * 10_000
        sent = await n.call(
            Q.SEND_MESSAGE_V2, send_v2(0, "TAGS\x01A\x02", sys_flag=1), zlib.compress(raw)
        )
        assert sent.code == R.SUCCESS, sent.remark
        (m,) = decode_messages((await n.call(Q.PULL_MESSAGE, pull_ext(0))).body)
        assert m["body"] == raw and m["sys_flag"] & 1 == 0
        bomb = await n.call(
            Q.SEND_MESSAGE_V2, send_v2(0, "", sys_flag=1), zlib.compress(bytes(5 << 20))
        )
        assert bomb.code == R.MESSAGE_ILLEGAL and "inflates to more than" in (bomb.remark or "")

    run(tmp_path, body)


def test_a_batch_is_one_send(tmp_path: Path) -> None:
    async def body(n: Node) -> None:
        body = b"".join(
            encode_batch_message(f"b{i}".encode(), {"TAGS": "T1", "UNIQ_KEY": f"{i:032X}"})
            for i in range(3)
        )
        ext = {"producerGroup": "PG", "topic": T, "queueId": 0, "batch": "true", "properties": ""}
        sent = await n.call(Q.SEND_BATCH_MESSAGE, ext, body)
        assert sent.code == R.SUCCESS, sent.remark
        assert len(sent.ext_fields["msgId"].split(",")) == 3
        msgs = decode_messages((await n.call(Q.PULL_MESSAGE, pull_ext(0))).body)
        assert [m["body"] for m in msgs] == [b"b0", b"b1", b"b2"]
        cut = await n.call(Q.SEND_BATCH_MESSAGE, ext, body[:-3])
        assert cut.code == R.MESSAGE_ILLEGAL and "malformed" in (cut.remark or "")

    run(tmp_path, body)


def test_a_held_pull_is_woken_by_a_send(tmp_path: Path) -> None:
    async def body(n: Node) -> None:
        held = asyncio.ensure_future(
            n.call(Q.PULL_MESSAGE, pull_ext(0, sysFlag=0x2, suspendTimeoutMillis=4000))
        )
        await asyncio.sleep(0)  # the pull is on its way; it must wait for the send
        started = time.monotonic()
        sent = await n.call(Q.SEND_MESSAGE_V2, send_v2(0, "TAGS\x01A\x02"), b"late")
        assert sent.code == R.SUCCESS
        pulled = await held
        assert pulled.code == R.SUCCESS and time.monotonic() - started < 3.5
        assert decode_messages(pulled.body)[0]["body"] == b"late"

    run(tmp_path, body)


def test_pull_statuses_and_a_tag_filter(tmp_path: Path) -> None:
    async def body(n: Node) -> None:
        empty = await n.call(Q.PULL_MESSAGE, pull_ext(0))
        assert empty.code == R.PULL_NOT_FOUND
        await n.call(Q.SEND_MESSAGE_V2, send_v2(0, "TAGS\x01A\x02"), b"a")
        other = await n.call(Q.PULL_MESSAGE, pull_ext(0, sysFlag=0x4, subscription="B"))
        assert other.code == R.PULL_RETRY_IMMEDIATELY and other.ext_fields["nextBeginOffset"] == "1"
        moved = await n.call(Q.PULL_MESSAGE, pull_ext(50))
        assert moved.code == R.PULL_OFFSET_MOVED
        sql = await n.call(Q.PULL_MESSAGE, pull_ext(0, expressionType="SQL92"))
        assert sql.code == R.SUBSCRIPTION_PARSE_FAILED

    run(tmp_path, body)


# ---------------------------------------------------------------------------- offsets, clients


def test_offsets(tmp_path: Path) -> None:
    async def body(n: Node) -> None:
        before = int(time.time() * 1000)
        for i in range(3):
            await n.call(Q.SEND_MESSAGE_V2, send_v2(0, ""), f"m{i}".encode())
        q = {"consumerGroup": G, "topic": T, "queueId": 0}
        fresh = await n.call(Q.QUERY_CONSUMER_OFFSET, q)
        assert fresh.code == R.SUCCESS and fresh.ext_fields["offset"] == "0"
        done = await n.call(Q.UPDATE_CONSUMER_OFFSET, {**q, "commitOffset": 2})
        assert done.code == R.SUCCESS
        assert (await n.call(Q.QUERY_CONSUMER_OFFSET, q)).ext_fields["offset"] == "2"
        queue = {"topic": T, "queueId": 0}
        assert (await n.call(Q.GET_MAX_OFFSET, queue)).ext_fields["offset"] == "3"
        assert (await n.call(Q.GET_MIN_OFFSET, queue)).ext_fields["offset"] == "0"
        found = await n.call(Q.SEARCH_OFFSET_BY_TIMESTAMP, {**queue, "timestamp": before})
        assert found.ext_fields["offset"] == "0"
        missing = await n.call(Q.GET_MAX_OFFSET, {"topic": "NoSuchTopic", "queueId": 0})
        assert missing.code == R.TOPIC_NOT_EXIST

    run(tmp_path, body)


def test_heartbeat_lists_and_unregisters_a_consumer(tmp_path: Path) -> None:
    async def body(n: Node) -> None:
        beat = {
            "clientID": "10.0.0.1@c1",
            "producerDataSet": [{"groupName": "PG"}],
            "consumerDataSet": [
                {
                    "groupName": G,
                    "consumeType": "CONSUME_PASSIVELY",
                    "messageModel": "CLUSTERING",
                    "consumeFromWhere": "CONSUME_FROM_LAST_OFFSET",
                    "subscriptionDataSet": [{"topic": T, "subString": "A", "subVersion": 1}],
                    "unitMode": False,
                }
            ],
        }
        ok = await n.call(Q.HEART_BEAT, None, json.dumps(beat).encode())
        assert ok.code == R.SUCCESS, ok.remark
        listed = await n.call(Q.GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": G})
        assert json.loads(listed.body) == {"consumerIdList": ["10.0.0.1@c1"]}
        # The registered subscription filters a pull that carries none.
        await n.call(Q.SEND_MESSAGE_V2, send_v2(0, "TAGS\x01B\x02"), b"b")
        assert (await n.call(Q.PULL_MESSAGE, pull_ext(0))).code == R.PULL_RETRY_IMMEDIATELY
        gone = await n.call(Q.UNREGISTER_CLIENT, {"clientID": "10.0.0.1@c1", "consumerGroup": G})
        assert gone.code == R.SUCCESS
        listed = await n.call(Q.GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": G})
        assert json.loads(listed.body) == {"consumerIdList": []}
        bad = await n.call(Q.HEART_BEAT, None, b"{not json")
        assert bad.code == R.SYSTEM_ERROR and "not JSON" in (bad.remark or "")

    run(tmp_path, body)


def test_lock_and_unlock_batch(tmp_path: Path) -> None:
    async def body(n: Node) -> None:
        mqs = [{"topic": T, "brokerName": "b", "queueId": q} for q in range(QUEUES)]
        req = {"consumerGroup": G, "clientId": "c1", "mqSet": mqs}
        locked = await n.call(Q.LOCK_BATCH_MQ, None, json.dumps(req).encode())
        assert locked.code == R.SUCCESS, locked.remark
        assert json.loads(locked.body)["lockOKMQSet"] == mqs
        other = {**req, "clientId": "c2"}
        refused = await n.call(Q.LOCK_BATCH_MQ, None, json.dumps(other).encode())
        assert json.loads(refused.body)["lockOKMQSet"] == []
        done = await n.call(Q.UNLOCK_BATCH_MQ, None, json.dumps(req).encode())
        assert done.code == R.SUCCESS
        now = await n.call(Q.LOCK_BATCH_MQ, None, json.dumps(other).encode())
        assert json.loads(now.body)["lockOKMQSet"] == mqs

    run(tmp_path, body)


# ---------------------------------------------------------------------------- retries, lookups


def test_send_back_delays_a_retry_and_dead_letters(tmp_path: Path) -> None:
    async def body(n: Node) -> None:
        await n.call(Q.SEND_MESSAGE_V2, send_v2(0, "TAGS\x01A\x02"), b"fail-me")
        (m,) = decode_messages((await n.call(Q.PULL_MESSAGE, pull_ext(0))).body)
        back = {"offset": m["position"], "group": G, "delayLevel": 0, "originMsgId": m["msg_id"]}
        retried = await n.call(Q.CONSUMER_SEND_MSG_BACK, {**back, "maxReconsumeTimes": 16})
        assert retried.code == R.SUCCESS, retried.remark
        sched = n.broker.sm.queue_offsets(SCHEDULE_TOPIC, 3 - 1)  # level 3 (0 + 3) waits there
        assert sched[1] == 1
        dead = await n.call(Q.CONSUMER_SEND_MSG_BACK, {**back, "delayLevel": -1})
        assert dead.code == R.SUCCESS, dead.remark
        dlq = await n.call(
            Q.PULL_MESSAGE, {**pull_ext(0), "topic": f"%DLQ%{G}", "consumerGroup": G}
        )
        assert decode_messages(dlq.body)[0]["body"] == b"fail-me"
        wrong = await n.call(Q.CONSUMER_SEND_MSG_BACK, {**back, "originMsgId": "CD" * 16})
        assert wrong.code == R.QUERY_NOT_FOUND

    run(tmp_path, body)


def test_view_by_id_and_query_by_key(tmp_path: Path) -> None:
    async def body(n: Node) -> None:
        sent = await n.call(Q.SEND_MESSAGE_V2, send_v2(0, "KEYS\x01order-7\x02"), b"seven")
        position = int(sent.ext_fields["msgId"][16:], 16)
        viewed = await n.call(Q.VIEW_MESSAGE_BY_ID, {"offset": position})
        assert viewed.code == R.SUCCESS
        assert decode_messages(viewed.body)[0]["body"] == b"seven"
        nothing = await n.call(Q.VIEW_MESSAGE_BY_ID, {"offset": position + 1})
        assert nothing.code == R.SYSTEM_ERROR
        q = {"topic": T, "key": "order-7", "maxNum": 32, "beginTimestamp": 0, "endTimestamp": 0}
        found = await n.call(Q.QUERY_MESSAGE, q)
        assert found.code == R.SUCCESS and decode_messages(found.body)[0]["body"] == b"seven"
        none = await n.call(Q.QUERY_MESSAGE, {**q, "key": "order-8"})
        assert none.code == R.QUERY_NOT_FOUND

    run(tmp_path, body)


# ---------------------------------------------------------------------------- refusals


def test_an_unserved_code_is_not_supported_and_changes_nothing(tmp_path: Path) -> None:
    async def body(n: Node) -> None:
        answer = await n.call(Q.UPDATE_AND_CREATE_TOPIC, {"topic": "X", "readQueueNums": 8})
        assert answer.code == R.REQUEST_CODE_NOT_SUPPORTED
        assert "17" in (answer.remark or "") and "UPDATE_AND_CREATE_TOPIC" in (answer.remark or "")
        with pytest.raises(Exception, match="X"):
            n.broker.topics.get("X")

    run(tmp_path, body)


@pytest.mark.parametrize(
    "ext",
    [
        {"e": 0},  # no topic
        {"b": T, "e": "zero"},
        {"b": T, "e": 99},  # queue out of range
        {"b": T, "e": 0, "g": "-1"},
        {"b": T, "e": 0, "h": str(1 << 40)},
    ],
)
def test_a_bad_send_header_is_refused_and_stores_nothing(
    tmp_path: Path, ext: dict[str, object]
) -> None:
    async def body(n: Node) -> None:
        answer = await n.call(Q.SEND_MESSAGE_V2, ext, b"x")
        assert answer.code in (R.SYSTEM_ERROR, R.MESSAGE_ILLEGAL), answer
        assert answer.remark
        assert n.broker.sm.queue_offsets(T, 0) == (0, 0)

    run(tmp_path, body)


def test_a_follower_refuses_offset_commits_and_forwards_nothing_it_cannot(tmp_path: Path) -> None:
    async def body(n: Node) -> None:
        n.node.role = Role.FOLLOWER
        n.node.leader_id = "n1"
        q = {"consumerGroup": G, "topic": T, "queueId": 0, "commitOffset": 1}
        answer = await n.call(Q.UPDATE_CONSUMER_OFFSET, q)
        assert answer.code == R.SERVICE_NOT_AVAILABLE and "NOT_LEADER" in (answer.remark or "")

    run(tmp_path, body)


# ---------------------------------------------------------------------------- ACL


def test_acl_refuses_unsigned_and_wrongly_signed_requests(tmp_path: Path) -> None:
    async def body(n: Node) -> None:
        unsigned = await n.call(Q.SEND_MESSAGE_V2, send_v2(0, ""), b"x")
        assert unsigned.code == R.NO_PERMISSION and "AccessKey" in (unsigned.remark or "")
        wrong = await n.call(Q.SEND_MESSAGE_V2, send_v2(0, ""), b"x", (PUB_KEY, "not-the-secret"))
        assert wrong.code == R.NO_PERMISSION and "UNAUTHENTICATED" in (wrong.remark or "")
        unknown = await n.call(Q.SEND_MESSAGE_V2, send_v2(0, ""), b"x", ("ghost", PUB_SECRET))
        assert unknown.code == R.NO_PERMISSION
        assert n.broker.sm.queue_offsets(T, 0) == (0, 0)

    run(tmp_path, body, guard_on=True)


def test_acl_checks_rights_per_request(tmp_path: Path) -> None:
    async def body(n: Node) -> None:
        pub = (PUB_KEY, PUB_SECRET)
        sent = await n.call(Q.SEND_MESSAGE_V2, send_v2(0, ""), b"x", pub)
        assert sent.code == R.SUCCESS, sent.remark
        pulled = await n.call(Q.PULL_MESSAGE, pull_ext(0), keys=pub)
        assert pulled.code == R.NO_PERMISSION and "may not Sub" in (pulled.remark or "")
        # A body is signed too: the same header with another body does not pass.
        signed = sign({k: str(v) for k, v in send_v2(0, "").items()}, b"x", *pub)
        n.opaque += 1
        swapped = RemotingCommand(Q.SEND_MESSAGE_V2, n.opaque, ext_fields=signed, body=b"y")
        assert (await n.client.request(swapped, TIMEOUT_S)).code == R.NO_PERMISSION
        reader = (SUB_KEY, SUB_SECRET)
        assert (await n.call(Q.PULL_MESSAGE, pull_ext(0), keys=reader)).code == R.SUCCESS
        denied = await n.call(Q.SEND_MESSAGE_V2, send_v2(0, ""), b"x", reader)
        assert denied.code == R.NO_PERMISSION and "may not Pub" in (denied.remark or "")

    run(tmp_path, body, guard_on=True)


def test_end_transaction_commits_and_rolls_back_a_half(tmp_path: Path) -> None:
    async def body(n: Node) -> None:
        halves = []
        for i in range(2):
            sent = await n.call(Q.SEND_MESSAGE_V2, send_v2(0, "TRAN_MSG\x01true\x02"), b"h%d" % i)
            assert sent.code == R.SUCCESS, sent.remark
            halves.append(int(sent.ext_fields["msgId"][16:], 16))
            assert sent.ext_fields["transactionId"] == f"{halves[-1]:016X}"
        assert (await n.call(Q.PULL_MESSAGE, pull_ext(0))).code == R.PULL_NOT_FOUND
        end = {"producerGroup": "PG", "tranStateTableOffset": 0, "fromTransactionCheck": "false"}
        for position, verdict in zip(halves, (8, 12), strict=True):
            ext = {**end, "commitLogOffset": position, "commitOrRollback": verdict}
            done = await n.call(Q.END_TRANSACTION, ext)
            assert done.code == R.SUCCESS, done.remark
        pulled = decode_messages((await n.call(Q.PULL_MESSAGE, pull_ext(0))).body)
        assert [m["body"] for m in pulled] == [b"h0"]  # committed; the other rolled back
        contrary = {**end, "commitLogOffset": halves[0], "commitOrRollback": 12}
        assert (await n.call(Q.END_TRANSACTION, contrary)).code == R.SYSTEM_ERROR
        sent = await n.call(Q.SEND_MESSAGE_V2, send_v2(0, ""), b"plain")
        plain = {**end, "commitLogOffset": int(sent.ext_fields["msgId"][16:], 16)}
        refused = await n.call(Q.END_TRANSACTION, {**plain, "commitOrRollback": 8})
        assert refused.code == R.SYSTEM_ERROR and "not a transaction" in (refused.remark or "")

    run(tmp_path, body)


def test_earliest_message_time(tmp_path: Path) -> None:
    async def body(n: Node) -> None:
        queue = {"topic": T, "queueId": 0}
        empty = await n.call(Q.GET_EARLIEST_MSG_STORETIME, queue)
        assert empty.code == R.SUCCESS and empty.ext_fields["timestamp"] == "-1"
        before = int(time.time() * 1000)
        await n.call(Q.SEND_MESSAGE_V2, send_v2(0, ""), b"first")
        first = await n.call(Q.GET_EARLIEST_MSG_STORETIME, queue)
        assert before <= int(first.ext_fields["timestamp"]) <= int(time.time() * 1000)

    run(tmp_path, body)


def test_a_follower_without_a_leader_answers_a_send_service_not_available(tmp_path: Path) -> None:
    async def body(n: Node) -> None:
        n.node.role = Role.FOLLOWER
        n.node.leader_id = None  # an election: the forwarder finds no leader within its budget
        sent = await n.call(Q.SEND_MESSAGE_V2, send_v2(0, ""), b"x")
        assert sent.code == R.SERVICE_NOT_AVAILABLE and "NO_LEADER" in (sent.remark or "")
        assert n.broker.sm.queue_offsets(T, 0) == (0, 0)

    run(tmp_path, body)


def test_kept_subscriptions_are_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from broker.frontends.remoting import service

    monkeypatch.setattr(service, "MAX_KEPT_SUBSCRIPTIONS", 2)

    async def body(n: Node) -> None:
        for i in range(5):
            subs = [{"topic": T, "subString": "A"}, {"topic": f"T{i}", "subString": "*"}]
            group = {"groupName": f"G{i}", "subscriptionDataSet": subs}
            beat = {"clientID": "c", "consumerDataSet": [group]}
            ok = await n.call(Q.HEART_BEAT, None, json.dumps(beat).encode())
            assert ok.code == R.SUCCESS, ok.remark
        kept = n.service._subscriptions
        assert len(kept) <= 2 and kept[("G4", T)] == "A"

    run(tmp_path, body)


def test_a_group_change_is_notified_to_its_other_consumers(tmp_path: Path) -> None:
    async def body(n: Node) -> None:
        seen: list[RemotingCommand] = []
        woken = asyncio.Event()

        async def on_request(cmd: RemotingCommand, conn: Any) -> None:
            seen.append(cmd)
            woken.set()

        first = await RemotingClient.connect("127.0.0.1", n.server.port, handler=on_request)
        other = Node(n.broker, n.server, first, n.node, n.service)

        def beat(client_id: str) -> bytes:
            subs = [{"topic": T, "subString": "*"}]
            group = {"groupName": G, "messageModel": "CLUSTERING", "subscriptionDataSet": subs}
            return json.dumps({"clientID": client_id, "consumerDataSet": [group]}).encode()

        try:
            assert (await other.call(Q.HEART_BEAT, None, beat("c1"))).code == R.SUCCESS
            assert (await n.call(Q.HEART_BEAT, None, beat("c2"))).code == R.SUCCESS
            await asyncio.wait_for(woken.wait(), TIMEOUT_S)
            assert seen[0].code == Q.NOTIFY_CONSUMER_IDS_CHANGED and seen[0].is_oneway
            assert seen[0].ext_fields["consumerGroup"] == G
            woken.clear()
            await n.call(Q.HEART_BEAT, None, beat("c2"))  # not new: nobody is told again
            await n.call(Q.UNREGISTER_CLIENT, {"clientID": "c2", "consumerGroup": G})
            await asyncio.wait_for(woken.wait(), TIMEOUT_S)
            assert len(seen) == 2
        finally:
            await first.close()

    run(tmp_path, body)


# ---------------------------------------------------------------------------- check-backs


def _heartbeat(client_id: str, *producer_groups: str) -> bytes:
    groups = [{"groupName": g} for g in (*producer_groups, "CLIENT_INNER_PRODUCER")]
    return json.dumps({"clientID": client_id, "producerDataSet": groups}).encode()


async def _transactional_producer(
    n: Node, port: int, verdict: int, keys: tuple[str, str] | None = None
) -> tuple[RemotingClient, list[RemotingCommand], asyncio.Event]:
    """A 4.x producer of group PG on its own connection whose checker answers ``verdict`` to
    every check-back, as a 4.x client does: END_TRANSACTION with fromTransactionCheck=true."""
    checks: list[RemotingCommand] = []
    answered = asyncio.Event()

    async def checker(cmd: RemotingCommand, conn: Any) -> RemotingCommand | None:
        assert cmd.code == Q.CHECK_TRANSACTION_STATE
        checks.append(cmd)
        ext = {
            "producerGroup": "PG",
            "tranStateTableOffset": cmd.ext_fields["tranStateTableOffset"],
            "commitLogOffset": cmd.ext_fields["commitLogOffset"],
            "commitOrRollback": str(verdict),
            "fromTransactionCheck": "true",
            "msgId": cmd.ext_fields["msgId"],
            "transactionId": cmd.ext_fields["transactionId"],
        }
        if keys is not None:
            ext = sign(ext, b"", *keys)
        end = RemotingCommand(Q.END_TRANSACTION, 0, ext_fields=ext)
        done = await conn.request(end, TIMEOUT_S)
        assert done.code == R.SUCCESS, done.remark
        answered.set()
        return None  # the check is oneway

    client = await RemotingClient.connect("127.0.0.1", port, handler=checker)
    ext: dict[str, str] = {}
    body = _heartbeat("producer@1", "PG")
    beat = RemotingCommand(
        Q.HEART_BEAT, 1, ext_fields=sign(ext, body, *keys) if keys else ext, body=body
    )
    assert (await client.request(beat, TIMEOUT_S)).code == R.SUCCESS
    return client, checks, answered


async def _half(n: Node, keys: tuple[str, str] | None = None) -> int:
    ext = {**send_v2(0, "TRAN_MSG\x01true\x02PGROUP\x01PG\x02"), "a": "PG"}
    sent = await n.call(Q.SEND_MESSAGE_V2, ext, b"half", keys)
    assert sent.code == R.SUCCESS, sent.remark
    return int(sent.ext_fields["msgId"][16:], 16)


def test_an_unresolved_half_is_checked_back_on_its_producers_connection(tmp_path: Path) -> None:
    async def body(n: Node) -> None:
        port = n.server.port
        client, checks, answered = await _transactional_producer(n, port, 8)
        try:
            position = await _half(n)
            assert (await n.call(Q.PULL_MESSAGE, pull_ext(0))).code == R.PULL_NOT_FOUND
            now_ms = int(time.time() * 1000)
            await n.broker.txns.check_pass(now_ms + n.broker.cfg.txn_timeout_ms + 1000)
            await asyncio.wait_for(answered.wait(), TIMEOUT_S)
        finally:
            await client.close()
        [check] = checks
        assert check.ext_fields["commitLogOffset"] == str(position)
        assert check.ext_fields["transactionId"] == f"{position:016X}"
        [half] = decode_messages(check.body)
        assert (half["topic"], half["queue_id"], half["body"]) == (T, 0, b"half")
        assert half["position"] == position and half["props"]["TRAN_MSG"] == "true"
        assert check.ext_fields["msgId"] == half["props"]["UNIQ_KEY"]
        pulled = decode_messages((await n.call(Q.PULL_MESSAGE, pull_ext(0))).body)
        assert [m["body"] for m in pulled] == [b"half"]  # committed by the check's answer
        assert n.service.producers.checks_sent == 1

    run(tmp_path, body)


def test_a_check_goes_only_to_a_producer_of_the_group_that_may_publish(tmp_path: Path) -> None:
    async def body(n: Node) -> None:
        pub, sub = (PUB_KEY, PUB_SECRET), (SUB_KEY, SUB_SECRET)
        # A reader's connection names producer group PG too: it may not Pub on T, so it is
        # never handed the half (which would let it end the transaction).
        reader, reader_checks, _ = await _transactional_producer(n, n.server.port, 12, sub)
        try:
            position = await _half(n, pub)
            now_ms = int(time.time() * 1000) + n.broker.cfg.txn_timeout_ms
            await n.broker.txns.check_pass(now_ms + 1000)
            assert reader_checks == [] and n.service.producers.checks_unsent == 1
            producer, checks, answered = await _transactional_producer(n, n.server.port, 8, pub)
            try:
                await n.broker.txns.check_pass(now_ms + 100_000)
                await asyncio.wait_for(answered.wait(), TIMEOUT_S)
            finally:
                await producer.close()
        finally:
            await reader.close()
        assert reader_checks == [] and [c.ext_fields["commitLogOffset"] for c in checks] == [
            str(position)
        ]
        pulled = await n.call(Q.PULL_MESSAGE, pull_ext(0), keys=sub)
        assert [m["body"] for m in decode_messages(pulled.body)] == [b"half"]

    run(tmp_path, body, guard_on=True)


def test_producer_connections_are_bounded_and_leave(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(checkback, "MAX_PRODUCER_GROUPS", 2)
    monkeypatch.setattr(checkback, "MAX_PRODUCERS_PER_GROUP", 1)

    async def body(n: Node) -> None:
        first = RemotingClient.connect("127.0.0.1", n.server.port)
        other = await first
        try:
            for client in (n.client, other):
                beat = RemotingCommand(Q.HEART_BEAT, 1, body=_heartbeat("c", "A", "B", "C"))
                assert (await client.request(beat, TIMEOUT_S)).code == R.SUCCESS
            groups = n.service.producers._groups
            assert set(groups) == {"A", "B"}  # the third group, and CLIENT_INNER_PRODUCER: not
            assert all(len(members) == 1 for members in groups.values())  # the first one only
            gone = {"clientID": "c", "producerGroup": "A"}
            assert (await n.call(Q.UNREGISTER_CLIENT, gone)).code == R.SUCCESS
            assert set(groups) == {"B"}
        finally:
            await other.close()

    run(tmp_path, body)


class _Conn:
    """A connection as the table sees it: hashable by identity, open."""

    closed = False


def test_one_user_holds_a_share_of_the_producer_connections(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The check-back table is shared: one user naming many groups (or taking a group's every
    slot) keeps at most its share, and another user's producer is still kept; without users
    (user "") there is one tenant and no share."""
    monkeypatch.setattr(checkback, "MAX_PRODUCERS_PER_USER", 3)
    txn = SimpleNamespace(add_check_listener=lambda listener: None)
    applied = SimpleNamespace(ctx=SimpleNamespace(sm=SimpleNamespace(txn=txn)))
    table = checkback.RemotingProducers(applied, b"\0" * 8)  # type: ignore[arg-type]
    mallory, alice = _Conn(), _Conn()
    for i in range(10):
        table.producing(f"g{i}", mallory, "mallory")  # type: ignore[arg-type]
    table.producing("g0", mallory, "mallory")  # a heartbeat again: still one entry
    table.producing("alice-pg", alice, "alice")  # type: ignore[arg-type]
    held = {g: [p.user for p in m.values()] for g, m in table._groups.items()}
    assert held == {"g0": ["mallory"], "g1": ["mallory"], "g2": ["mallory"], "alice-pg": ["alice"]}
    table.leave("g1", mallory)  # type: ignore[arg-type]
    table.producing("g9", mallory, "mallory")  # type: ignore[arg-type]
    assert "g9" in table._groups and "g1" not in table._groups
    for i in range(10):
        table.producing(f"open{i}", mallory, "")  # type: ignore[arg-type]
    assert all(f"open{i}" in table._groups for i in range(10))
