"""Setting up a gRPC server's port and standard services, shared by every server of the
project (the DLedger node's two ports, the NameServer): one clear start error for a port in
use, health checking and reflection for `grpcurl` and load balancers."""

from __future__ import annotations

import socket
from collections.abc import Callable, Sequence

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection


def add_health_and_reflection(server: grpc.aio.Server, names: Sequence[str]) -> None:
    """Serve ``grpc.health.v1.Health`` (every service in ``names`` and the server as a whole
    SERVING) and server reflection for ``names``."""
    health_servicer = health.HealthServicer(experimental_non_blocking=True)
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    for name in ["", *names]:
        health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    reflection.enable_server_reflection(
        [
            *names,
            health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
            reflection.SERVICE_NAME,
        ],
        server,
    )


def bind_insecure(
    server: grpc.aio.Server, addr: str, start_error: Callable[[str], Exception]
) -> int:
    """Add a plaintext port ``host:port`` to ``server``; the bound port. A port in use or not
    bindable raises ``start_error(one line)`` before gRPC core logs its own bind error."""
    host, _, port_text = addr.rpartition(":")
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host.strip("[]"), int(port_text)))
        except OSError as exc:
            raise start_error(f"port in use or not bindable: {addr} ({exc.strerror})") from None
    try:
        port = server.add_insecure_port(addr)
    except RuntimeError:
        port = 0
    if port == 0:
        raise start_error(f"port in use or not bindable: {addr}")
    return int(port)
