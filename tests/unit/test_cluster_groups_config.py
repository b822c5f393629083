"""mqcluster.groups without processes: the files of a cluster of several groups, and what a
damaged cluster.json or a bad name gets."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from broker.config import load_config
from mqcluster.cluster import ClusterError
from mqcluster.groups import Groups


def test_the_second_group_takes_the_next_port_block_and_the_first_groups_namesrv(
    tmp_path: Path,
) -> None:
    groups = Groups(tmp_path)
    groups.configure(2, 3, namesrv=True)
    first, second = groups.all()
    assert (first.group, second.group) == ("broker-a", "broker-b")
    assert second.base == tmp_path / "groups" / "broker-b"
    assert [n.client_port for n in second.nodes] == [11011, 11021, 11031]
    assert [n.peer_port for n in second.nodes] == [40921, 40922, 40923]
    cfg = load_config(second.nodes[0].conf)
    assert first.namesrv is not None and cfg.namesrvAddr == first.namesrv.addr
    assert cfg.brokerName == "broker-b" and cfg.grpcServerPort == 8091
    assert second.namesrv is None
    # read back from the files
    again = Groups(tmp_path)
    assert [g.group for g in again.all()] == ["broker-a", "broker-b"]


def test_secure_groups_share_one_ca_and_admin(tmp_path: Path) -> None:
    groups = Groups(tmp_path)
    groups.configure(2, 1, namesrv=True, secure=True, auto_ports=True)
    first, second = groups.all()
    a, b = load_config(first.nodes[0].conf), load_config(second.nodes[0].conf)
    assert a.tlsServerTrustCertPath == b.tlsServerTrustCertPath
    assert a.aclEncryptionKeyPath == b.aclEncryptionKeyPath
    assert a.initAuthenticationUser == b.initAuthenticationUser
    assert Path(b.tlsServerCertPath).name == "broker-b-n0.crt"
    assert not (second.base / "tls").exists()  # no CA of its own


def test_automatic_ports_are_never_given_to_two_groups(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each group's ports are drawn while the others' are still free (nothing started yet): in
    a narrow range, four groups of 5 nodes (88 ports of 256) drew the same port twice almost
    every time before the draw avoided the other groups' ports. A repeat left one node unable
    to bind while the other answered in its place (a CI run lost a group's member that way)."""
    monkeypatch.setenv("RAFTMQ_PICK_PORTS", "26000-26256")
    for attempt in range(3):
        groups = Groups(tmp_path / str(attempt))
        groups.configure(4, 5, namesrv=True, auto_ports=True)
        ports = [p for g in groups.all() for p in sorted(g.configured_ports())]
        assert len(ports) == len(set(ports)) == 4 * 5 * 6 + 3  # 6 ports a node, 3 the NameServer


@pytest.mark.parametrize("count", [0, 11])
def test_the_number_of_groups_is_bounded(tmp_path: Path, count: int) -> None:
    with pytest.raises(ClusterError, match="--groups must be in"):
        Groups(tmp_path).configure(count, 1, namesrv=True)


def test_several_groups_need_a_namesrv(tmp_path: Path) -> None:
    with pytest.raises(ClusterError, match="need a NameServer"):
        Groups(tmp_path).configure(2, 1)


@pytest.mark.parametrize("names", [["../../etc"], "broker-b", [1], ["ok"] * 10])
def test_a_damaged_group_list_is_refused(tmp_path: Path, names: object) -> None:
    Groups(tmp_path).configure(1, 1, namesrv=True)
    state = tmp_path / "cluster.json"
    data = json.loads(state.read_text())
    data["groups"] = names
    state.write_text(json.dumps(data))
    with pytest.raises(ClusterError, match="'groups' is not a list of group names"):
        Groups(tmp_path).all()


@pytest.mark.parametrize("name", ["admin", "../x", "", "a b"])
def test_bad_user_names_are_refused(tmp_path: Path, name: str) -> None:
    groups = Groups(tmp_path)
    groups.configure(1, 1, namesrv=True, secure=True, auto_ports=True)
    with pytest.raises(ClusterError, match="user name"):
        groups.add_user(name)
    assert not (tmp_path / "users").exists()
