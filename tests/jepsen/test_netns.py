"""The network-namespace backend (``mqjepsen run --net netns``) against a real local group.

Needs root, ``ip`` and a working ``iptables`` inside namespaces (``apt-get install iptables``);
skipped with the reason otherwise. A short partition run passes its checkers, and afterwards
nothing of the run (namespace, veth, bridge) is left.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from jepsen_like.__main__ import main
from jepsen_like.netns import BRIDGE_PREFIX, NS_PREFIX, VETH_PREFIX, check_netns
from mqcluster.cluster import _pid_alive

pytestmark = pytest.mark.integration

_REASON = check_netns()
# Seed 7 draws isolate-leader first: the leader's peers' packets are dropped, forcing an election.
SEED = int(os.environ.get("RAFTMQ_JEPSEN_NETNS_SEED", "7"))
# Seconds `ip` gets to list namespaces or links.
IP_TIMEOUT_S = 10.0


def _ip(*args: str) -> str:
    return subprocess.run(
        ["ip", *args], capture_output=True, text=True, check=True, timeout=IP_TIMEOUT_S
    ).stdout


@pytest.mark.skipif(bool(_REASON), reason=f"netns backend unusable here: {_REASON}")
def test_netns_partition_run_passes_and_cleans_up(tmp_path: Path) -> None:
    """`mqjepsen run --net netns --nodes 3 --time-limit 12 --interval 3 --nemesis partition
    --seed S`: one partition (3 s healthy, 3 s cut, healthy to the 2.4 s quiet end), as the
    20 s / 5 s form had, 8 s sooner."""
    run_dir = tmp_path / "run"
    code = main(
        [
            "run",
            "--net",
            "netns",
            "--nodes",
            "3",
            "--time-limit",
            "12",
            "--interval",
            "3",
            "--nemesis",
            "partition",
            "--seed",
            str(SEED),
            "--dir",
            str(run_dir),
        ]
    )
    results = json.loads((run_dir / "results.json").read_text())
    assert code == 0, (results["checks"], results["events"])
    net = results["network"]
    assert net["backend"] == "netns"
    run_id = str(net["run_id"])
    # the nodes really ran in the namespaces, on their addresses
    assert set(net["namespaces"]) == {"n0", "n1", "n2"}
    assert all(a.startswith("10.77.") for a in net["addresses"].values())
    assert any(f["kind"] == "partition" for f in results["faults"])
    # a peer link was cut with iptables (any seed that draws a peer shape; seed 7 does)
    cut = {name for name, v in results["netns_links"].items() if v["cuts"]}
    assert cut
    if SEED == 7:
        assert any(not name.startswith("client") for name in cut), cut
    # nothing of the run is left
    left_ns = [ln for ln in _ip("netns", "list").splitlines() if f"{NS_PREFIX}{run_id}-" in ln]
    assert not left_ns
    links = _ip("-o", "link", "show")
    for name in (f"{BRIDGE_PREFIX}{run_id}", f"{VETH_PREFIX}{run_id}"):
        assert name not in links
    state = json.loads((run_dir / "cluster" / "cluster.json").read_text())
    for info in [*state["nodes"], state["namesrv"]]:
        pid_file = Path(info["pid_file"])
        assert not pid_file.exists() or not _pid_alive(int(pid_file.read_text()), info["conf"])


def test_netns_unusable_is_a_usage_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without the capabilities, `--net netns` exits 2 with one line and creates nothing."""
    import jepsen_like.__main__ as cli

    monkeypatch.setattr(cli, "check_netns", lambda: "needs root (euid 1000)")
    run_dir = tmp_path / "run"
    code = main(["run", "--net", "netns", "--time-limit", "10", "--dir", str(run_dir)])
    assert code == 2
    assert not run_dir.exists()


def test_clean_leftovers_reports_a_newer_cluster_json(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A dead run whose cluster.json a newer mqcluster wrote: the clean-up reports it as an
    error and still removes the run's network objects (it used to raise FORMAT_TOO_NEW and
    leave them)."""
    from jepsen_like import netns

    cluster_dir = tmp_path / "cluster"
    cluster_dir.mkdir()
    (cluster_dir / "cluster.json").write_text(json.dumps({"version": 99}))
    removed: list[list[str]] = []
    monkeypatch.setattr(netns, "STATE_DIR", tmp_path / "state")
    monkeypatch.setattr(netns, "leftovers", lambda: {"r1": [f"{NS_PREFIX}r1a"]})
    monkeypatch.setattr(netns, "_run_alive", lambda rid: False)
    monkeypatch.setattr(netns, "_run_state", lambda rid: (0, str(cluster_dir)))
    monkeypatch.setattr(netns, "_remove", lambda ns, links: removed.append(ns) or [])
    names, errors = netns.clean_leftovers()
    assert names == [f"{NS_PREFIX}r1a"] and removed == [[f"{NS_PREFIX}r1a"]]
    assert len(errors) == 1 and "version 99" in errors[0], errors
