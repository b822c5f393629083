"""raftmq broker: one member of a broker group, on top of a DLedger (Raft) node.

``mqbroker -c broker.conf`` runs one member in the foreground. ``broker`` depends on
``dledger``; never the other way round.
"""

import os

# A server process reads gRPC core's log verbosity once, when grpc is first imported (this
# package's __init__ runs before any of its modules import grpc). At the default, gRPC logs one
# line per failed TLS handshake, so anyone able to open connections could fill the disk with
# log lines; errors only. An operator's own GRPC_VERBOSITY wins. With TLS the server counts
# those lines (mqsecurity.handshakes: it raises gRPC to INFO and still shows only these levels).
os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
