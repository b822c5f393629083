"""Helpers shared by the RocketMQ 5 front end's integration tests (tests/integration/
test_rmq5_*.py): the generated v2 stubs are loaded on first use, so importing this module
costs nothing to tests that do not use them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import grpc
from support import wait_for

from broker.cluster import LocalCluster

ROUTE_WAIT_S = 10
ROOT = Path(__file__).resolve().parents[1]
RMQ5 = ROOT / "build" / "rmq5"
# The official clients' scripts, the Python client's venv, the Node.js client's modules.
SCRIPTS = ROOT / "tests" / "rmq5"
PYTHON = RMQ5 / "pyclient" / "bin" / "python"
NODE_MODULES = RMQ5 / "node" / "node_modules"


def v2_code(status: Any) -> str:
    """The name of a body status's ``apache.rocketmq.v2.Code``."""
    from broker.rmq5 import stubs

    v2, _service, _grpc = stubs.load()
    return str(v2.Code.Name(status.code))


def wait_v2_routes(cluster: LocalCluster, topic: str) -> None:
    """Wait until every member's v2 port routes ``topic`` (each applied its creation)."""
    from broker.rmq5 import stubs

    v2, v2_service, v2_grpc = stubs.load()
    ask = v2_service.QueryRouteRequest(topic=v2.Resource(name=topic))
    for n in cluster.nodes:
        with grpc.insecure_channel(n.grpc_addr) as ch:
            stub = v2_grpc.MessagingServiceStub(ch)

            def routed(stub: Any = stub) -> bool:
                try:
                    return v2_code(stub.QueryRoute(ask, timeout=5).status) == "OK"
                except grpc.RpcError:
                    return False

            wait_for(routed, ROUTE_WAIT_S, f"{topic} routed by {n.node_id}")
