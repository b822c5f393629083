"""A small admin helper: create a topic on every broker group of a cluster, as the NameServer
lists them, and wait until the NameServer routes it (``mqadmin updateTopic`` in short)."""

from __future__ import annotations

import logging
import time

import grpc
from raftmq.broker.v1 import broker_pb2 as pb
from raftmq.nameserver.v1 import nameserver_pb2 as ns_pb
from raftmq.nameserver.v1 import nameserver_pb2_grpc as ns_grpc

from client.errors import MQClientError
from client.route import NAMESRV_RPC_TIMEOUT_S, ChannelPool, RouteClient, parse_namesrv_addr

log = logging.getLogger(__name__)

# How long create_topic waits for the groups' leaders and for the route to appear.
CREATE_TOPIC_TIMEOUT_S = 15.0
POLL_S = 0.1


class MQAdmin:
    def __init__(self, namesrv_addr: str) -> None:
        self.namesrv_addr = namesrv_addr
        self._namesrvs = parse_namesrv_addr(namesrv_addr)

    def create_topic(
        self,
        topic: str,
        queues: int = 8,
        cluster: str = "",
        timeout_s: float = CREATE_TOPIC_TIMEOUT_S,
    ) -> list[str]:
        """Create (or update) ``topic`` with ``queues`` read and write queues on every group of
        ``cluster`` (every cluster when empty); returns the broker group names once every
        group routes it. Raises ``MQClientError`` on a broker's refusal or at the timeout."""
        deadline = time.monotonic() + timeout_s
        channels = ChannelPool()
        try:
            done: set[str] = set()
            wanted: set[str] = set()
            while time.monotonic() < deadline:
                groups = self._leaders(channels, cluster)
                wanted = set(groups)
                for name, leader_addr in groups.items():
                    if name in done or not leader_addr:
                        continue
                    try:
                        channels.broker(leader_addr).CreateTopic(
                            pb.CreateTopicRequest(
                                topic=pb.TopicConfig(
                                    topic_name=topic,
                                    read_queue_nums=queues,
                                    write_queue_nums=queues,
                                )
                            ),
                            timeout=max(deadline - time.monotonic(), POLL_S),
                        )
                        done.add(name)
                    except grpc.RpcError as exc:
                        err = MQClientError.from_rpc(exc)
                        if err.status not in ("UNAVAILABLE", "FAILED_PRECONDITION"):
                            raise err from exc
                        log.info("create %s on %s: %s; retrying", topic, name, err)
                if wanted and done >= wanted and self._routed(channels, topic, wanted):
                    return sorted(wanted)
                time.sleep(POLL_S)
            raise MQClientError(
                "TIMEOUT",
                "DEADLINE_EXCEEDED",
                f"topic {topic}: created on {sorted(done)} of "
                f"{sorted(wanted)} within {timeout_s} s",
            )
        finally:
            channels.close()

    def _leaders(self, channels: ChannelPool, cluster: str) -> dict[str, str]:
        for addr in self._namesrvs:
            try:
                info = ns_grpc.NameServerStub(channels.get(addr)).GetClusterInfo(
                    ns_pb.GetClusterInfoRequest(), timeout=NAMESRV_RPC_TIMEOUT_S
                )
            except grpc.RpcError as exc:
                log.warning("namesrv=%s: %s", addr, MQClientError.from_rpc(exc))
                continue
            out: dict[str, str] = {}
            for c in info.clusters:
                if cluster and c.name != cluster:
                    continue
                for g in c.groups:
                    leader = next((m for m in g.members if m.node_id == g.leader_id), None)
                    out[g.broker_name] = leader.client_addr if leader else ""
            return out
        return {}

    def _routed(self, channels: ChannelPool, topic: str, groups: set[str]) -> bool:
        try:
            route = RouteClient(self.namesrv_addr, channels).get_route(topic, force=True)
        except MQClientError:
            return False
        return {g.broker_name for g in route.groups if g.leader_addr} >= groups
