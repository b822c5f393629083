"""One way to open a client channel: plaintext or TLS, every call signed when credentials are
given. The bundled clients, the tools and the servers' own outgoing calls use these."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import grpc
import grpc.aio

from mqsecurity.credentials import Credentials
from mqsecurity.signing import signed_metadata
from mqsecurity.tls import TlsFiles, channel_credentials

ChannelOptions = Sequence[tuple[str, Any]]


@dataclass(frozen=True)
class ClientSecurity:
    """How a client reaches a server: ``tls`` None is plaintext; ``credentials`` None sends
    no signature (an anonymous caller). ``server_name`` overrides the name the server's
    certificate is checked against (when dialling an address its certificate does not name)."""

    tls: TlsFiles | None = None
    credentials: Credentials | None = None
    server_name: str | None = None

    def describe(self) -> str:
        """One line for logs and reports; never the secret."""
        mode = "tls" if self.tls is not None else "plaintext"
        if self.tls is not None and self.tls.has_identity():
            mode = "mtls"
        who = self.credentials.access_key if self.credentials is not None else "anonymous"
        return f"{mode} as {who}"


PLAINTEXT = ClientSecurity()


def _options(security: ClientSecurity, options: ChannelOptions) -> list[tuple[str, Any]]:
    merged = list(options)
    if security.server_name is not None:
        merged.append(("grpc.ssl_target_name_override", security.server_name))
    return merged


def _with_signature(metadata: Any, credentials: Credentials) -> list[tuple[str, str]]:
    kept = [(k, v) for k, v in (metadata or ()) if k not in ("authorization", "x-mq-date-time")]
    return kept + list(signed_metadata(credentials))


class _Details(grpc.ClientCallDetails):  # type: ignore[misc]
    def __init__(self, base: grpc.ClientCallDetails, metadata: list[tuple[str, str]]) -> None:
        self.method = base.method
        self.timeout = base.timeout
        self.metadata = metadata
        self.credentials = base.credentials
        self.wait_for_ready = getattr(base, "wait_for_ready", None)
        self.compression = getattr(base, "compression", None)


class _Signer(
    grpc.UnaryUnaryClientInterceptor,  # type: ignore[misc]
    grpc.UnaryStreamClientInterceptor,  # type: ignore[misc]
    grpc.StreamUnaryClientInterceptor,  # type: ignore[misc]
    grpc.StreamStreamClientInterceptor,  # type: ignore[misc]
):
    """Adds a fresh signature to every call of a synchronous channel."""

    def __init__(self, credentials: Credentials) -> None:
        self._credentials = credentials

    def _sign(self, details: grpc.ClientCallDetails) -> grpc.ClientCallDetails:
        return _Details(details, _with_signature(details.metadata, self._credentials))

    def intercept_unary_unary(
        self, continuation: Callable[..., Any], details: Any, request: Any
    ) -> Any:
        return continuation(self._sign(details), request)

    def intercept_unary_stream(
        self, continuation: Callable[..., Any], details: Any, request: Any
    ) -> Any:
        return continuation(self._sign(details), request)

    def intercept_stream_unary(
        self, continuation: Callable[..., Any], details: Any, requests: Any
    ) -> Any:
        return continuation(self._sign(details), requests)

    def intercept_stream_stream(
        self, continuation: Callable[..., Any], details: Any, requests: Any
    ) -> Any:
        return continuation(self._sign(details), requests)


def open_channel(
    addr: str, security: ClientSecurity = PLAINTEXT, options: ChannelOptions = ()
) -> grpc.Channel:
    """A synchronous channel to ``addr`` as ``security`` says."""
    opts = _options(security, options)
    if security.tls is None:
        channel = grpc.insecure_channel(addr, options=opts)
    else:
        channel = grpc.secure_channel(addr, channel_credentials(security.tls), options=opts)
    if security.credentials is None:
        return channel
    return grpc.intercept_channel(channel, _Signer(security.credentials))


class _AioSigner(
    grpc.aio.UnaryUnaryClientInterceptor,  # type: ignore[misc]
    grpc.aio.UnaryStreamClientInterceptor,  # type: ignore[misc]
    grpc.aio.StreamUnaryClientInterceptor,  # type: ignore[misc]
    grpc.aio.StreamStreamClientInterceptor,  # type: ignore[misc]
):
    """Adds a fresh signature to every call of an asyncio channel."""

    def __init__(self, credentials: Credentials) -> None:
        self._credentials = credentials

    def _sign(self, details: grpc.aio.ClientCallDetails) -> grpc.aio.ClientCallDetails:
        metadata = grpc.aio.Metadata(*_with_signature(details.metadata, self._credentials))
        return grpc.aio.ClientCallDetails(
            details.method, details.timeout, metadata, details.credentials, details.wait_for_ready
        )

    async def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        return await continuation(self._sign(details), request)

    async def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        return await continuation(self._sign(details), request)

    async def intercept_stream_unary(self, continuation: Any, details: Any, requests: Any) -> Any:
        return await continuation(self._sign(details), requests)

    async def intercept_stream_stream(self, continuation: Any, details: Any, requests: Any) -> Any:
        return await continuation(self._sign(details), requests)


def open_aio_channel(
    addr: str, security: ClientSecurity = PLAINTEXT, options: ChannelOptions = ()
) -> grpc.aio.Channel:
    """An asyncio channel to ``addr`` as ``security`` says."""
    opts = _options(security, options)
    interceptors = [_AioSigner(security.credentials)] if security.credentials is not None else None
    if security.tls is None:
        return grpc.aio.insecure_channel(addr, options=opts, interceptors=interceptors)
    return grpc.aio.secure_channel(
        addr, channel_credentials(security.tls), options=opts, interceptors=interceptors
    )
