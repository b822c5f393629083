"""``raftmq.broker.v1.Broker`` on a node's client port: the servicer (:mod:`.service`), the
conversion of stored messages to protobuf (:mod:`.pbmessage`) and the mapping of the broker's
error codes to gRPC statuses (:mod:`.rpcerrors`).
"""
