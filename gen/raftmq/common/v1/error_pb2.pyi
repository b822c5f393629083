from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Optional as _Optional

DESCRIPTOR: _descriptor.FileDescriptor

class ErrorInfo(_message.Message):
    __slots__ = ("code", "leader_id", "leader_addr", "retryable", "retry_after_ms", "outcome_unknown")
    CODE_FIELD_NUMBER: _ClassVar[int]
    LEADER_ID_FIELD_NUMBER: _ClassVar[int]
    LEADER_ADDR_FIELD_NUMBER: _ClassVar[int]
    RETRYABLE_FIELD_NUMBER: _ClassVar[int]
    RETRY_AFTER_MS_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_UNKNOWN_FIELD_NUMBER: _ClassVar[int]
    code: str
    leader_id: str
    leader_addr: str
    retryable: bool
    retry_after_ms: int
    outcome_unknown: bool
    def __init__(self, code: _Optional[str] = ..., leader_id: _Optional[str] = ..., leader_addr: _Optional[str] = ..., retryable: _Optional[bool] = ..., retry_after_ms: _Optional[int] = ..., outcome_unknown: _Optional[bool] = ...) -> None: ...
