"""The composition root (``broker/app.py``): one build of the process hands every front end,
the metrics and the node the same components, each given at construction (nothing is set on a
component afterwards), without starting anything."""

from __future__ import annotations

from pathlib import Path

import pytest

from broker.app import Broker, build
from broker.config import parse_config
from broker.state.auth.secrets import generate_key_file
from broker.state.errors import MessageNotFoundError

BASE_CONF = "dLegerPeers=n0-127.0.0.1:40911\ndLegerSelfId=n0\nlistenPort=10911\n"


def _conf(tmp_path: Path, extra: str = "") -> str:
    return BASE_CONF + f"storePathRootDir={tmp_path / 'store'}\n" + extra


def _shares_components(broker: Broker) -> None:
    """The v1 servicer calls the broker's components, not copies of its own."""
    s = broker.servicer
    assert s.node is broker.node
    for name in (
        "applied",
        "topics",
        "sender",
        "puller",
        "offsets",
        "lookups",
        "consumers",
        "retries",
        "pops",
        "txns",
        "subgroups",
        "auth",
        "guard",
    ):
        assert getattr(s, name) is getattr(broker, name), name
    assert broker.sender.halves == broker.txns.prepare  # transactional sends store halves
    for component in (broker.applied, broker.topics, broker.sender, broker.auth):
        assert component.ctx.node is broker.node and component.ctx.sm is broker.sm


def test_a_full_process_is_built_once_over_one_set_of_components(tmp_path: Path) -> None:
    key = tmp_path / "acl.key"
    generate_key_file(str(key))
    cfg = parse_config(
        _conf(
            tmp_path,
            "metricsPort=5557\ngrpcServerPort=8081\nnamesrvAddr=127.0.0.1:9876\n"
            "remotingListenPort=10912\n"
            f"authenticationEnabled=true\nauthorizationEnabled=true\naclEncryptionKeyPath={key}\n",
        )
    )
    process = build(cfg)
    broker = process.broker
    assert process.node is broker.node
    _shares_components(broker)
    # Metrics: the send and pull paths and the node count into what /metrics reads.
    assert process.exporter is not None and broker.stats is not None
    assert broker.sender.stats is broker.stats and broker.puller.stats is broker.stats
    metrics = process.exporter.metrics
    assert metrics.stats is broker.stats and metrics.offsets is broker.offsets
    assert metrics.polls is broker.puller.polls and metrics.disk_guard is broker.disk_guard
    assert metrics.node is broker.node and metrics.sm is broker.sm
    assert metrics.delay_levels == len(cfg.delay_levels_ms) == 18  # RocketMQ's default levels
    assert process.node.raft_stats is not None  # type: ignore[attr-defined]
    # The guard: the node's, the v1 servicer's and the v2 port's, reading stored topics.
    guard = broker.guard
    assert guard is not None and guard.topic_at is not None
    with pytest.raises(MessageNotFoundError):  # read through this broker: nothing applied
        guard.topic_at(0)
    assert process.node.call_guard is guard  # type: ignore[attr-defined]
    # The RocketMQ 5 port over the same components.
    v2 = process.v2_port
    assert v2 is not None
    assert v2.security.guard is guard  # type: ignore[attr-defined]
    forwarder = v2.forwarder  # type: ignore[attr-defined]
    assert forwarder.node is broker.node and forwarder.ops is broker.leader_ops
    ops = broker.leader_ops
    assert ops.node is broker.node and ops.sender is broker.sender
    assert ops.pops is broker.pops and ops.txns is broker.txns
    assert ops.subgroups is broker.subgroups and v2.servicer.subgroups is broker.subgroups  # type: ignore[attr-defined]
    # The RocketMQ 4.x remoting port over the same components, behind the same guard.
    remoting = process.remoting_port
    assert remoting is not None and remoting.port == 10912  # type: ignore[attr-defined]
    service = remoting.service  # type: ignore[attr-defined]
    assert service.broker is broker and service.guard is guard
    assert remoting.forwarder.ops is ops and service.forwarder is remoting.forwarder  # type: ignore[attr-defined]
    # The v1 servicer and the forwards' service run the same leader operations.
    assert broker.servicer.leader_ops is ops and broker.leader_service.ops is ops
    assert v2.servicer.topics is broker.topics  # type: ignore[attr-defined]
    assert v2.servicer.producers.applied is broker.applied  # type: ignore[attr-defined]
    assert process.registrar is not None and process.registrar.sm is broker.sm
    assert process.scrubber.sm is broker.sm
    broker.sm.close()


def test_what_is_not_configured_is_not_built(tmp_path: Path) -> None:
    process = build(parse_config(_conf(tmp_path)))
    broker = process.broker
    _shares_components(broker)
    assert process.exporter is None and process.v2_port is None and process.registrar is None
    assert process.remoting_port is None
    assert broker.stats is None and broker.sender.stats is None and broker.puller.stats is None
    assert process.node.raft_stats is None  # type: ignore[attr-defined]
    assert broker.guard is None and process.node.call_guard is None  # type: ignore[attr-defined]
    broker.sm.close()
