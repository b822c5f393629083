"""The asyncio + grpc.aio runtime of one DLedger member (see ``dledger.server.node``)."""

from dledger.server.node import (
    DLedgerNode,
    LogOnlyStateMachine,
    NodeConfig,
    StartError,
    StateMachine,
)

__all__ = [
    "DLedgerNode",
    "LogOnlyStateMachine",
    "NodeConfig",
    "ProposalLostError",
    "ServiceRegistrar",
    "StartError",
    "StateMachine",
]
