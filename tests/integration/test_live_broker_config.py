"""``mqadmin updateBrokerConfig`` on a real 3-node group with its NameServer (issue #35): below
feature level 2 the change is refused; at level 2 a live key (``defaultTopicQueueNums``) changes
on every member through the log (each node's ``getBrokerConfig`` shows the value, source
``live``), the broker's behaviour follows it (a topic created without queue counts gets the new
count), the override survives a restart of the leader (the next leader, and the restarted node,
keep it), a key that needs a restart and an unknown key are refused with nothing changed, and
a clear brings back each node's broker.conf value."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from support import wait_for

from client import MQAdmin
from client.errors import MQClientError
from mqcluster.cluster import LocalCluster

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
CMD_TIMEOUT_S = 30.0
APPLY_WAIT_S = 15.0  # a follower applies a committed record within heartbeats
RESTART_WAIT_S = 30.0
# A member reports its supported level to the leader within a few heartbeats of its start.
REPORT_WAIT_S = 20.0
KEY = "defaultTopicQueueNums"
DEFAULT_QUEUES = "8"  # ServiceConfig.default_topic_queue_nums
LIVE_QUEUES = "3"


def mqadmin(cluster: LocalCluster, *args: str) -> subprocess.CompletedProcess[str]:
    assert cluster.namesrv is not None
    argv = [sys.executable, "-m", "client.mqadmin", "-n", cluster.namesrv.addr, "--json"]
    return subprocess.run(
        [*argv, *cluster.tool_argv(), *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=CMD_TIMEOUT_S,
        check=False,
    )


def ok_json(cluster: LocalCluster, *args: str) -> Any:
    done = mqadmin(cluster, *args)
    assert done.returncode == 0, (args, done.stdout, done.stderr)
    return json.loads(done.stdout)


def views(cluster: LocalCluster, addr: str = "") -> dict[str, tuple[str, str]]:
    """node address -> (KEY's value, its source) as each node's getBrokerConfig shows it."""
    rows = ok_json(cluster, "getBrokerConfig", *(["-b", addr] if addr else []))
    return {r["node"]: (r["value"], r["source"]) for r in rows if r["key"] == KEY}


def every_node_shows(cluster: LocalCluster, value: str, source: str) -> Callable[[], bool]:
    def check() -> bool:
        seen = views(cluster)
        return set(seen) == set(cluster.client_addrs) and set(seen.values()) == {(value, source)}

    return check


def raise_level(cluster: LocalCluster, addr: str) -> None:
    """setFeatureLevel, retried while a member has not reported its support to the leader
    yet (a raise waits for every member's report: FEATURE_LEVEL_UNSUPPORTED meanwhile)."""

    def raised() -> bool:
        done = mqadmin(cluster, "setFeatureLevel", "-a", addr)
        return done.returncode == 0 and json.loads(done.stdout)["feature_level"] == 2

    wait_for(raised, REPORT_WAIT_S, "the group at feature level 2")


def queues_of_new_topic(admin: MQAdmin, topic: str) -> int:
    """Create ``topic`` without queue counts (the broker's defaultTopicQueueNums decides)."""
    admin.create_topic(topic, queues=0)
    (group,) = admin.topic_route_info(topic).groups
    return int(group.write_queue_nums)


def test_update_broker_config_on_a_group(local_group: Callable[..., LocalCluster]) -> None:
    cluster = local_group(3, namesrv=True)
    assert cluster.namesrv is not None
    admin = MQAdmin(cluster.namesrv.addr, cluster.client_security())
    leader_id = cluster.wait_leader()
    leader = cluster.node(leader_id).client_addr
    follower = next(a for a in cluster.client_addrs if a != leader)

    # Level 1 (a new group): refused, nothing proposed.
    below = mqadmin(cluster, "updateBrokerConfig", "-b", leader, "-k", KEY, "-v", LIVE_QUEUES)
    assert below.returncode == 1 and "FEATURE_LEVEL_UNSUPPORTED" in below.stderr, below.stderr
    raise_level(cluster, leader)
    assert queues_of_new_topic(admin, "LiveBefore") == int(DEFAULT_QUEUES)

    # A live change, sent to a follower's address: its group's leader proposes it.
    rows = ok_json(cluster, "updateBrokerConfig", "-b", follower, "-k", KEY, "-v", LIVE_QUEUES)
    assert [(r["key"], r["value"]) for r in rows] == [(KEY, LIVE_QUEUES)], rows
    wait_for(every_node_shows(cluster, LIVE_QUEUES, "live"), APPLY_WAIT_S, "every node's view")
    assert queues_of_new_topic(admin, "LiveAfter") == int(LIVE_QUEUES)

    # A key read at start, and an unknown key: refused (exit 2) with the reason; and the
    # broker itself refuses them to any client, not only to mqadmin.
    restart = mqadmin(
        cluster, "updateBrokerConfig", "-b", leader, "-k", "fileReservedTime", "-v", "72"
    )
    assert restart.returncode == 2, restart.stderr
    assert "needs a restart: edit broker.conf on every node" in restart.stderr
    typo = mqadmin(
        cluster, "updateBrokerConfig", "-b", leader, "-k", "defaultTopicQueueNum", "-v", "4"
    )
    assert typo.returncode == 2 and "did you mean defaultTopicQueueNums" in typo.stderr, typo.stderr
    with pytest.raises(MQClientError, match=r"needs a restart: edit broker\.conf on every node"):
        admin.update_broker_config("fileReservedTime", "72", broker_addr=leader)
    with pytest.raises(MQClientError, match="did you mean defaultTopicQueueNums"):
        admin.update_broker_config("defaultTopicQueueNum", "4", broker_addr=leader)
    with pytest.raises(MQClientError, match="INVALID_REQUEST"):
        admin.update_broker_config(KEY, "0", broker_addr=leader)  # below the key's bounds
    assert set(views(cluster).values()) == {(LIVE_QUEUES, "live")}

    # A restart of the leader: the next leader applies the override too, and the restarted
    # node comes back with it (from its snapshot or its log).
    cluster.signal(leader_id, signal.SIGTERM)
    wait_for(lambda: cluster.pid(cluster.node(leader_id)) is None, RESTART_WAIT_S, "leader gone")
    cluster.wait_leader(exclude=leader_id)
    assert queues_of_new_topic(admin, "LiveNextLeader") == int(LIVE_QUEUES)
    cluster.start(leader_id)

    def restarted_has_it() -> bool:
        try:
            return views(cluster, leader) == {leader: (LIVE_QUEUES, "live")}
        except AssertionError:
            return False  # not serving yet

    wait_for(restarted_has_it, RESTART_WAIT_S, "the restarted node's view")

    # A clear: every node's broker.conf value again.
    cluster_name = admin.cluster_info().clusters[0].name
    ok_json(cluster, "updateBrokerConfig", "-c", cluster_name, "-k", KEY, "--clear")
    wait_for(every_node_shows(cluster, DEFAULT_QUEUES, "broker.conf"), APPLY_WAIT_S, "cleared")
    assert queues_of_new_topic(admin, "LiveCleared") == int(DEFAULT_QUEUES)
