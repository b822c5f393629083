"""The asyncio + grpc.aio runtime of one DLedger member (see ``dledger.server.node``)."""

from dledger.server.errors import ProposalLostError, StartError
from dledger.server.node import (
    DLedgerNode,
    LogOnlyStateMachine,
    NodeConfig,
    ServiceRegistrar,
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
