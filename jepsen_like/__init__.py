"""``mqjepsen``: attack a real local raftmq group (partitions, crashes, pauses, disk faults)
while clients write and read, then check the history and the replicas. See docs/JEPSEN.md."""
