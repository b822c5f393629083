"""The one mapping from the error contract's stable codes (``broker.errors``, dledger's, and the
front end's own) to ``apache.rocketmq.v2.Code`` names. RocketMQ 5 clients read errors from the
body's ``Status``, never from the gRPC status, so every failure of the v2 front end passes here.
"""

from __future__ import annotations

from collections.abc import Mapping

V2_CODE_BY_ERROR: Mapping[str, str] = {
    "TOPIC_NOT_FOUND": "TOPIC_NOT_FOUND",
    "INVALID_TOPIC": "ILLEGAL_TOPIC",
    "MESSAGE_BODY_EMPTY": "MESSAGE_BODY_EMPTY",
    "MESSAGE_TOO_LARGE": "MESSAGE_BODY_TOO_LARGE",
    "PROPERTIES_TOO_LARGE": "MESSAGE_PROPERTIES_TOO_LARGE",
    "INVALID_MESSAGE_ID": "ILLEGAL_MESSAGE_ID",
    "INVALID_MESSAGE": "BAD_REQUEST",
    "INVALID_REQUEST": "BAD_REQUEST",
    "BAD_REQUEST": "BAD_REQUEST",
    "QUEUE_ID_OUT_OF_RANGE": "BAD_REQUEST",
    "NO_PERMISSION": "FORBIDDEN",
    "SYSTEM_TOPIC": "FORBIDDEN",
    "UNRECOGNIZED_CLIENT": "UNRECOGNIZED_CLIENT_TYPE",
    "CLIENT_ID_TAKEN": "FORBIDDEN",  # another user's live client id (broker.rmq5.clients)
    # The leader's guard refusing a forwarded call (broker.auth.guard; the v2 port's own guard
    # answers the same codes, broker.rmq5.guard).
    "UNAUTHENTICATED": "UNAUTHORIZED",
    "PERMISSION_DENIED": "FORBIDDEN",
    # Full tables, a busy or full leader: the client backs off and retries.
    "RESOURCE_EXHAUSTED": "TOO_MANY_REQUESTS",
    "TOO_MANY_CLIENTS": "TOO_MANY_REQUESTS",
    "BACK_PRESSURE": "TOO_MANY_REQUESTS",
    "DISK_FULL": "TOO_MANY_REQUESTS",
    # No leader within the forward budget, or the outcome of a proposal unknown.
    "NOT_LEADER": "HA_NOT_AVAILABLE",
    "NO_LEADER": "HA_NOT_AVAILABLE",
    "TRANSFER_IN_PROGRESS": "HA_NOT_AVAILABLE",
    "UNAVAILABLE": "HA_NOT_AVAILABLE",
    "NO_QUORUM": "MASTER_PERSISTENCE_TIMEOUT",
    "LEADERSHIP_LOST": "MASTER_PERSISTENCE_TIMEOUT",
    "PROPOSAL_LOST": "MASTER_PERSISTENCE_TIMEOUT",
    "ENTRY_TOO_LARGE": "PAYLOAD_TOO_LARGE",
    # POP consumption (broker.pop, broker.popstate).
    "INVALID_RECEIPT_HANDLE": "INVALID_RECEIPT_HANDLE",
    "ILLEGAL_INVISIBLE_TIME": "ILLEGAL_INVISIBLE_TIME",
    "INVALID_GROUP": "ILLEGAL_CONSUMER_GROUP",
    "TOO_MANY_LONG_POLLS": "TOO_MANY_REQUESTS",
    "TOO_MANY_SUBGROUPS": "TOO_MANY_REQUESTS",
    "TOO_MANY_TOPICS": "TOO_MANY_REQUESTS",
    "TOO_MANY_OFFSET_GROUPS": "TOO_MANY_REQUESTS",
    "MESSAGE_NOT_FOUND": "MESSAGE_NOT_FOUND",
    # Transactions (broker.transactions).
    "INVALID_TRANSACTION_ID": "INVALID_TRANSACTION_ID",
    "TOO_MANY_HALF_MESSAGES": "TOO_MANY_REQUESTS",
    "LEADER_CATCHING_UP": "TOO_MANY_REQUESTS",
    # Timed messages (broker.timer): a delivery time beyond timerMaxDelaySec.
    "INVALID_DELIVERY_TIME": "ILLEGAL_DELIVERY_TIME",
}


def v2_code_name(error_code: str) -> str:
    """The ``apache.rocketmq.v2.Code`` name of a stable error code (anything unknown is an
    internal error)."""
    return V2_CODE_BY_ERROR.get(error_code, "INTERNAL_ERROR")
