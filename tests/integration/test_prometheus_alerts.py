"""A real Prometheus (Debian's `prometheus` package) scraping a live 3-node group with the
shipped alert rules (deploy/prometheus/raftmq-alerts.yml): with every node up no raftmq alert
fires; once a node is killed (SIGKILL, by its PID), RaftMQMemberDown fires, labelled with the
group's cluster and broker, and RaftMQTargetDown names the dead node's address (issue #35).
Before the kill, every query of the Grafana dashboard (deploy/grafana) runs on it.

The test scrapes and evaluates every second and, in its copy of the rules, shortens every
`for:` to FOR_S seconds: the shipped minute would make the test wait a minute for nothing but
the clock. Everything else in the rules is as shipped."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from support import wait_for

from mqcluster.cluster import LocalCluster
from prockit.processes import free_ports

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "deploy" / "prometheus" / "raftmq-alerts.yml"
DASHBOARD = ROOT / "deploy" / "grafana" / "raftmq-overview.json"
# Grafana's variables, as Grafana fills them with "All" selected.
GRAFANA_VARIABLES = {"$__rate_interval": "1m", "$cluster": ".+", "$broker": ".+"}
# Dashboard panels that show something for any healthy idle group.
ALWAYS_SHOWN = ("Leader", "Members answering", "Term", "Commit and apply index", "Disk used")
# Scrape and rule evaluation every second (Prometheus' usual is 15 s to a minute).
INTERVAL = "1s"
# Every rule's `for:` in the test's copy (the shipped ones are a minute or more).
FOR_S = 3
# Prometheus starting and scraping all three nodes; the alert firing after the kill (the new
# leader's election, then FOR_S seconds pending, at one evaluation a second): deadlines for a
# loaded 2-core machine.
READY_DEADLINE_S = 60.0
FIRING_DEADLINE_S = 60.0
STOP_DEADLINE_S = 10.0
# A healthy group's member alerts clear at the first evaluation after every node was scraped:
# a few evaluations' time.
HEALTHY_DEADLINE_S = 15.0
JOB = "raftmq"


def prometheus_binary() -> str:
    found = shutil.which("prometheus")
    if found is not None:
        return found
    if os.geteuid() == 0 and shutil.which("apt-get"):
        pytest.fail("prometheus is missing: `make system-deps` installs Debian's package")
    pytest.skip("needs prometheus (Debian's prometheus package: make system-deps, as root)")


def shortened_rules(dest: Path) -> Path:
    text, count = re.subn(r"(?m)^(\s+)for: \d+[smh]$", rf"\1for: {FOR_S}s", RULES.read_text())
    assert count >= 10, "every rule has a for:"
    dest.write_text(text)
    return dest


def config(cluster: LocalCluster, rules: Path) -> str:
    """prometheus.yml for the group's /metrics (JSON, which is YAML)."""
    targets = [n.metrics_url.split("/")[2] for n in cluster.nodes]
    return json.dumps(
        {
            "global": {"scrape_interval": INTERVAL, "evaluation_interval": INTERVAL},
            "rule_files": [str(rules)],
            "scrape_configs": [
                {
                    "job_name": JOB,
                    "scrape_timeout": INTERVAL,
                    "static_configs": [{"targets": targets}],
                }
            ],
        },
        indent=1,
    )


class Prometheus:
    """The Prometheus server this test started, and its HTTP API."""

    def __init__(self, proc: subprocess.Popen[bytes], port: int, log: Path) -> None:
        self.proc = proc
        self.base = f"http://127.0.0.1:{port}"
        self.log = log

    def api(self, path: str, **params: str) -> Any:
        """The ``data`` of an API answer; None while it does not answer."""
        if self.proc.poll() is not None:
            raise AssertionError(f"prometheus exited: {self.log.read_text()[-3000:]}")
        url = f"{self.base}/api/v1/{path}"
        if params:
            url += "?" + urllib.parse.urlencode(params)
        try:
            with urllib.request.urlopen(url, timeout=5) as resp:
                body = json.loads(resp.read())
        except OSError:
            return None
        assert body["status"] == "success", body
        return body["data"]

    def alerts(self) -> list[dict[str, Any]]:
        data = self.api("alerts")
        return [] if data is None else list(data["alerts"])


