"""The group feature level on a real 3-node group (docs/RAFT.md "Feature level"): a raise is
refused while a member is down (the error names it), goes through once it is back, and then
every node reports level 2 and its store's checkpoint is format 3 (what raftmq 0.2.0 refuses
to open: the rollback guard)."""

from __future__ import annotations

import json
import signal
from collections.abc import Callable
from pathlib import Path

import pytest
from support import wait_for

from client.mqadmin import main as mqadmin
from dledger.server.client import ClientError, LogClient
from dledger.storage import codec
from mqcluster.cluster import LocalCluster
from mqerrors import codes as E
from mqrelease import FEATURE_LEVEL, RELEASE

pytestmark = pytest.mark.integration

# A restarted node answers its leader within a heartbeat once it serves; the raise is retried
# until its report arrived.
REPORT_WAIT_S = 20.0
CHECKPOINT_WAIT_S = 15.0


def _levels(client: LogClient, cluster: LocalCluster) -> dict[str, tuple[int, int, int]]:
    """node -> (group level it applied, its checkpoint's format, its checkpoint's level)."""
    out = {}
    for n in cluster.nodes:
        md = client.metadata(n.client_addr, timeout_s=2.0)
        assert md.release == RELEASE and md.supported_feature_level == FEATURE_LEVEL
        ckpt = codec.decode_checkpoint((Path(md.store_path) / "checkpoint").read_bytes())
        out[n.node_id] = (md.feature_level, ckpt.version, ckpt.feature_level)
    return out


def _raise(client: LogClient) -> tuple[int, int] | str:
    try:
        resp = client.set_feature_level(0, timeout_s=5.0)
    except ClientError as exc:
        return f"{exc.code}: {exc}"
    return resp.level, resp.index


def test_raise_refused_while_a_member_is_down_then_every_node_at_level_2(
    local_group: Callable[..., LocalCluster], capsys: pytest.CaptureFixture[str]
) -> None:
    cluster = local_group(3)
    leader = cluster.wait_leader()
    down = next(n.node_id for n in cluster.nodes if n.node_id != leader)
    leader_addr = cluster.node(leader).client_addr
    with cluster.client() as client:
        before = _levels(client, cluster)
        assert set(before.values()) == {(1, codec.CHECKPOINT_VERSION_V2, 1)}, before
        cluster.signal(down, signal.SIGKILL)

        def leader_misses_it() -> bool:
            members = client.list_members(leader_addr).members
            return not next(m.recent_active for m in members if m.id == down)

        # Until an election timeout passed, its last answer still counts as recent.
        wait_for(leader_misses_it, REPORT_WAIT_S, f"leader {leader} to miss {down}")
        flags = [*cluster.tool_argv(), "-n", "127.0.0.1:9"]
        argv = ["setFeatureLevel", "-a", leader_addr]
        capsys.readouterr()
        code, err = mqadmin([*flags, *argv, "--timeout", "5"]), capsys.readouterr().err
        assert code == 1 and E.FEATURE_LEVEL_UNSUPPORTED in err, err
        assert f"member {down} has not answered" in err, err
        assert all(
            client.metadata(n.client_addr).feature_level == 1
            for n in cluster.nodes
            if n.node_id != down
        )

        cluster.start(down)
        cluster.wait_serving(REPORT_WAIT_S)
        outcome: list[tuple[int, int] | str] = []

        def raised() -> bool:
            outcome[:] = [_raise(client)]
            return isinstance(outcome[0], tuple)

        wait_for(raised, REPORT_WAIT_S, f"the raise to go through ({outcome})")
        level, index = outcome[0]  # type: ignore[misc]
        assert level == FEATURE_LEVEL and index > 0

        def all_at_level_2() -> bool:
            now = _levels(client, cluster)
            return set(now.values()) == {(2, codec.CHECKPOINT_VERSION, 2)}

        wait_for(all_at_level_2, CHECKPOINT_WAIT_S, "every node at level 2 with checkpoint 3")
        # A retry (its first answer lost) gets the committed raise; mqadmin prints it.
        capsys.readouterr()
        assert mqadmin([*flags, "--json", *argv, "--level", "2"]) == 0
        printed = json.loads(capsys.readouterr().out)
        assert printed == {"feature_level": 2, "index": index}
        with pytest.raises(ClientError, match="never lowered") as info:
            client.set_feature_level(1, timeout_s=2.0)
        assert info.value.code == E.FEATURE_LEVEL_UNSUPPORTED
        members = client.list_members()
        assert members.feature_level == 2
        assert {m.supported_feature_level for m in members.members} == {FEATURE_LEVEL}
        # A restart keeps the level (the log and the format 3 checkpoint carry it).
        cluster.signal(down, signal.SIGTERM)
        wait_for(lambda: cluster.pid(cluster.node(down)) is None, 10.0, f"{down} to stop")
        cluster.start(down)
        cluster.wait_serving(REPORT_WAIT_S)
        assert client.metadata(cluster.node(down).client_addr).feature_level == 2
