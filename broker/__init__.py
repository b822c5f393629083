"""raftmq broker: one member of a broker group, on top of a DLedger (Raft) node.

``mqbroker -c broker.conf`` runs one member in the foreground. ``broker`` depends on
``dledger``; never the other way round.
"""
