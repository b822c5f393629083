"""The broker's RocketMQ 4.x front end: the remoting protocol on a node's ``remotingListenPort``
(docs/REMOTING.md, "Broker"), one more thin adapter over the broker components."""
