"""RocketMQ's remoting ACL with a real 4.x client: the npm package ali-ons, unmodified, signs its
requests (channel.js: HmacSHA1 over the sorted ext field values and the body) and the broker's
guard checks them against its users and ACLs (docs/REMOTING.md, "ACL").

One node in this process (tests/remoting_support.py's: the real remoting service over a
real state machine and an in-memory log, behind the real AuthGuard) and a NameServer stand-in
answering ali-ons's route requests with that node; the producer runs in its own node process.
"""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import pytest
from remoting_support import PUB_KEY, PUB_SECRET, QUEUES, Node, T, start_node

from remoting.codes import RequestCode, ResponseCode
from remoting.connection import RemotingConnection
from remoting.protocol import RemotingCommand
from remoting.server import RemotingServer, not_supported

pytestmark = [pytest.mark.integration]

ROOT = Path(__file__).resolve().parents[2]
ONS_MODULES = ROOT / "build" / "ons" / "node" / "node_modules"
SCRIPT = ROOT / "tests" / "remoting" / "ons_producer.js"
SENDS = 5
RUN_TIMEOUT_S = 60

pytestmark.append(
    pytest.mark.skipif(
        not (ONS_MODULES / "ali-ons").is_dir(), reason="build/ons is missing: run make venv"
    )
)


def _routes(broker_addr: str) -> RemotingServer:
    """A NameServer stand-in: every topic routed to ``broker_addr`` as brokerId 0."""

    async def handle(cmd: RemotingCommand, conn: RemotingConnection) -> RemotingCommand:
        if cmd.code != RequestCode.GET_ROUTEINFO_BY_TOPIC:
            return not_supported(cmd)
        route = {
            "queueDatas": [
                {
                    "brokerName": "b",
                    "readQueueNums": QUEUES,
                    "writeQueueNums": QUEUES,
                    "perm": 6,
                    "topicSysFlag": 0,
                }
            ],
            "brokerDatas": [{"cluster": "c", "brokerName": "b", "brokerAddrs": {"0": broker_addr}}],
            "filterServerTable": {},
        }
        return cmd.response(ResponseCode.SUCCESS, None, {}, json.dumps(route).encode())

    return RemotingServer(handle, name="routes")


async def _produce(namesrv: str, home: Path, keys: tuple[str, str]) -> tuple[int, list[dict]]:
    env = {
        "PATH": os.environ.get("PATH", ""),
        "HOME": str(home),
        "NODE_PATH": str(ONS_MODULES),
        "ONS_RETRY_S": "0",
    }
    args = [str(SCRIPT), namesrv, T, str(SENDS), "acl", "0", *keys]
    proc = await asyncio.create_subprocess_exec(
        "node", *args, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL
    )
    out, _ = await asyncio.wait_for(proc.communicate(), RUN_TIMEOUT_S)
    lines = [json.loads(line) for line in out.decode().splitlines() if line.startswith("{")]
    assert proc.returncode is not None
    return proc.returncode, lines


def test_ali_ons_signatures_pass_and_a_wrong_secret_is_refused(tmp_path: Path) -> None:
    async def main() -> None:
        n: Node = await start_node(tmp_path, guard_on=True)
        routes = _routes(f"127.0.0.1:{n.server.port}")
        ns_port = await routes.start("127.0.0.1", 0)
        try:
            code, lines = await _produce(f"127.0.0.1:{ns_port}", tmp_path, (PUB_KEY, PUB_SECRET))
            assert code == 0, lines
            assert sum(e.get("event") == "sent" for e in lines) == SENDS
            stored = sum(n.broker.sm.queue_offsets(T, q)[1] for q in range(QUEUES))
            assert stored == SENDS
            code, lines = await _produce(f"127.0.0.1:{ns_port}", tmp_path, (PUB_KEY, "wrong"))
            assert code != 0
            # ali-ons retries NO_PERMISSION (16) on its queues, then names no code: it failed.
            assert [e for e in lines if e.get("event") == "error"]
            assert not [e for e in lines if e.get("event") == "sent"]
            stored = sum(n.broker.sm.queue_offsets(T, q)[1] for q in range(QUEUES))
            assert stored == SENDS  # nothing more
        finally:
            await routes.stop()
            await n.client.close()
            await n.server.stop()

    asyncio.run(main())
