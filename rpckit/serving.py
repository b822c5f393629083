"""Setting up a gRPC server's port and standard services, shared by every server of the
project (the DLedger node's two ports, the NameServer): one clear start error for a port in
use or a bad certificate file, health checking and reflection for `grpcurl` and load
balancers."""

from __future__ import annotations

import socket
from collections.abc import Callable, Sequence

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from mqsecurity.errors import CertificateError
from mqsecurity.tls import TlsFiles, check_server_files, server_credentials


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


def _probe(addr: str, start_error: Callable[[str], Exception]) -> None:
    """Bind ``addr`` once ourselves: a port in use or not bindable raises
    ``start_error(one line)`` before gRPC core logs its own bind error."""
    host, _, port_text = addr.rpartition(":")
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host.strip("[]"), int(port_text)))
        except OSError as exc:
            raise start_error(f"port in use or not bindable: {addr} ({exc.strerror})") from None


def bind_insecure(
    server: grpc.aio.Server, addr: str, start_error: Callable[[str], Exception]
) -> int:
    """Add a plaintext port ``host:port`` to ``server``; the bound port. A port in use or not
    bindable raises ``start_error(one line)``."""
    return _add_port(lambda: server.add_insecure_port(addr), addr, start_error)


def _add_port(add: Callable[[], int], addr: str, start_error: Callable[[str], Exception]) -> int:
    _probe(addr, start_error)
    try:
        port = add()
    except RuntimeError:
        port = 0
    if port == 0:
        raise start_error(f"port in use or not bindable: {addr}")
    return int(port)


def bind_secure(
    server: grpc.aio.Server,
    addr: str,
    files: TlsFiles,
    start_error: Callable[[str], Exception],
    *,
    require_client_cert: bool,
) -> int:
    """Add a TLS port ``host:port`` to ``server`` serving ``files``' certificate; with
    ``require_client_cert`` only clients showing a certificate signed by ``files.ca_path``
    complete the handshake (mutual TLS). A bad certificate, key or CA file, or a port in use,
    raises ``start_error(one line naming the setting)``."""
    try:
        check_server_files(files)
        credentials = server_credentials(files, require_client_cert)
    except CertificateError as exc:
        raise start_error(str(exc)) from None
    return _add_port(lambda: server.add_secure_port(addr, credentials), addr, start_error)


def bind(
    server: grpc.aio.Server,
    addr: str,
    files: TlsFiles | None,
    start_error: Callable[[str], Exception],
    *,
    require_client_cert: bool = False,
) -> int:
    """`bind_secure` when ``files`` is set, else `bind_insecure`."""
    if files is None:
        return bind_insecure(server, addr, start_error)
    return bind_secure(server, addr, files, start_error, require_client_cert=require_client_cert)
