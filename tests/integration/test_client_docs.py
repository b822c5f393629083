"""The Python examples of docs/CLIENT.md, README.md and docs/RMQ5.md run as written (only the
NameServer's, the broker's and the v2 endpoint's addresses, and the secure group's files, are the
test group's). The RMQ5.md examples run with the official client's own venv."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from raftmq.broker.v1 import broker_pb2 as pb
from raftmq.broker.v1 import broker_pb2_grpc as pb_grpc

from broker.cluster import OFFICIAL_PYTHON, LocalCluster
from mqsecurity.channels import open_channel

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "CLIENT.md"
README = REPO / "README.md"
README_BROKER = "127.0.0.1:10911"
EXAMPLE_TIMEOUT_S = 40.0
DOC_NAMESRV = "127.0.0.1:9876"
RMQ5_DOC = REPO / "docs" / "RMQ5.md"
RMQ5_ENDPOINT = "127.0.0.1:8081"
RMQ5_CLUSTER_DIR = "/tmp/raftmq-cluster"
RMQ5_TOPIC = "TopicTest"


def python_blocks(doc: Path = DOC) -> list[str]:
    return re.findall(r"```python\n(.*?)```", doc.read_text(), flags=re.S)


def run_example(code: str, python: str = sys.executable, env: dict[str, str] | None = None) -> str:
    proc = subprocess.run(
        [python, "-c", code],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=EXAMPLE_TIMEOUT_S,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_client_md_examples_run_as_written(local_group: Callable[..., LocalCluster]) -> None:
    cluster = local_group(3, namesrv=True)
    assert cluster.namesrv is not None
    blocks = python_blocks()
    assert len(blocks) >= 4
    outputs = []
    for code in blocks[1:]:  # the first block is only the import line
        assert DOC_NAMESRV in code
        outputs.append(run_example(code.replace(DOC_NAMESRV, cluster.namesrv.addr)))
    producer_out, consumer_out, stubs_out = outputs
    assert "batch offsets" in producer_out and "async sent" in producer_out
    consumed = re.search(r"consumed (\d+) messages", consumer_out)
    assert consumed is not None and int(consumed.group(1)) >= 5, consumer_out
    assert "broker-a 4 queues, leader 127.0.0.1:" in stubs_out


def test_readme_examples_run_as_written(local_group: Callable[..., LocalCluster]) -> None:
    cluster = local_group(3, namesrv=True)
    assert cluster.namesrv is not None
    leader_addr = cluster.node(cluster.wait_leader()).client_addr
    producer, consumer, stubs = python_blocks(README)
    sent = run_example(producer.replace(DOC_NAMESRV, cluster.namesrv.addr))
    assert sent.count("sent ") == 10, sent
    got = run_example(consumer.replace(DOC_NAMESRV, cluster.namesrv.addr))
    assert "consumed 10" in got, got
    assert README_BROKER in stubs
    out = run_example(stubs.replace(README_BROKER, leader_addr)).splitlines()
    assert out == ["0", "[b'hello']"], out


def _create_rmq5_topic(cluster: LocalCluster) -> str:
    """TopicTest on ``cluster`` (as ``mqadmin updateTopic`` makes it); the leader's v2 endpoint."""
    leader = cluster.node(cluster.wait_leader())
    with open_channel(leader.client_addr, cluster.client_security()) as channel:
        config = pb.TopicConfig(topic_name=RMQ5_TOPIC, read_queue_nums=2, write_queue_nums=2)
        pb_grpc.BrokerStub(channel).CreateTopic(pb.CreateTopicRequest(topic=config), timeout=10)
    return leader.grpc_addr


def test_rmq5_md_python_examples_run_as_written(
    local_group: Callable[..., LocalCluster], tmp_path: Path
) -> None:
    assert OFFICIAL_PYTHON.exists(), "build/rmq5/pyclient missing: run 'make venv'"
    blocks = python_blocks(RMQ5_DOC)
    # By what each is: RMQ5.md also shows a transactional producer (not run here; the
    # transaction tests drive the clients with their own scripts).
    secure_producer = next(b for b in blocks if RMQ5_CLUSTER_DIR in b)
    consumer = next(b for b in blocks if "SimpleConsumer(" in b)
    producer = next(
        b
        for b in blocks
        if "Producer(" in b and b is not secure_producer and "Transaction" not in b
    )
    assert RMQ5_ENDPOINT in secure_producer and RMQ5_CLUSTER_DIR in secure_producer
    # The secure example against a secure group: TLS verifying the group's CA, signed.
    secure = local_group(1, secure=True)
    endpoint = _create_rmq5_topic(secure)
    code = secure_producer.replace(RMQ5_ENDPOINT, endpoint)
    code = code.replace(f"{RMQ5_CLUSTER_DIR}/admin.json", str(secure.layout.admin_credentials))
    env = secure.official_client_env(tmp_path)  # the CA the example's comment names
    assert re.fullmatch(r"01[0-9A-F]{32}", run_example(code, str(OFFICIAL_PYTHON), env).strip())
    # The plaintext producer and SimpleConsumer against an --insecure group.
    plain = local_group(1)
    endpoint = _create_rmq5_topic(plain)
    env = plain.official_client_env(tmp_path)
    sent = run_example(producer.replace(RMQ5_ENDPOINT, endpoint), str(OFFICIAL_PYTHON), env)
    got = run_example(consumer.replace(RMQ5_ENDPOINT, endpoint), str(OFFICIAL_PYTHON), env)
    assert got.split() == [sent.strip(), "TagA", "b'hello'", "1"], got
