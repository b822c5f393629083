"""The broker's replicated state: what every member builds, in log order, from committed entries.

The record vocabulary and its codecs (:mod:`.records`), the state machine whose apply turns each
committed entry into state (:mod:`.machine`), the stores and tables it keeps (consume queues,
the index file, POP and transaction state, subscription groups, users and ACL rules under
:mod:`.auth`), the rules timed and delayed messages follow (:mod:`.timerrules`,
:mod:`.delayrules`), snapshots (:mod:`.snapshotting`), the derived files rebuilt from the log
(:mod:`.derived`) and the start-up checks of all of it (:mod:`.statecheck`); with the names,
messages and errors they are written in. Nothing here proposes, serves or knows of gRPC: the
leader-side components (:mod:`broker.components`) propose, the front ends serve.
"""
