"""``mqdashboard``: a web dashboard of a raftmq cluster, reached through its NameServers alone
(docs/DASHBOARD.md).

- ``reader``: what the pages show, read through the gRPC admin calls (the NameServer's cluster
  info and routes, each node's ``Metadata``, the broker's offsets, lag and lookups);
- ``rates``: bounded histories of counters and gauges, and rates from successive samples;
- ``sampler``: a thread that samples the cluster every interval into those histories;
- ``web``: the Starlette application (pages, the charts' JSON, the confirmed actions);
- ``__main__``: the command line, served by uvicorn.

A tool: it imports the client library, the generated stubs and ``mqsecurity``, never the
servers' packages.
"""
