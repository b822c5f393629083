"""A NameServer's metrics (docs/METRICS.md "NameServer"): its route table, the route queries it
answered and its security refusals, read at scrape time on its event loop.

Label sets are fixed vocabularies (``result``, ``reason``), except the per-cluster and per-group
figures (``cluster``, ``broker``: the registered groups' own names), which the table bounds
(`nameserver.routes.MAX_NODES`: a group exists while one of its nodes is registered) and the
exporter caps at :data:`MAX_GROUP_SERIES` series a family (the rest counted in
``raftmq_metrics_series_omitted``). No topic or node name is ever a label here.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from prometheus_client.core import Metric

from mqmetrics.families import Omitted, gauge, labelled_counter, labelled_gauge, refusal_family
from mqsecurity.refusals import REFUSALS
from nameserver.routes import GroupInfo, RouteTable
from remoting.server import RemotingServer

# How a route query ended: routes found, no group serves the topic, a malformed topic name.
ROUTE_FOUND = "found"
ROUTE_NOT_FOUND = "not_found"
ROUTE_INVALID = "invalid"
ROUTE_RESULTS = (ROUTE_FOUND, ROUTE_NOT_FOUND, ROUTE_INVALID)
# How a (un)registration ended: stored or removed, or refused (invalid, table full, unsigned).
REGISTRATION_RESULTS = ("ok", "refused")
# Series of each per-cluster and per-group family a scrape exports: far more groups than one
# NameServer serves in practice (each is 3 brokers), few enough that a scrape stays small when
# a misconfiguration registers thousands (MAX_NODES allows 10,000 nodes).
MAX_GROUP_SERIES = 1000
CLUSTER_GROUPS = "nameserver_cluster_groups"
GROUP_BROKERS = "nameserver_group_brokers"


class NameServerStats:
    """Counts the servicer keeps on its event loop."""

    __slots__ = ("registrations", "route_queries")

    def __init__(self) -> None:
        self.route_queries = dict.fromkeys(ROUTE_RESULTS, 0)
        self.registrations = dict.fromkeys(REGISTRATION_RESULTS, 0)


def remoting_families(server: RemotingServer) -> list[Metric]:
    """The remoting port's connections and what it refused (docs/REMOTING.md "Limits")."""
    return [
        gauge(
            "nameserver_remoting_connections",
            "Open connections of the RocketMQ remoting port",
            len(server.connections),
        ),
        labelled_counter(
            "nameserver_remoting_refusals",
            "Remoting frames, requests and connections refused or closed, by reason",
            ["reason"],
            (([r], n) for r, n in server.refusals().items()),
        ),
    ]


def _group_families(groups: Sequence[GroupInfo]) -> list[Metric]:
    """Groups registered per cluster and nodes registered per group (docs/METRICS.md
    "NameServer"): what an alert needs to see a group missing from this NameServer."""
    omitted = Omitted()
    per_cluster = Counter(g.cluster for g in groups)
    clusters = sorted(per_cluster.items())
    return [
        labelled_gauge(
            CLUSTER_GROUPS,
            "Broker groups with a registered node, per cluster",
            ["cluster"],
            (
                ([c], n)
                for c, n in omitted.capped(
                    CLUSTER_GROUPS, iter(clusters), len(clusters), MAX_GROUP_SERIES
                )
            ),
        ),
        labelled_gauge(
            GROUP_BROKERS,
            "Nodes of each broker group registered (expired nodes are gone)",
            ["cluster", "broker"],
            (
                ([g.cluster, g.broker_name], len(g.members))
                for g in omitted.capped(GROUP_BROKERS, iter(groups), len(groups), MAX_GROUP_SERIES)
            ),
        ),
        omitted.family([CLUSTER_GROUPS, GROUP_BROKERS]),
    ]


def nameserver_families(
    table: RouteTable, stats: NameServerStats, remoting: RemotingServer | None = None
) -> list[Metric]:
    """``remoting``: the remoting port's server, None when not served (no such families)."""
    groups = table.cluster_info()
    return [
        *(remoting_families(remoting) if remoting is not None else []),
        gauge("nameserver_brokers_registered", "Broker nodes registered", len(table)),
        gauge("nameserver_broker_groups", "Broker groups with a registered node", len(groups)),
        *_group_families(groups),
        gauge(
            "nameserver_topic_entries",
            "Topic entries over every registration (bounded by the table's limit)",
            table.topic_entries,
        ),
        labelled_counter(
            "nameserver_route_queries",
            "GetRouteInfoByTopic calls and remoting GET_ROUTEINFO_BY_TOPIC requests, by result",
            ["result"],
            (([r], n) for r, n in stats.route_queries.items()),
        ),
        labelled_counter(
            "nameserver_registrations",
            "RegisterBroker calls, by result",
            ["result"],
            (([r], n) for r, n in stats.registrations.items()),
        ),
        refusal_family(REFUSALS.snapshot()),
    ]
