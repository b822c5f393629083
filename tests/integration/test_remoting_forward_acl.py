"""A RocketMQ 4.x send to a member that does not lead, on a secure 3-node group (TLS, users and
ACLs, as ``mqcluster up`` makes it; docs/REMOTING.md, "Leaders and followers"): the member checks
the request's signature, forwards it to the leader with the request's proof (AccessKey,
Signature, signed material) and the leader checks it again, so the send is stored; a request
whose signature does not match is refused NO_PERMISSION and stores nothing. A half message a
4.x producer leaves unresolved is checked back on its connection to a follower
(CHECK_TRANSACTION_STATE), whose commit is forwarded the same way. Spoken with the remoting
package's client over TLS, signed as ali-ons signs."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import json
import ssl
import time
from collections.abc import Callable

import pytest
from support import create_topic_on

from mqcluster.cluster import LocalCluster
from remoting.client import RemotingClient
from remoting.codes import RequestCode, ResponseCode
from remoting.connection import RemotingConnection
from remoting.protocol import RemotingCommand
from remoting.server import not_supported

pytestmark = [pytest.mark.integration]

T = "RemotingForward"
QUEUES = 2
CALL_TIMEOUT_S = 10.0
# A half's first check: its transactionTimeOut (0.5 s) and a check pass (every 0.5 s) on the
# leader, the record's replication, the forwarded commit; a loaded machine.
CHECK_WAIT_S = 30.0


def _signed(fields: dict[str, str], body: bytes, key: str, secret: str) -> dict[str, str]:
    out = {**fields, "AccessKey": key, "OnsChannel": "ALIYUN"}
    material = "".join(out[k] for k in sorted(out)).encode() + body
    digest = hmac.new(secret.encode(), material, hashlib.sha1).digest()
    return {**out, "Signature": base64.b64encode(digest).decode()}


def _send_fields(queue_id: int) -> dict[str, str]:
    return {
        "a": "PG",
        "b": T,
        "c": "TBW102",
        "d": str(QUEUES),
        "e": str(queue_id),
        "f": "0",
        "g": str(int(time.time() * 1000)),
        "h": "0",
        "i": "",
        "j": "0",
        "k": "false",
    }


async def _sends(
    cluster: LocalCluster, port: int, secret: str, count: int
) -> list[RemotingCommand]:
    creds = cluster.client_security().credentials
    assert creds is not None
    context = ssl.create_default_context(cafile=str(cluster.layout.ca_cert))
    client = await RemotingClient.connect("127.0.0.1", port, ssl_context=context)
    answers = []
    try:
        for i in range(count):
            body = f"forwarded-{i}".encode()
            fields = _signed(_send_fields(i % QUEUES), body, creds.access_key, secret)
            cmd = RemotingCommand(RequestCode.SEND_MESSAGE_V2, 0, ext_fields=fields, body=body)
            answers.append(await client.request(cmd, CALL_TIMEOUT_S))
    finally:
        await client.close()
    return answers


def test_a_follower_forwards_a_signed_remoting_send_and_refuses_a_forged_one(
    local_group: Callable[..., LocalCluster],
) -> None:
    cluster = local_group(namesrv=True, secure=True)
    assert cluster.namesrv is not None
    create_topic_on([cluster], [cluster.namesrv.addr], T, QUEUES)
    leader = cluster.wait_leader()
    follower = next(n for n in cluster.nodes if n.node_id != leader)
    assert follower.remoting_port
    creds = cluster.client_security().credentials
    assert creds is not None
    answers = asyncio.run(_sends(cluster, follower.remoting_port, creds.secret_key, 4))
    assert [a.code for a in answers] == [ResponseCode.SUCCESS] * 4, [a.remark for a in answers]
    # Stored by the leader: each answer names a distinct position.
    assert len({a.ext_fields["msgId"] for a in answers}) == 4
    [forged] = asyncio.run(_sends(cluster, follower.remoting_port, "not-the-secret", 1))
    assert forged.code == ResponseCode.NO_PERMISSION
    assert "UNAUTHENTICATED" in (forged.remark or "")


async def _check_back(cluster: LocalCluster, port: int) -> tuple[str, list[RemotingCommand]]:
    """A transactional 4.x producer of group PG on ``port``: sends one half message and never
    ends it; its checker commits on the broker's CHECK_TRANSACTION_STATE. The half's
    transactionId and the checks it was sent."""
    creds = cluster.client_security().credentials
    assert creds is not None
    key, secret = creds.access_key, creds.secret_key
    checks: list[RemotingCommand] = []
    answered = asyncio.Event()

    async def checker(cmd: RemotingCommand, conn: RemotingConnection) -> RemotingCommand | None:
        if cmd.code != RequestCode.CHECK_TRANSACTION_STATE:
            return not_supported(cmd)
        checks.append(cmd)
        ext = {
            "producerGroup": "PG",
            "tranStateTableOffset": cmd.ext_fields["tranStateTableOffset"],
            "commitLogOffset": cmd.ext_fields["commitLogOffset"],
            "commitOrRollback": "8",
            "fromTransactionCheck": "true",
            "msgId": cmd.ext_fields["msgId"],
        }
        end = RemotingCommand(
            RequestCode.END_TRANSACTION, 0, ext_fields=_signed(ext, b"", key, secret)
        )
        done = await conn.request(end, CALL_TIMEOUT_S)
        if done.code == ResponseCode.SUCCESS:
            answered.set()
        return None

    context = ssl.create_default_context(cafile=str(cluster.layout.ca_cert))
    client = await RemotingClient.connect("127.0.0.1", port, ssl_context=context, handler=checker)
    try:
        body = json.dumps({"clientID": "txn@1", "producerDataSet": [{"groupName": "PG"}]}).encode()
        beat = RemotingCommand(
            RequestCode.HEART_BEAT, 0, ext_fields=_signed({}, body, key, secret), body=body
        )
        assert (await client.request(beat, CALL_TIMEOUT_S)).code == ResponseCode.SUCCESS
        fields = {**_send_fields(0), "i": "TRAN_MSG\x01true\x02PGROUP\x01PG\x02"}
        half = RemotingCommand(
            RequestCode.SEND_MESSAGE_V2,
            0,
            ext_fields=_signed(fields, b"half", key, secret),
            body=b"half",
        )
        sent = await client.request(half, CALL_TIMEOUT_S)
        assert sent.code == ResponseCode.SUCCESS, sent.remark
        await asyncio.wait_for(answered.wait(), CHECK_WAIT_S)
    finally:
        await client.close()
    return sent.ext_fields["transactionId"], checks


def test_a_follower_checks_back_a_half_on_its_producers_connection(
    local_group: Callable[..., LocalCluster],
) -> None:
    """The leader's check record reaches the member holding the producer's connection, which
    sends CHECK_TRANSACTION_STATE; the producer's commit (END_TRANSACTION, signed) is forwarded
    to the leader with its proof and answered SUCCESS once the leader committed the half."""
    cluster = local_group(
        namesrv=True, secure=True, transactionTimeOut=500, transactionCheckInterval=500
    )
    assert cluster.namesrv is not None
    create_topic_on([cluster], [cluster.namesrv.addr], T, QUEUES)
    leader = cluster.wait_leader()
    follower = next(n for n in cluster.nodes if n.node_id != leader)
    txn_id, checks = asyncio.run(_check_back(cluster, follower.remoting_port))
    assert checks and checks[0].ext_fields["transactionId"] == txn_id
    assert int(checks[0].ext_fields["commitLogOffset"]) == int(txn_id, 16)
