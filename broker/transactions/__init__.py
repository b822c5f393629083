"""Transactional messages: the leader's side (:mod:`broker.transactions.manager`) over the
replicated table every member builds from ``ENTRY_TXN`` records (:mod:`broker.state.transactions`).
"""