@pytest.fixture
def prometheus_for(tmp_path: Path) -> Iterator[Callable[[LocalCluster], Prometheus]]:
    """Starts a Prometheus for a group (once); stopped by its PID when the test ends."""
    binary = prometheus_binary()
    started: list[Prometheus] = []

    def start(cluster: LocalCluster) -> Prometheus:
        work = tmp_path / "prometheus"
        work.mkdir()
        cfg = work / "prometheus.yml"
        cfg.write_text(config(cluster, shortened_rules(work / "raftmq-alerts.yml")))
        (port,) = free_ports(1)
        log = work / "prometheus.log"
        with log.open("wb") as out:
            proc = subprocess.Popen(
                [
                    binary,
                    f"--config.file={cfg}",
                    f"--storage.tsdb.path={work / 'data'}",
                    f"--web.listen-address=127.0.0.1:{port}",
                    "--log.level=warn",
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        started.append(Prometheus(proc, port, log))
        return started[-1]

    yield start
    for p in started:
        if p.proc.poll() is None:
            os.kill(p.proc.pid, signal.SIGTERM)
            try:
                p.proc.wait(STOP_DEADLINE_S)
            except subprocess.TimeoutExpired:
                os.kill(p.proc.pid, signal.SIGKILL)
                p.proc.wait(STOP_DEADLINE_S)


def all_scraped(prom: Prometheus, count: int) -> Callable[[], bool]:
    """A condition: Prometheus has every node's raftmq_node_info and one leader."""

    def check() -> bool:
        info = prom.api("query", query="count(raftmq_node_info)")
        leaders = prom.api("query", query='sum(raftmq_raft_role{role="leader"})')
        return bool(
            info
            and leaders
            and info["result"]
            and leaders["result"]
            and float(info["result"][0]["value"][1]) == count
            and float(leaders["result"][0]["value"][1]) == 1
        )

    return check


def rules_evaluated(prom: Prometheus) -> bool:
    """Whether every rule of the rules file has been evaluated at least once."""
    data = prom.api("rules")
    groups = [] if data is None else data["groups"]
    rules = [r for g in groups for r in g["rules"]]
    return len(rules) >= 10 and all(r.get("evaluationTime", 0) > 0 for r in rules)


def dashboard_queries() -> list[tuple[str, str]]:
    """(panel title, PromQL with the variables filled) of every panel of the dashboard."""
    out = []
    for panel in json.loads(DASHBOARD.read_text())["panels"]:
        for target in panel.get("targets", []):
            expr = target["expr"]
            for name, value in GRAFANA_VARIABLES.items():
                expr = expr.replace(name, value)
            out.append((panel["title"], expr))
    return out


def check_dashboard(prom: Prometheus) -> None:
    """Every dashboard query runs on the live Prometheus; the basic panels show the group."""
    shown = set()
    for title, expr in dashboard_queries():
        data = prom.api("query", query=expr)
        assert data is not None, (title, expr)
        if data["result"]:
            shown.add(title)
    assert set(ALWAYS_SHOWN) <= shown, set(ALWAYS_SHOWN) - shown


def firing(prom: Prometheus, name: str) -> list[dict[str, Any]]:
    return [a for a in prom.alerts() if a["labels"]["alertname"] == name and a["state"] == "firing"]


def test_a_real_prometheus_fires_member_down_when_a_node_is_killed(
    local_group: Callable[..., LocalCluster],
    prometheus_for: Callable[[LocalCluster], Prometheus],
) -> None:
    cluster = local_group(3)
    assert all(n.metrics_port for n in cluster.nodes)
    prom = prometheus_for(cluster)
    wait_for(all_scraped(prom, 3), READY_DEADLINE_S, "prometheus scraping 3 nodes, one leader")
    wait_for(lambda: rules_evaluated(prom), READY_DEADLINE_S, "every rule evaluated")
    # The group healthy: neither alert pending nor firing once every node was scraped (an
    # evaluation before a node's first scrape may have left one pending; the next clears it.
    # Others may fire: a term change at start is not this test's business).
    watched = {"RaftMQMemberDown", "RaftMQTargetDown"}
    wait_for(
        lambda: not [a for a in prom.alerts() if a["labels"]["alertname"] in watched],
        HEALTHY_DEADLINE_S,
        f"no {watched} alert with every node up",
    )

    check_dashboard(prom)

    victim = cluster.node(cluster.wait_leader())
    pid = cluster.pid(victim)
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    address = victim.metrics_url.split("/")[2]

    wait_for(
        lambda: bool(firing(prom, "RaftMQMemberDown")) and bool(firing(prom, "RaftMQTargetDown")),
        FIRING_DEADLINE_S,
        f"RaftMQMemberDown and RaftMQTargetDown firing after {victim.node_id} was killed",
    )
    (down,) = firing(prom, "RaftMQMemberDown")
    assert down["labels"] == {
        "alertname": "RaftMQMemberDown",
        "cluster": "DefaultCluster",
        "broker": cluster.group,
        "severity": "warning",
    }
    assert float(down["value"]) == 3  # the new leader's peers and itself
    assert f"DefaultCluster/{cluster.group}" in down["annotations"]["summary"]
    (target,) = firing(prom, "RaftMQTargetDown")
    assert target["labels"]["instance"] == address and target["labels"]["job"] == JOB
