"""RocketMQ 5's protocol (``apache.rocketmq.v2.MessagingService``) on a broker node.

A second front end beside :mod:`broker.frontends.v1.service`: the official RocketMQ 5 clients talk
to a node unchanged (docs/RMQ5.md). It is an adapter over the same components
(:mod:`broker.components.sending`, :mod:`broker.components.topics`); what must run on the leader is
forwarded to it inside the group. The protocol's stubs are generated at set-up time from a pinned
package (:mod:`broker.frontends.v2.stubs`).
"""
