"""The NameServer's RocketMQ remoting front end (docs/REMOTING.md): what a 4.x client asks its
``namesrvAddr``, answered from the same route table as the gRPC service.

Routes name each group's current Raft leader as its master (brokerId 0, RocketMQ's DLedger
mode), at the leader's remoting address: a client follows a failover at its next route
refresh. A group none of whose registered nodes serves remoting (remotingListenPort unset, or
a release before it) is not listed; a group without a leader at the moment is listed with no
address, so consumers keep its queues through an election.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

from nameserver.metrics import ROUTE_FOUND, ROUTE_INVALID, ROUTE_NOT_FOUND, NameServerStats
from nameserver.routes import (
    GroupRoute,
    InvalidRequestError,
    Registration,
    RouteTable,
    TopicNotExistError,
    check_name,
    show,
)
from remoting.codes import RequestCode, ResponseCode
from remoting.connection import RemotingConnection
from remoting.protocol import RemotingCommand
from remoting.server import not_supported

# RocketMQ's brokerId of a group's master (MixAll.MASTER_ID): the Raft leader here.
MASTER_ID = "0"
# RocketMQ's topicSysFlag of an ordinary topic (no unit flags).
TOPIC_SYS_FLAG = 0

_Handler = Callable[[RemotingCommand], RemotingCommand]


def _json(value: object) -> bytes:
    return json.dumps(value, separators=(",", ":"), sort_keys=True).encode("utf-8")


def _remoting_members(route: GroupRoute) -> list[Registration]:
    return [r for r in (route.leader, *route.followers) if r is not None and r.remoting_addr]


def _broker_data(cluster: str, broker_name: str, leader: Registration | None) -> dict[str, Any]:
    """A group as RocketMQ's BrokerData: its master at the leader's remoting address."""
    addrs = {MASTER_ID: leader.remoting_addr} if leader and leader.remoting_addr else {}
    return {"cluster": cluster, "brokerName": broker_name, "brokerAddrs": addrs}


def topic_route_data(routes: list[GroupRoute]) -> dict[str, Any] | None:
    """RocketMQ's TopicRouteData of the groups serving a topic over remoting, None when none
    does."""
    served = [r for r in routes if _remoting_members(r)]
    if not served:
        return None
    return {
        "queueDatas": [
            {
                "brokerName": r.broker_name,
                "readQueueNums": r.topic.read_queue_nums,
                "writeQueueNums": r.topic.write_queue_nums,
                "perm": r.topic.perm,
                "topicSysFlag": TOPIC_SYS_FLAG,
            }
            for r in served
        ],
        "brokerDatas": [_broker_data(r.cluster, r.broker_name, r.leader) for r in served],
        "filterServerTable": {},
    }


class NameServerRemoting:
    """The handler of the NameServer's remoting port (a :class:`remoting.RemotingServer`'s)."""

    def __init__(self, table: RouteTable, stats: NameServerStats) -> None:
        self.table = table
        self.stats = stats
        self._served: dict[int, _Handler] = {
            RequestCode.GET_ROUTEINFO_BY_TOPIC: self._route,
            RequestCode.GET_BROKER_CLUSTER_INFO: self._cluster_info,
            RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER: self._all_topics,
            RequestCode.GET_KV_CONFIG: self._kv_config,
        }

    def __call__(
        self, request: RemotingCommand, conn: RemotingConnection
    ) -> Awaitable[RemotingCommand | None]:
        return self._answer(request)

    async def _answer(self, request: RemotingCommand) -> RemotingCommand:
        handler = self._served.get(request.code)
        if handler is not None:
            return handler(request)
        if request.code in (RequestCode.REGISTER_BROKER, RequestCode.UNREGISTER_BROKER):
            return request.response(
                ResponseCode.REQUEST_CODE_NOT_SUPPORTED,
                f"request code {request.code}: raftmq brokers register over gRPC "
                "(raftmq.nameserver.v1), not over remoting",
            )
        return not_supported(request)

    def _route(self, request: RemotingCommand) -> RemotingCommand:
        topic = request.ext_fields.get("topic")
        if topic is None:
            self.stats.route_queries[ROUTE_INVALID] += 1
            return request.response(ResponseCode.SYSTEM_ERROR, "the request has no field 'topic'")
        try:
            check_name("topic", topic)
            data = topic_route_data(self.table.route(topic))
        except InvalidRequestError as exc:
            # No group can serve a name outside the rule: RocketMQ's answer for "no route".
            self.stats.route_queries[ROUTE_INVALID] += 1
            return request.response(ResponseCode.TOPIC_NOT_EXIST, str(exc))
        except TopicNotExistError:
            data = None
        if data is None:
            self.stats.route_queries[ROUTE_NOT_FOUND] += 1
            return request.response(
                ResponseCode.TOPIC_NOT_EXIST,
                f"No topic route info in name server for the topic: {show(topic)} (no broker "
                "group serves it over remoting)",
            )
        self.stats.route_queries[ROUTE_FOUND] += 1
        return request.response(ResponseCode.SUCCESS, body=_json(data))

    def _cluster_info(self, request: RemotingCommand) -> RemotingCommand:
        """RocketMQ's ClusterInfo: every group with a remoting member, by name and cluster."""
        brokers: dict[str, dict[str, Any]] = {}
        clusters: dict[str, list[str]] = {}
        for group in self.table.cluster_info():
            regs = [reg for reg, _ in group.members]
            if not any(r.remoting_addr for r in regs):
                continue
            leader = next((r for r in regs if r.node_id == group.leader_id), None)
            brokers[group.broker_name] = _broker_data(group.cluster, group.broker_name, leader)
            clusters.setdefault(group.cluster, []).append(group.broker_name)
        body = {"brokerAddrTable": brokers, "clusterAddrTable": clusters}
        return request.response(ResponseCode.SUCCESS, body=_json(body))

    def _all_topics(self, request: RemotingCommand) -> RemotingCommand:
        return request.response(
            ResponseCode.SUCCESS, body=_json({"topicList": self.table.all_topics()})
        )

    def _kv_config(self, request: RemotingCommand) -> RemotingCommand:
        """raftmq keeps no KV configuration (RocketMQ's ORDER_TOPIC_CONFIG and the like): every
        item is missing, RocketMQ's answer for a missing one."""
        namespace = request.ext_fields.get("namespace", "")
        key = request.ext_fields.get("key", "")
        return request.response(
            ResponseCode.QUERY_NOT_FOUND,
            f"No config item, Namespace: {show(namespace)} Key: {show(key)}",
        )
