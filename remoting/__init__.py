"""RocketMQ's remoting protocol (the 4.x clients' TCP protocol): frames, codes, an asyncio server
and a client (docs/REMOTING.md).

This package imports nothing of raftmq's: the NameServer's and the broker's remoting front ends
stand on it, and so do the tests and mqbench. The front ends map requests to their components;
this package only moves :class:`~remoting.protocol.RemotingCommand` values over connections,
bounded and refusing malformed input with :class:`~remoting.protocol.FrameError`.
"""
