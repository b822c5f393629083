"""The Python examples of docs/CLIENT.md and README.md run as written (only the NameServer's and
the broker's addresses are the test group's)."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from broker.cluster import LocalCluster

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "CLIENT.md"
README = REPO / "README.md"
README_BROKER = "127.0.0.1:10911"
EXAMPLE_TIMEOUT_S = 40.0
DOC_NAMESRV = "127.0.0.1:9876"


def python_blocks(doc: Path = DOC) -> list[str]:
    return re.findall(r"```python\n(.*?)```", doc.read_text(), flags=re.S)


def run_example(code: str) -> str:
    proc = subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=EXAMPLE_TIMEOUT_S,
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
