"""The official RocketMQ 5 Python SimpleConsumer on a 3-node group with a NameServer, connected
to a follower only: ``mqadmin consumerConnection`` and ``consumerStatus`` list it with its
language, release and protocol v2 (every node of the group is asked: the leader never heard
of it), while the client ids v1 consumers rebalance by stay without it; its termination takes
it off the listing. The dashboard's Clients page lists it likewise (issue #35; docs/RMQ5.md,
"What is served")."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest
from rmq5_support import GROUP_CONF, PYTHON, SCRIPTS, ClientProcess, client_env
from support import create_topic_on, wait_for

from client.admin import MQAdmin
from mqcluster.cluster import LocalCluster
from mqdashboard.reader import GroupReader

pytestmark = [pytest.mark.integration]

QUEUES = 2
SENDS = 3
# The official client's start-up (route, Settings) on a loaded 2-core machine, and its end.
CLIENT_TIMEOUT_S = 60
# The listing after the client started: its Settings went out with its start-up.
LISTED_WAIT_S = 20
MQADMIN_TIMEOUT_S = 60


def _mqadmin(cluster: LocalCluster, *args: str) -> Any:
    assert cluster.namesrv is not None
    argv = [sys.executable, "-m", "client.mqadmin", "-n", cluster.namesrv.addr, "--json", *args]
    done = subprocess.run(
        argv, capture_output=True, text=True, timeout=MQADMIN_TIMEOUT_S, check=False
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def _v2_rows(admin: MQAdmin, group: str) -> list[Any]:
    return [
        c for clients in admin.consumer_connections(group).values() for c in clients
        if c.protocol == "v2"
    ]  # fmt: skip


def test_consumer_connection_lists_a_simple_consumer_with_its_language_and_version(
    local_group: Any, tmp_path: Any
) -> None:
    topic, group = "ListedTopic", "ListedGroup"
    cluster: LocalCluster = local_group(3, namesrv=True, **GROUP_CONF)
    assert cluster.namesrv is not None
    create_topic_on([cluster], [cluster.namesrv.addr], topic, QUEUES)
    leader = cluster.wait_leader()
    follower = next(n for n in cluster.nodes if n.node_id != leader)
    args = [follower.grpc_addr, topic, group, "listed", str(SENDS), "30", "simple"]
    argv = [str(PYTHON), str(SCRIPTS / "py_steady_client.py"), *args]
    admin = MQAdmin(cluster.namesrv.addr)
    with ClientProcess(argv, tmp_path, client_env(tmp_path), stdin=True) as client:
        client.wait_lines(lambda ls: any(x.get("event") == "started" for x in ls), CLIENT_TIMEOUT_S)
        wait_for(lambda: _v2_rows(admin, group), LISTED_WAIT_S, f"{group}'s v2 consumer listed")
        rows = _mqadmin(cluster, "consumerConnection", "-g", group)
        [row] = [r for r in rows if r["protocol"] == "v2"]
        assert row["language"] == "PYTHON", row
        assert row["version"] not in ("", "UNKNOWN"), row
        assert row["address"].startswith("127.0.0.1:"), row
        assert f"{topic}:*" in row["subscriptions"], row
        # Not a rebalancing id on the node it talks to: a v1 consumer of the group would
        # otherwise hand it queues it never pulls.
        assert admin.consumer_clients(group, broker_addr=follower.client_addr) == {
            follower.client_addr: []
        }
        on_follower = admin.consumer_connections(group, broker_addr=follower.client_addr)
        assert [c.client_id for c in on_follower[follower.client_addr]] == [row["client_id"]]
        status = _mqadmin(cluster, "consumerStatus", "-g", group)
        assert [(c["client_id"], c["protocol"]) for c in status["clients"]] == [
            (row["client_id"], "v2")
        ]
        # The dashboard's Clients page: the group (only a RocketMQ 5 consumer, on a follower)
        # is found and its client listed with its protocol.
        reader = GroupReader(cluster.namesrv.addr)
        try:
            shown = [(c.group, c.client_id, c.protocol, c.language) for _, c in reader.clients()]
        finally:
            reader.close()
        assert shown == [(group, row["client_id"], "v2", "PYTHON")], shown
        client.finish(CLIENT_TIMEOUT_S)
    # The client's NotifyClientTermination dropped it.
    wait_for(lambda: not _v2_rows(admin, group), LISTED_WAIT_S, f"{group}'s consumer unlisted")
