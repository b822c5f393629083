"""The client's one exception type, carrying the broker's or NameServer's stable code."""

from __future__ import annotations

import grpc


class MQClientError(Exception):
    """A failed client call: ``code`` is the stable code (``NOT_LEADER``, ``TOPIC_NOT_FOUND``,
    ``NO_ROUTE``, ...), ``status`` the gRPC status name, ``message`` the full detail."""

    def __init__(self, code: str, status: str, message: str) -> None:
        super().__init__(f"{code} ({status}): {message}")
        self.code = code
        self.status = status
        self.message = message

    @classmethod
    def from_rpc(cls, exc: grpc.RpcError) -> MQClientError:
        status = exc.code() if isinstance(exc, grpc.Call) else None
        details = (exc.details() if isinstance(exc, grpc.Call) else str(exc)) or ""
        code = details.split(" ", 1)[0] if details and details.split(" ", 1)[0].isupper() else ""
        status_name = status.name if status is not None else "UNKNOWN"
        return cls(code or status_name, status_name, details)
