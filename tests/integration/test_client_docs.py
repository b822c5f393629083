"""The Python examples of docs/CLIENT.md, README.md and docs/RMQ5.md, and RMQ5.md's Node.js
ones, run as written (only the NameServer's, the broker's and the v2 endpoint's addresses, and
the secure group's files, are the test group's). The RMQ5.md examples run with the official
clients (build/rmq5: the Python client's own venv, node with the Node.js client), against two
groups both share."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from conftest import TEST_INDEX_FILE_BYTES, TEST_SEGMENT_BYTES
from raftmq.broker.v1 import broker_pb2 as pb
from raftmq.broker.v1 import broker_pb2_grpc as pb_grpc

from mqcluster.cluster import OFFICIAL_PYTHON, LocalCluster
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
# The Node.js examples name the second node's (one endpoint per client over TLS).
RMQ5_ANY_ENDPOINT = r"127\.0\.0\.1:808[1-3]"
RMQ5_CLUSTER_DIR = "/tmp/raftmq-cluster"
RMQ5_TOPIC = "TopicTest"
OFFICIAL_NODE_MODULES = REPO / "build" / "rmq5" / "node" / "node_modules"


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


@pytest.fixture(scope="module")
def rmq5_groups(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[LocalCluster, LocalCluster]]:
    """The groups RMQ5.md's examples run against, each with TopicTest, started once for the
    Python and the Node.js examples: a secure single node (TLS, users: what ``mqcluster up``
    makes) and an ``--insecure`` one."""
    root = tmp_path_factory.mktemp("rmq5md")
    extra = {
        "mappedFileSizeCommitLog": str(TEST_SEGMENT_BYTES),
        "mappedFileSizeEntryIndex": str(TEST_INDEX_FILE_BYTES),
    }
    started: list[LocalCluster] = []
    try:
        for name, secure in (("secure", True), ("plain", False)):
            cluster = LocalCluster(root / name)
            cluster.configure(1, auto_ports=True, extra=extra, secure=secure)
            started.append(cluster)
            cluster.up()
            _create_rmq5_topic(cluster)
        yield started[0], started[1]
    finally:
        for cluster in started:
            cluster.down(grace_s=5.0)


def test_rmq5_md_python_examples_run_as_written(
    rmq5_groups: tuple[LocalCluster, LocalCluster], tmp_path: Path
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
    secure, plain = rmq5_groups
    # The secure example against a secure group: TLS verifying the group's CA, signed.
    endpoint = secure.nodes[0].grpc_addr
    code = secure_producer.replace(RMQ5_ENDPOINT, endpoint)
    code = code.replace(f"{RMQ5_CLUSTER_DIR}/admin.json", str(secure.layout.admin_credentials))
    env = secure.official_client_env(tmp_path)  # the CA the example's comment names
    assert re.fullmatch(r"01[0-9A-F]{32}", run_example(code, str(OFFICIAL_PYTHON), env).strip())
    # The plaintext producer and SimpleConsumer against an --insecure group.
    endpoint = plain.nodes[0].grpc_addr
    env = plain.official_client_env(tmp_path)
    sent = run_example(producer.replace(RMQ5_ENDPOINT, endpoint), str(OFFICIAL_PYTHON), env)
    got = run_example(consumer.replace(RMQ5_ENDPOINT, endpoint), str(OFFICIAL_PYTHON), env)
    assert got.split() == [sent.strip(), "TagA", "b'hello'", "1"], got


def _node_example(code: str, endpoint: str, cluster: LocalCluster, home: Path, name: str) -> str:
    """Run a ``js`` block of RMQ5.md with node as the file it names (CommonJS), its endpoint
    and credentials file the test group's; what it printed."""
    assert len(re.findall(RMQ5_ANY_ENDPOINT, code)) == 1, code
    code = re.sub(RMQ5_ANY_ENDPOINT, endpoint, code)
    code = code.replace(f"{RMQ5_CLUSTER_DIR}/admin.json", str(cluster.layout.admin_credentials))
    (home / name).write_text(code)
    return _node([name], cluster, home)


def _node(args: list[str], cluster: LocalCluster, home: Path) -> str:
    """``node ARGS`` in ``home`` with the project's Node.js client; what it printed."""
    env = {**cluster.official_client_env(home), "NODE_PATH": str(OFFICIAL_NODE_MODULES)}
    proc = subprocess.run(
        ["node", *args],
        cwd=home,
        capture_output=True,
        text=True,
        timeout=EXAMPLE_TIMEOUT_S,
        env=env,
    )
    assert proc.returncode == 0, f"{args}:\n{proc.stdout}\n{proc.stderr[-3000:]}"
    return proc.stdout


def test_rmq5_md_node_examples_run_as_written(
    rmq5_groups: tuple[LocalCluster, LocalCluster], tmp_path: Path
) -> None:
    """The Node.js examples (a secure producer and SimpleConsumer, a plaintext SimpleConsumer)
    run with node 20 as the files they name, with the project's client (NODE_PATH)."""
    assert (OFFICIAL_NODE_MODULES / "rocketmq-client-nodejs").exists(), "run 'make venv'"
    blocks = re.findall(r"```js\n(.*?)```", RMQ5_DOC.read_text(), flags=re.S)
    secure_blocks = [b for b in blocks if RMQ5_CLUSTER_DIR in b]
    (producer,) = [b for b in secure_blocks if "new Producer(" in b]
    (secure_consumer,) = [b for b in secure_blocks if "new SimpleConsumer(" in b]
    (plain_consumer,) = [b for b in blocks if b not in secure_blocks]
    assert "new SimpleConsumer(" in plain_consumer
    secure, plain = rmq5_groups
    # Secure: what the producer sent comes back to the consumer of a group of its own.
    endpoint = secure.nodes[0].grpc_addr
    sent = _node_example(producer, endpoint, secure, tmp_path, "send.js").strip()
    assert re.fullmatch(r"01[0-9A-F]{32}", sent), sent
    got = _node_example(secure_consumer, endpoint, secure, tmp_path, "receive.js")
    assert [sent, "TagA", "hello", "1"] in [line.split() for line in got.splitlines()], got
    # Plaintext: a message of the tests' Node.js producer script, then the example.
    endpoint = plain.nodes[0].grpc_addr
    script = REPO / "tests" / "rmq5" / "node_producer.js"
    receipt = _node([str(script), endpoint, RMQ5_TOPIC, "1", "md"], plain, tmp_path)
    plain_id = json.loads(receipt.splitlines()[0])["message_id"]
    got = _node_example(plain_consumer, endpoint, plain, tmp_path, "receive-plain.js")
    rows = [line.split() for line in got.splitlines()]
    assert [plain_id, "tag0", "md-body-0", "1"] in rows, got
