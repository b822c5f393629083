"""The shipped Prometheus alert rules and Grafana dashboard (deploy/prometheus, deploy/grafana;
docs/METRICS.md "Alert rules" and "Grafana dashboard"), checked with the real Prometheus
tooling: `promtool check rules`, `promtool test rules` on the fixtures of every rule, and every
PromQL expression of the dashboard parsed by promtool (as recording rules of a temporary file).
Every metric they name must be documented in docs/METRICS.md.

promtool is Debian's `prometheus` package (`make system-deps` installs it as root, as CI runs):
missing as root, the tests fail; missing otherwise, they are skipped saying so."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "deploy" / "prometheus" / "raftmq-alerts.yml"
RULE_TESTS = ROOT / "deploy" / "prometheus" / "tests"
DASHBOARD = ROOT / "deploy" / "grafana" / "raftmq-overview.json"
METRICS_DOC = ROOT / "docs" / "METRICS.md"
# promtool parses a few files: seconds, even on a loaded machine.
PROMTOOL_TIMEOUT_S = 120
# A metric name of the project's (or prometheus_client's process collector).
METRIC_NAME = re.compile(r"\b((?:raftmq|process)_[a-z0-9_]+)\b")
# What a histogram's series add to its family's name.
HISTOGRAM_SUFFIXES = ("_bucket", "_count", "_sum")
# Grafana's variables, replaced by what they stand for so that promtool can parse the query.
GRAFANA_VARIABLES = {"$__rate_interval": "5m", "$cluster": ".+", "$broker": ".+"}


def promtool() -> str:
    found = shutil.which("promtool")
    if found is not None:
        return found
    if os.geteuid() == 0 and shutil.which("apt-get"):
        pytest.fail("promtool is missing: `make system-deps` installs Debian's prometheus package")
    pytest.skip(
        "needs promtool (Debian's prometheus package; make system-deps installs it as root)"
    )


def run_promtool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [promtool(), *args],
        capture_output=True,
        text=True,
        timeout=PROMTOOL_TIMEOUT_S,
        check=False,
    )


def documented_metrics() -> set[str]:
    """Every metric name docs/METRICS.md lists (in backquotes)."""
    return set(re.findall(r"`((?:raftmq|process)_[a-z0-9_]+)`", METRICS_DOC.read_text()))


def undocumented(text: str) -> set[str]:
    """The metric names in ``text`` that docs/METRICS.md does not list (a histogram's series by
    its family's name; ``process_*`` as the doc lists it, as a whole)."""
    doc = documented_metrics()
    out = set()
    for name in METRIC_NAME.findall(text):
        family = next(
            (name.removesuffix(s) for s in HISTOGRAM_SUFFIXES if name.removesuffix(s) in doc), name
        )
        if family not in doc and not family.startswith("process_"):
            out.add(family)
    return out


def test_the_alert_rules_are_valid() -> None:
    got = run_promtool("check", "rules", str(RULES))
    assert got.returncode == 0, got.stdout + got.stderr
    assert "SUCCESS" in got.stdout


def test_the_alert_rules_pass_their_unit_tests() -> None:
    fixtures = sorted(str(p) for p in RULE_TESTS.glob("*.yml"))
    assert fixtures
    got = run_promtool("test", "rules", *fixtures)
    assert got.returncode == 0, got.stdout + got.stderr


def alert_names() -> list[str]:
    return re.findall(r"^\s+- alert: (\w+)$", RULES.read_text(), re.MULTILINE)


def test_every_rule_has_a_fixture_where_it_fires_and_names_its_group() -> None:
    rules = alert_names()
    assert len(rules) >= 10 and len(rules) == len(set(rules))
    fixtures = "".join(p.read_text() for p in RULE_TESTS.glob("*.yml"))
    firing = set(re.findall(r"alertname: (\w+)\n\s+exp_alerts:\n\s+- exp_labels", fixtures))
    assert set(rules) - firing == set(), "rules without a firing fixture"
    # The issue's list: no leader, leader changes, follower lag, disk, corruption and scrub,
    # refusals, consumer lag, dead letters; and a node down.
    for needed in (
        "RaftMQNoLeader",
        "RaftMQMemberDown",
        "RaftMQFrequentLeaderChanges",
        "RaftMQFollowerLagging",
        "RaftMQDiskNearWatermark",
        "RaftMQDiskFullRefusals",
        "RaftMQCorruptionFound",
        "RaftMQScrubMismatch",
        "RaftMQSecurityRefusals",
        "RaftMQConsumerLagHigh",
        "RaftMQDeadLetters",
    ):
        assert needed in rules
    # Each rule's text: `for:`, a severity, a summary naming what it is about.
    blocks = re.split(r"\n\s+- alert: ", RULES.read_text())[1:]
    for block in blocks:
        name = block.split("\n", 1)[0]
        assert re.search(r"\n\s+for: \d+[smh]\n", block), name
        assert re.search(r"severity: (warning|critical)", block), name
        summary = re.search(r"summary: (.*)", block)
        assert summary is not None, name
        about = summary.group(1)
        if "instance" not in about:  # the per-target and NameServer rules
            assert "$labels.cluster" in about and "$labels.broker" in about, name


def test_the_rules_name_only_documented_metrics() -> None:
    assert undocumented(RULES.read_text()) == set()


def dashboard() -> dict[str, Any]:
    doc = json.loads(DASHBOARD.read_text())
    assert isinstance(doc, dict)
    return doc


def panel_exprs(doc: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """(panel title, PromQL) of every target of every panel, rows' inner panels included."""
    for panel in doc["panels"]:
        for inner in [panel, *panel.get("panels", [])]:
            for target in inner.get("targets", []):
                yield inner["title"], target["expr"]


def variable_selectors(doc: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """(variable, the series selector of its label_values query)."""
    for var in doc["templating"]["list"]:
        if var["type"] != "query":
            continue
        query = var["query"]["query"] if isinstance(var["query"], dict) else var["query"]
        found = re.fullmatch(r"label_values\((.+), (\w+)\)", query)
        assert found is not None, query
        yield var["name"], found.group(1)


def concrete(expr: str) -> str:
    for name, value in GRAFANA_VARIABLES.items():
        expr = expr.replace(name, value)
    assert "$" not in expr, f"a Grafana variable the test does not know: {expr}"
    return expr


def test_the_dashboard_covers_the_issue_and_has_cluster_and_broker_variables() -> None:
    doc = dashboard()
    assert doc["uid"] and doc["title"]
    names = [v["name"] for v in doc["templating"]["list"]]
    assert {"cluster", "broker"} <= set(names)
    text = json.dumps([e for _, e in panel_exprs(doc)])
    for metric in (
        "raftmq_raft_role",
        "raftmq_raft_term",
        "raftmq_raft_commit_index",
        "raftmq_raft_applied_index",
        "raftmq_raft_follower_lag_entries",
        "raftmq_broker_sent_messages_total",
        "raftmq_broker_pulled_messages_total",
        "raftmq_broker_send_duration_seconds_bucket",
        "raftmq_broker_pull_duration_seconds_bucket",
        "raftmq_broker_consumer_lag_messages",
        "raftmq_broker_dead_lettered_messages_total",
        "raftmq_store_disk_used_bytes",
        "raftmq_corruption_found_total",
        "raftmq_scrub_mismatches_total",
        "raftmq_security_refusals_total",
    ):
        assert metric in text, metric
    for title, expr in panel_exprs(doc):
        assert 'cluster=~"$cluster"' in expr and 'broker=~"$broker"' in expr, title


def test_every_dashboard_expression_parses_and_names_documented_metrics(tmp_path: Path) -> None:
    doc = dashboard()
    exprs = [concrete(e) for _, e in panel_exprs(doc)]
    exprs += [concrete(s) for _, s in variable_selectors(doc)]
    assert len(exprs) >= 20
    rules = {
        "groups": [
            {
                "name": "dashboard",
                "rules": [
                    {"record": f"raftmq_dashboard:expr_{i}", "expr": e} for i, e in enumerate(exprs)
                ],
            }
        ]
    }
    path = tmp_path / "dashboard-rules.yml"
    path.write_text(json.dumps(rules, indent=1))  # JSON is YAML
    got = run_promtool("check", "rules", str(path))
    assert got.returncode == 0, got.stdout + got.stderr
    assert f"{len(exprs)} rules found" in got.stdout
    assert undocumented("\n".join(exprs)) == set()


def test_a_broken_expression_is_caught(tmp_path: Path) -> None:
    """The check above can fail: promtool refuses what does not parse."""
    path = tmp_path / "bad.yml"
    path.write_text(
        json.dumps({"groups": [{"name": "x", "rules": [{"record": "x:y", "expr": "sum by (a"}]}]})
    )
    assert run_promtool("check", "rules", str(path)).returncode != 0
    assert undocumented("rate(raftmq_no_such_metric_total[5m])") == {"raftmq_no_such_metric_total"}
