"""raftmq's one error table: every stable error code once, with the gRPC status its failure
carries, its ``apache.rocketmq.v2.Code``, whether and where a retry may succeed, whether a
failed write's outcome is known, and one line for people.

The table is the data file ``errors.json`` (this package's, shipped in the distribution, read
by any tool in any language). :mod:`mqerrors.codes` holds one constant per code, generated from
it (``python -m mqerrors.generate``; ``--check`` in CI), so that code references are names
mypy checks, not strings: ``from mqerrors import codes as E`` then ``E.NOT_LEADER``.
:mod:`mqerrors.table` reads the data file (the broker's v2 front end, the clients' retry
decisions, mqjepsen and the docs derive from it).

This package imports nothing of raftmq's and no third-party library, so that the Raft core,
the broker, the NameServer and the clients may all import it. ``import mqerrors.codes`` reads no
file.
"""
