"""RocketMQ's own DLedger broker.conf starts a raftmq group (issue #35): three members
configured as RocketMQ's conf/dledger/broker-n0/n1/n2.conf (and its stock broker.conf's keys)
elect a leader, take a message through the NameServer and read it back, and each logs exactly
one warning: the line naming the RocketMQ keys it ignores."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from support import create_topic

from client import Message, Producer, PullConsumer
from mqcluster.cluster import LocalCluster

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("no_client_threads_left")]

TEMPLATE = Path(__file__).resolve().parent / "rocketmq" / "broker-dledger.conf"
# Small segments: the stock 1 GiB would be allocated in full on each member.
SEGMENT_BYTES = 4 << 20
# The RocketMQ keys of the template raftmq does not use, in the order the warning names them.
IGNORED = (
    "brokerId (Raft elects the leader), brokerRole (Raft elects the leader), "
    "sendMessageThreadPoolNums, storePathCommitLog (a DLedger commitlog lives in "
    "storePathRootDir/dledger-<dLegerSelfId>, in RocketMQ as here)"
)


@pytest.fixture
def rocketmq_group(tmp_path: Path) -> Iterator[LocalCluster]:
    """A group of three whose broker.conf files are the RocketMQ template's, and a NameServer."""
    cluster = LocalCluster(tmp_path / "group")
    cluster.configure(3, group="RaftNode00", auto_ports=True, namesrv=True)
    assert cluster.namesrv is not None
    peers = ";".join(f"{n.node_id}-127.0.0.1:{n.peer_port}" for n in cluster.nodes)
    for n in cluster.nodes:
        text = TEMPLATE.read_text(encoding="utf-8").format(
            group="RaftNode00",
            listen_port=n.client_port,
            namesrv_addr=cluster.namesrv.addr,
            store=tmp_path / "store" / n.node_id,
            peers=peers,
            self_id=n.node_id,
            segment_bytes=SEGMENT_BYTES,
        )
        Path(n.conf).write_text(text, encoding="utf-8")
    try:
        cluster.up()
        yield cluster
    finally:
        cluster.down(grace_s=5.0)


def test_rocketmq_dledger_conf_starts_with_one_warning(rocketmq_group: LocalCluster) -> None:
    cluster = rocketmq_group
    assert cluster.namesrv is not None
    create_topic(cluster, "RmqConfT", 2)
    with (
        Producer("pg", cluster.namesrv.addr) as producer,
        PullConsumer("cg", cluster.namesrv.addr) as reader,
    ):
        sent = producer.send(Message("RmqConfT", b"stock conf"))
        got = reader.pull(sent.message_queue, 0, max_nums=8)
        assert [m.body for m in got.messages] == [b"stock conf"]
    for n in cluster.nodes:
        warnings = [
            line
            for line in Path(n.log).read_text(encoding="utf-8").splitlines()
            if " WARNING " in line
        ]
        assert len(warnings) == 1, (n.node_id, warnings)
        assert warnings[0].endswith(
            f"{n.conf}: ignoring 4 RocketMQ broker key(s) raftmq does not use: {IGNORED}"
            " (docs/CONFIG.md lists the keys raftmq accepts and ignores)"
        ), warnings[0]
