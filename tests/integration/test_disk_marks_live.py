"""The disk refusal mark changes live on a real 3-node group (issue #35): at feature level 2,
``UpdateBrokerConfig diskSpaceWarningLevelRatio`` set just under the store's file system's
usage makes the leader refuse sends with ``DISK_FULL ... max=<mark>%`` without a restart;
every member shows the value (source ``live``) and took it when it applied the record, so a
follower made leader refuses too; a clear brings back broker.conf's mark (99 %, the resume
mark it left out following it down and up: 94 % again) and sends are accepted again. The marks
are placed around the real usage of the disk the test's stores are on (no file system is
filled), so the test skips on a disk used under 12 % or over 90 %.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import grpc
import pytest
from raftmq.broker.v1 import broker_pb2 as pb
from raftmq.broker.v1 import broker_pb2_grpc as pb_grpc
from raftmq.dledger.v1 import dledger_pb2 as dpb
from raftmq.dledger.v1 import dledger_pb2_grpc as dpb_grpc
from support import numbered_messages, wait_for

from broker.state.message import UniqIdGenerator
from dledger.storage.retention import used_percent
from mqcluster.cluster import LocalCluster

pytestmark = pytest.mark.integration

KEY = "diskSpaceWarningLevelRatio"
TOPIC = "LiveMark"
QUEUES = 2
CALL_TIMEOUT_S = 10.0
# A committed record reaches every member and its guard within heartbeats; a busy 2-core host
# may take seconds.
APPLY_WAIT_S = 20.0
LEVEL_WAIT_S = 20.0  # members report their supported level within heartbeats of their start
LEADER_WAIT_S = 20.0
# broker.conf's refusal mark: the highest (a shared test host's disk may be well used); its
# resume mark is left out: 94 %.
FILE_MARK = 99
# The usage the marks are set around: the lowest mark is 10 % (a mark one point under the
# usage), and sends must come back below the file's resume mark after the clear.
MIN_USED_PERCENT = 12.0
MAX_USED_PERCENT = 90.0
# How far the disk's usage may fall (other processes deleting files) during the test without
# taking it under the live mark; and rise without taking it over the file's resume mark.
USAGE_DRIFT_PERCENT = 4


def _stub(cluster: LocalCluster, node_id: str) -> pb_grpc.BrokerStub:
    return pb_grpc.BrokerStub(grpc.insecure_channel(cluster.node(node_id).client_addr))


def _send(cluster: LocalCluster, node_id: str, ids: UniqIdGenerator) -> str:
    """ "" when ``node_id`` (the leader) stored a send; else the DISK_FULL detail it answered."""
    batch = numbered_messages(ids, 2, 0, queues=QUEUES, body_bytes=64)
    try:
        _stub(cluster, node_id).SendMessage(
            pb.SendMessageRequest(topic=TOPIC, messages=batch), timeout=CALL_TIMEOUT_S
        )
    except grpc.RpcError as exc:
        detail = exc.details() or ""
        assert exc.code() is grpc.StatusCode.RESOURCE_EXHAUSTED, (exc.code(), detail)
        assert detail.startswith("DISK_FULL node="), detail
        return detail
    return ""


def _raise_level(cluster: LocalCluster, leader_id: str) -> None:
    def raised() -> bool:
        with grpc.insecure_channel(cluster.node(leader_id).client_addr) as ch:
            try:
                resp = dpb_grpc.DLedgerClientStub(ch).SetFeatureLevel(
                    dpb.SetFeatureLevelRequest(level=2), timeout=CALL_TIMEOUT_S
                )
            except grpc.RpcError:
                return False  # a member has not reported its support yet
        return bool(resp.level == 2)

    wait_for(raised, LEVEL_WAIT_S, "the group at feature level 2")


def _update(cluster: LocalCluster, leader_id: str, value: str, clear: bool = False) -> str:
    resp = _stub(cluster, leader_id).UpdateBrokerConfig(
        pb.UpdateBrokerConfigRequest(key=KEY, value=value, clear=clear), timeout=CALL_TIMEOUT_S
    )
    return str(resp.value)


def _every_member_shows(cluster: LocalCluster, value: str, source: str) -> Callable[[], bool]:
    def check() -> bool:
        for n in cluster.nodes:
            resp = _stub(cluster, n.node_id).GetBrokerConfig(
                pb.GetBrokerConfigRequest(), timeout=CALL_TIMEOUT_S
            )
            if (resp.config[KEY], resp.source[KEY]) != (value, source):
                return False
        return True

    return check


def _transfer(cluster: LocalCluster, leader_id: str, target: str) -> None:
    with grpc.insecure_channel(cluster.node(leader_id).client_addr) as ch:
        dpb_grpc.DLedgerClientStub(ch).TransferLeadership(
            dpb.TransferLeadershipRequest(target_id=target), timeout=CALL_TIMEOUT_S
        )
    assert cluster.wait_leader(LEADER_WAIT_S) == target


def test_a_live_refusal_mark_reaches_every_member_without_a_restart(
    local_group: Callable[..., LocalCluster],
) -> None:
    cluster = local_group(3, diskCheckIntervalMs=50, diskSpaceWarningLevelRatio=FILE_MARK)
    used = used_percent(os.statvfs(cluster.base))
    if not MIN_USED_PERCENT <= used <= MAX_USED_PERCENT:
        pytest.skip(f"the stores' disk is {used:.1f} % used: marks around it do not fit")
    # Under the usage, with room for the shared disk's usage to move while the test runs.
    mark = max(10, int(used) - USAGE_DRIFT_PERCENT)
    leader_id = cluster.wait_leader()
    _stub(cluster, leader_id).CreateTopic(
        pb.CreateTopicRequest(
            topic=pb.TopicConfig(topic_name=TOPIC, read_queue_nums=QUEUES, write_queue_nums=QUEUES)
        ),
        timeout=CALL_TIMEOUT_S,
    )
    ids = UniqIdGenerator(ip="127.0.0.1")
    assert _send(cluster, leader_id, ids) == ""  # broker.conf's mark: 99 %
    pids = {n.node_id: cluster.pid(n) for n in cluster.nodes}
    _raise_level(cluster, leader_id)

    # RocketMQ's spelling, a fraction: the value in effect is the percent.
    assert _update(cluster, leader_id, f"0.{mark:02d}") == str(mark)
    refused: list[str] = []

    def refused_at_the_new_mark() -> bool:
        refused.append(_send(cluster, leader_id, ids))
        return f" max={mark}% resume_below={mark - 5}% " in refused[-1]

    wait_for(refused_at_the_new_mark, APPLY_WAIT_S, f"a DISK_FULL at {mark} %")
    assert refused[-1].startswith(f"DISK_FULL node={leader_id} ")
    wait_for(_every_member_shows(cluster, str(mark), "live"), APPLY_WAIT_S, "every member's view")

    # A follower applied the record too: made leader, it refuses at the live mark at once.
    target = next(n.node_id for n in cluster.nodes if n.node_id != leader_id)
    _transfer(cluster, leader_id, target)
    detail = _send(cluster, target, ids)
    assert detail.startswith(f"DISK_FULL node={target} ") and f" max={mark}% " in detail, detail

    # Cleared: broker.conf's mark again (99 %, resume below 94 %), sends accepted again.
    assert _update(cluster, target, "", clear=True) == str(FILE_MARK)
    wait_for(lambda: _send(cluster, target, ids) == "", APPLY_WAIT_S, "a send after the clear")
    wait_for(
        _every_member_shows(cluster, str(FILE_MARK), "broker.conf"), APPLY_WAIT_S, "cleared views"
    )
    assert {n.node_id: cluster.pid(n) for n in cluster.nodes} == pids  # nothing restarted
