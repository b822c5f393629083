"""``mqcluster add`` writes the new node's broker.conf with the group's own settings: a node
with a segment size of its own would refuse every snapshot its leader sends (the header's
segment size must be the receiver's), so it could never catch up once retention ran.

No broker runs here: the node's config is written as `LocalCluster.add_node` writes it, by a
fresh `LocalCluster` reading the state file (as a later `mqcluster add` process does).
"""

from __future__ import annotations

from pathlib import Path

from broker.config import load_config
from mqcluster.cluster import LocalCluster

SETTINGS = {"mappedFileSizeCommitLog": "65536", "fileReservedTime": "1", "timerMaxDelaySec": "3600"}


def test_an_added_node_gets_the_groups_settings(tmp_path: Path) -> None:
    LocalCluster(tmp_path / "c").configure(3, auto_ports=True, extra=SETTINGS)
    cluster = LocalCluster(tmp_path / "c")  # what `mqcluster add` loads
    info = cluster._write_new_node(cluster.node("n0"), {"fileReservedTime": "5"})
    conf = load_config(info.conf)  # a valid broker.conf
    assert conf.mappedFileSizeCommitLog == 65536
    assert conf.fileReservedTime == 5  # the caller's extra keys win
    assert [(p.node_id, p.addr) for p in conf.dLegerPeers] == [
        (info.node_id, f"127.0.0.1:{info.peer_port}")
    ]
    assert conf.dLegerJoinAddr == f"127.0.0.1:{cluster.node('n0').peer_port}"
    assert not conf.dLegerPeerClientAddrs  # the originals' map names peers it lacks
    assert [n.node_id for n in LocalCluster(tmp_path / "c").nodes] == ["n0", "n1", "n2", "n3"]


def test_secrets_among_the_settings_stay_out_of_cluster_json(tmp_path: Path) -> None:
    init = '{"username": "root", "password": "s3cret-Pa55"}'
    LocalCluster(tmp_path / "c").configure(
        3, auto_ports=True, extra={**SETTINGS, "initAuthenticationUser": init}
    )
    assert "s3cret-Pa55" not in (tmp_path / "c" / "cluster.json").read_text()
    assert "s3cret-Pa55" in (tmp_path / "c" / "n0.conf").read_text()  # the node's own file
    cluster = LocalCluster(tmp_path / "c")
    info = cluster._write_new_node(cluster.node("n0"), {})
    conf = load_config(info.conf)  # the joining node takes the users from the group's log
    assert conf.initAuthenticationUser is None and conf.mappedFileSizeCommitLog == 65536
