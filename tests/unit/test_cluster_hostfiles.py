"""mqcluster hosts: the files of a cluster on several hosts, from one layout."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest

from broker.config import load_config
from mqcluster.cluster import ClusterError, main
from mqcluster.hostfiles import parse_layout, read_command, run
from mqsecurity import pki
from nameserver.config import load_config as load_namesrv_config

LAYOUT = {
    "namesrvs": ["10.0.0.1", "10.0.0.2"],
    "groups": {"broker-a": ["10.0.0.11", "10.0.0.12", "10.0.0.13"]},
    "bindAddress": "0.0.0.0",
    "settings": {"fileReservedTime": "96"},
}


def _write(tmp_path: Path, layout: dict[str, object]) -> str:
    path = tmp_path / "layout.json"
    path.write_text(json.dumps(layout))
    return str(path)


def test_every_process_gets_its_conf_certificate_and_command(tmp_path: Path) -> None:
    out = tmp_path / "out"
    written = run(_write(tmp_path, LAYOUT), str(out))
    assert written.made == [
        "namesrv-0",
        "namesrv-1",
        "broker-a-n0",
        "broker-a-n1",
        "broker-a-n2",
    ]
    cfg = load_config(out / "broker-a-n1" / "broker.conf")
    assert cfg.brokerIP1 == "10.0.0.12" and cfg.bind_host == "0.0.0.0"
    assert cfg.client_addr == "10.0.0.12:10911"
    assert [p.addr for p in cfg.dLegerPeers] == [
        "10.0.0.11:40911",
        "10.0.0.12:40911",
        "10.0.0.13:40911",
    ]
    assert cfg.namesrvAddr == "10.0.0.1:9876;10.0.0.2:9876"
    assert cfg.tlsEnable and cfg.authenticationEnabled and cfg.fileReservedTime == 96
    assert stat.S_IMODE((out / "broker-a-n1" / "broker.conf").stat().st_mode) == 0o600
    identity = pki.member_identity(Path(cfg.tlsServerCertPath).read_bytes())
    assert identity is not None and (identity.group, identity.node_id) == ("broker-a", "n1")
    ns = load_namesrv_config(out / "namesrv-1" / "namesrv.conf")
    assert ns.listenHost == "0.0.0.0" and ns.tlsEnable and ns.brokerAuthenticationEnabled
    argv = read_command(out / "broker-a-n1")
    assert argv[:3] == ["mqbroker", "-c", str(out / "broker-a-n1" / "broker.conf")]
    assert read_command(out / "namesrv-0")[0] == "mqnamesrv"


def test_a_second_run_adds_a_group_and_keeps_the_rest(tmp_path: Path) -> None:
    out = tmp_path / "out"
    run(_write(tmp_path, LAYOUT), str(out))
    ca_before = (out / "ca" / "ca.crt").read_bytes()
    conf_before = (out / "broker-a-n0" / "broker.conf").read_bytes()
    bigger = {**LAYOUT, "groups": {**LAYOUT["groups"], "broker-b": ["10.0.0.21"]}}  # type: ignore[dict-item]
    written = run(_write(tmp_path, bigger), str(out))
    assert written.made == ["broker-b-n0"]
    assert (out / "ca" / "ca.crt").read_bytes() == ca_before
    assert (out / "broker-a-n0" / "broker.conf").read_bytes() == conf_before
    # The new group's init user is the same admin: one set of users for the cluster.
    a = load_config(out / "broker-a-n0" / "broker.conf").initAuthenticationUser
    b = load_config(out / "broker-b-n0" / "broker.conf").initAuthenticationUser
    assert a == b


@pytest.mark.parametrize(
    ("change", "needle"),
    [
        ({"namesrvs": []}, "namesrvs"),
        ({"namesrvs": ["0.0.0.0"]}, "not a routable IPv4"),
        ({"groups": {"broker-a": ["10.0.0.1"] * 8}}, "1 to 7 hosts"),
        ({"groups": {"bad name": ["10.0.0.1"]}}, "group 'bad name'"),
        ({"groups": {"broker-a": ["host.example"]}}, "not an IP address"),
        ({"bindAddress": "anywhere"}, "bindAddress"),
        ({"settings": {"brokerIP1": "10.0.0.9"}}, "written by the tool"),
        ({"extra": 1}, "unknown keys"),
    ],
)
def test_bad_layouts_are_refused_with_the_reason(change: dict[str, object], needle: str) -> None:
    with pytest.raises(ClusterError, match=needle):
        parse_layout(json.dumps({**LAYOUT, **change}))


def test_the_cli_reports_a_bad_layout_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["hosts", "--layout", str(tmp_path / "none.json"), "--out", str(tmp_path)]) == 1
    assert "layout" in capsys.readouterr().err


def test_settings_the_broker_would_refuse_are_refused_before_anything_is_kept(
    tmp_path: Path,
) -> None:
    out = tmp_path / "out"
    bad = {**LAYOUT, "settings": {"fileReservedTime": "48", "timerMaxDelaySec": "360000"}}
    with pytest.raises(ClusterError, match="timerMaxDelaySec"):
        run(_write(tmp_path, bad), str(out))
    assert not (out / "broker-a-n0").exists()


def test_the_remoting_ports_are_served_and_printed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """RocketMQ 4.x clients' ports: each broker's 10912 (registered with the NameServers for
    the remoting routes) and each NameServer's 9877, the address 4.x clients are given."""
    out = tmp_path / "out"
    assert main(["hosts", "--layout", _write(tmp_path, LAYOUT), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "namesrvAddr 10.0.0.1:9877;10.0.0.2:9877" in printed
    assert "NameServers: 10.0.0.1:9876;10.0.0.2:9876" in printed
    cfg = load_config(out / "broker-a-n2" / "broker.conf")
    assert cfg.remoting_addr == "10.0.0.13:10912" and cfg.tlsEnable
    ns = load_namesrv_config(out / "namesrv-0" / "namesrv.conf")
    assert ns.remotingListenPort == 9877 and ns.tlsEnable
    # A layout may turn a broker's remoting port off.
    off = {**LAYOUT, "settings": {"remotingListenPort": "0"}}
    run(_write(tmp_path, off), str(tmp_path / "off"))
    assert load_config(tmp_path / "off" / "broker-a-n0" / "broker.conf").remoting_addr == ""
