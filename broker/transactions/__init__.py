"""Transactional messages: half messages, verdicts and the check-back (docs/RMQ5.md,
"Transactional messages"). :mod:`broker.transactions.state` is the replicated table every member
builds from ``ENTRY_TXN`` records; :mod:`broker.transactions.manager` is the leader's side."""
