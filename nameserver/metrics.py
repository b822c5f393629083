"""A NameServer's metrics (docs/METRICS.md "NameServer"): its route table, the route queries it
answered and its security refusals, read at scrape time on its event loop.

Label sets are fixed vocabularies (``result``, ``reason``); the table's own size is bounded by
`nameserver.routes.MAX_NODES` and `MAX_TOPIC_ENTRIES`, and no broker, group or topic name is
ever a label here.
"""

from __future__ import annotations

from prometheus_client.core import Metric

from mqmetrics.families import gauge, labelled_counter, refusal_family
from mqsecurity.refusals import REFUSALS
from nameserver.routes import RouteTable
from remoting.server import RemotingServer

# How a route query ended: routes found, no group serves the topic, a malformed topic name.
ROUTE_FOUND = "found"
ROUTE_NOT_FOUND = "not_found"
ROUTE_INVALID = "invalid"
ROUTE_RESULTS = (ROUTE_FOUND, ROUTE_NOT_FOUND, ROUTE_INVALID)
# How a (un)registration ended: stored or removed, or refused (invalid, table full, unsigned).
REGISTRATION_RESULTS = ("ok", "refused")


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


def nameserver_families(
    table: RouteTable, stats: NameServerStats, remoting: RemotingServer | None = None
) -> list[Metric]:
    """``remoting``: the remoting port's server, None when not served (no such families)."""
    groups = table.cluster_info()
    return [
        *(remoting_families(remoting) if remoting is not None else []),
        gauge("nameserver_brokers_registered", "Broker nodes registered", len(table)),
        gauge("nameserver_broker_groups", "Broker groups with a registered node", len(groups)),
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
