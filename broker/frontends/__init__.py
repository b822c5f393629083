"""The broker's protocol front ends: thin gRPC adapters over the components
(:mod:`broker.components`).

``v1`` serves ``raftmq.broker.v1.Broker`` (the project's own protocol), ``v2`` serves RocketMQ 5's
``apache.rocketmq.v2.MessagingService``. What both share sits here: the call guard that decides
who is calling and whether they may (:mod:`broker.frontends.authguard`), and the table of what
each RPC of every port touches (:mod:`broker.frontends.rpcmap`). gRPC and protobuf belong to this
layer; the components below import neither.
"""
