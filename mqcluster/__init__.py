"""Developer tools around the broker, outside the product package: ``mqcluster`` starts a local
group of brokers (and NameServers) on 127.0.0.1 (:mod:`mqcluster.cluster`), ``make demo`` runs
the walk-through (:mod:`mqcluster.demo`), :mod:`mqcluster.localsecurity` makes the throwaway CA,
certificates and users a local secure group needs, and :mod:`mqcluster.leader_client` follows
the leader for the demo and the benchmarks. Nothing in ``broker`` imports this package.
"""
