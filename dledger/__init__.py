"""DLedger: a Raft-replicated log of opaque entries.

``dledger.core`` is the pure Raft state machine, ``dledger.storage`` the on-disk log of one
member, ``dledger.sim`` a deterministic simulator of a group, ``dledger.server`` the asyncio/gRPC
runtime. Nothing in this package knows about topics or messages.
"""
