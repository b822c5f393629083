"""A RocketMQ 4.x send to a member that does not lead, on a secure 3-node group (TLS, users and
ACLs, as ``mqcluster up`` makes it; docs/REMOTING.md, "Leaders and followers"): the member checks
the request's signature, forwards it to the leader with the request's proof (AccessKey,
Signature, signed material) and the leader checks it again, so the send is stored; a request
whose signature does not match is refused NO_PERMISSION and stores nothing. Spoken with the
remoting package's client over TLS, signed as ali-ons signs."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import ssl
import time
from collections.abc import Callable

import pytest
from support import create_topic_on

from mqcluster.cluster import LocalCluster
from remoting.client import RemotingClient
from remoting.codes import RequestCode, ResponseCode
from remoting.protocol import RemotingCommand

pytestmark = [pytest.mark.integration]

T = "RemotingForward"
QUEUES = 2
CALL_TIMEOUT_S = 10.0


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
