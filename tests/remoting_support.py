"""What the remoting front end's tests share: one broker node in this process with the real
remoting service on a real remoting server on 127.0.0.1, over a real state machine and an
in-memory log (tests/broker_world.py), optionally behind the real AuthGuard with users and ACLs,
and a client of the remoting package to call it (RocketMQ's ACL signature as ali-ons makes it)."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from broker_world import world

from broker.app import Broker, assemble
from broker.components.applied import NodeContext
from broker.components.authadmin import AuthAdmin
from broker.components.settings import ServiceConfig
from broker.frontends.authguard import AuthGuard, AuthSettings
from broker.frontends.internal.forwarder import Forwarder
from broker.frontends.remoting.service import RemotingBrokerService
from broker.state.auth.secrets import SecretBox
from remoting.client import RemotingClient
from remoting.protocol import RemotingCommand
from remoting.server import RemotingServer

BOX = SecretBox(bytes(range(32)))
CFG = ServiceConfig("127.0.0.1", 10911)
T, G = "T", "G"
QUEUES = 2
TIMEOUT_S = 5.0
PUB_KEY, PUB_SECRET = "publisher", "publisher-secret-1"  # Pub on T only
SUB_KEY, SUB_SECRET = "reader", "reader-secret-1"  # Sub on everything


@dataclass
class Node:
    broker: Broker
    server: RemotingServer
    client: RemotingClient
    node: Any
    service: RemotingBrokerService
    opaque: int = 0

    async def call(
        self,
        code: int,
        ext: Mapping[str, object] | None = None,
        body: bytes = b"",
        keys: tuple[str, str] | None = None,
    ) -> RemotingCommand:
        fields = {k: str(v) for k, v in (ext or {}).items()}
        if keys is not None:
            fields = sign(fields, body, *keys)
        self.opaque += 1
        cmd = RemotingCommand(code=code, opaque=self.opaque, ext_fields=fields, body=body)
        return await self.client.request(cmd, TIMEOUT_S)


def sign(fields: dict[str, str], body: bytes, access_key: str, secret: str) -> dict[str, str]:
    """RocketMQ's ACL as ali-ons's channel.js signs: HmacSHA1 over the values of the fields
    (AccessKey and OnsChannel included) in key order, then the body; base64."""
    out = {**fields, "AccessKey": access_key, "OnsChannel": "ALIYUN"}
    text = "".join(out[k] for k in sorted(out)).encode() + body
    out["Signature"] = base64.b64encode(
        hmac.new(secret.encode(), text, hashlib.sha1).digest()
    ).decode()
    return out


async def start_node(tmp_path: Path, guard_on: bool) -> Node:
    node, sm, _topics, _applied = world(tmp_path, CFG)
    guard = None
    if guard_on:
        admin = AuthAdmin(NodeContext(node, sm, CFG), BOX)
        await admin.create_user("admin", "admin-secret-1", "Super", "")
        await admin.create_user(PUB_KEY, PUB_SECRET, "", "")
        await admin.create_user(SUB_KEY, SUB_SECRET, "", "")
        await admin.put_acl(f"User:{PUB_KEY}", [f"Topic:{T}"], ["Pub"], "Allow", [], update=False)
        await admin.put_acl(
            f"User:{SUB_KEY}", ["Topic:*", "Group:*"], ["Sub", "Get"], "Allow", [], update=False
        )
        guard = AuthGuard(sm, AuthSettings(True, True, cluster_name="c1"), BOX)
    broker = assemble(node, sm, CFG, secret_box=BOX, guard=guard)
    await broker.topics.upsert(T, QUEUES, QUEUES, 6)
    service = RemotingBrokerService(broker, Forwarder(node, broker.leader_ops), "10.1.2.3:9876")
    server = RemotingServer(service.handle)
    port = await server.start("127.0.0.1", 0)
    client = await RemotingClient.connect("127.0.0.1", port)
    return Node(broker, server, client, node, service)


def run(tmp_path: Path, body: Callable[[Node], Awaitable[None]], guard_on: bool = False) -> None:
    """``body`` against a fresh node (with users and ACLs when ``guard_on``)."""

    async def main() -> None:
        node = await start_node(tmp_path, guard_on)
        try:
            await body(node)
        finally:
            await node.client.close()
            await node.server.stop()

    asyncio.run(main())
