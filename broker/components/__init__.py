"""The broker's leader-side components, and the reads every node answers, over the replicated
state (:mod:`broker.state`).

One job each, driven through plain Python calls by the front ends (:mod:`broker.frontends`) and
built once by the composition root (:mod:`broker.app`): sends (:mod:`.sending`), pulls and long
polls (:mod:`.pulling`), POP (:mod:`.pop`), consumer offsets (:mod:`.offsets`), topics
(:mod:`.topics`), retries and dead letters (:mod:`.retry`), delayed delivery
(:mod:`.delaydelivery`) and the timer moves (:mod:`.timermoves`) while leading, transactions
(:mod:`.transactions`), queue locks (:mod:`.locks`), lookups by key or id (:mod:`.lookups`),
consumers and subscription groups (:mod:`.consumers`, :mod:`.subscriptions`), users and ACL
rules (:mod:`.authadmin`), the scrubber, disk and stats. A write is proposed to the Raft log
through the node contract (:mod:`.raftnode`) and answered once applied. Nothing here imports
gRPC or protobuf.
"""
