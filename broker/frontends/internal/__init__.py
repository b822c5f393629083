"""``raftmq.broker.internal.v1.LeaderOps``: leader operations between the members of a group.

:mod:`.forwarder` is the one way a front end gets a leader operation
(:mod:`broker.components.leaderops`) done when this node does not lead; :mod:`.service` is the
leader's side, on its client port; :mod:`.codec` is the one conversion of requests and answers to
the wire and back, bounding every field (docs/ARCHITECTURE.md, "Leader operations and the
forwarder").
"""
