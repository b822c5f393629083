"""The paired statistics of mqbench's metrics comparison (issue #22): pair ratios, the sign-test
interval of their median (ranks checked against the published sign-test table), the verdict
against a 2 % bound, the per-in-flight summary of rounds, its Markdown and targets, and the
load generator's checks of a --serve round."""

from __future__ import annotations

import http.server
import json
import math
import random
import threading
import time
import types
from typing import Any

import pytest

from bench import loadgen, metricscost, pairstats, report

# Two-sided 95 % sign test, the largest count of values below the median still rejected: the
# interval runs from rank (critical + 1) to rank n - critical (published tables).
SIGN_TEST_CRITICAL_5PCT = {6: 0, 8: 0, 10: 1, 20: 5, 30: 9, 60: 21}


def test_pair_ratios_keep_each_pair_together_and_drop_empty_sides() -> None:
    # Sorting each side on its own would give 2/1 and 4/8: the pairs are what is compared.
    assert pairstats.pair_ratios([4.0, 2.0, 0.0], [1.0, 8.0, 3.0]) == [4.0, 0.25]
    with pytest.raises(ValueError, match="not pairs"):
        pairstats.pair_ratios([1.0], [1.0, 2.0])


@pytest.mark.parametrize(("n", "critical"), sorted(SIGN_TEST_CRITICAL_5PCT.items()))
def test_sign_rank_matches_the_sign_test_table(n: int, critical: int) -> None:
    rank = pairstats.sign_rank(n)
    assert rank is not None
    k, coverage = rank
    assert k == critical + 1
    below = sum(math.comb(n, j) for j in range(k)) / 2**n
    assert coverage == pytest.approx(1 - 2 * below) and coverage >= 0.95


def test_too_few_pairs_give_no_interval() -> None:
    assert pairstats.sign_rank(5) is None  # 2 / 32 > 5 %: not even the extremes will do
    ci = pairstats.median_ci([1.0, 2.0, 3.0])
    assert ci == {"n": 3, "median": 2.0, "low": None, "high": None, "coverage": None}


def test_median_ci_of_known_values() -> None:
    values = [float(v) for v in range(1, 11)]
    random.Random(7).shuffle(values)  # the order the pairs came in does not matter
    assert pairstats.median_ci(values) == {
        "n": 10,
        "median": 5.5,
        "low": 2.0,
        "high": 9.0,
        "coverage": 1 - 22 / 1024,
    }
    twenty = [1.0 + i / 100 for i in range(20)]
    ci = pairstats.median_ci(twenty[::-1])
    assert (ci["low"], ci["high"]) == (twenty[5], twenty[14])


def test_an_outlier_pair_does_not_stretch_the_interval() -> None:
    ratios = [0.99, 1.0, 1.01] * 4
    wild = [*ratios[:-1], 5.0]
    assert pairstats.median_ci(wild)["high"] == pairstats.median_ci(ratios)["high"]


@pytest.mark.parametrize(
    ("low", "high", "bound", "higher_is_cost", "expected"),
    [
        (0.99, 1.015, 1.02, True, "within"),
        (1.021, 1.05, 1.02, True, "beyond"),
        (1.0, 1.03, 1.02, True, "undecided"),
        (0.981, 1.01, 0.98, False, "within"),
        (0.9, 0.97, 0.98, False, "beyond"),
        (0.97, 1.01, 0.98, False, "undecided"),
        (None, None, 0.98, False, "undecided"),
    ],
)
def test_verdict_needs_the_whole_interval_on_one_side(
    low: float | None, high: float | None, bound: float, higher_is_cost: bool, expected: str
) -> None:
    assert pairstats.verdict({"low": low, "high": high}, bound, higher_is_cost) == expected


def _case(side: str, pair: int, n: int, rate: float, cpu_us: float) -> dict[str, Any]:
    return {
        "metrics": side,
        "pair": pair,
        "asked_in_flight": n,
        "messages_per_s": rate,
        "cpu_us_per_message": cpu_us,
        "load_avg_1m": 3.0 + pair,
    }


def _cases() -> list[dict[str, Any]]:
    """8 pairs at 16 in flight whose rates drift 10x over the run (a loaded machine) while on
    costs exactly 1 % more CPU per message and sends 1 % less than off in every pair."""
    cases = []
    for i in range(8):
        base = 1000.0 * (1 + i)
        cases.append(_case("off", i, 16, base, 100.0 * (1 + i % 3)))
        cases.append(_case("on", i, 16, base * 0.99, 101.0 * (1 + i % 3)))
    return cases[::-1]  # any order


def test_summary_rests_on_the_pairs_not_on_each_sides_spread() -> None:
    (s,) = metricscost.summary(_cases(), [16])
    assert s["pairs"] == 8 and s["load_avg_1m"] == [3.0, 10.0]
    assert s["rate"]["median"] == pytest.approx(0.99)
    assert s["rate"]["low"] == pytest.approx(0.99) == s["rate"]["high"]
    assert s["cpu_per_message"]["median"] == pytest.approx(1.01)
    assert s["rate"]["on_median"] == 4500.0 * 0.99 and s["rate"]["off_median"] == 4500.0
    assert pairstats.verdict(s["cpu_per_message"], 1.02, True) == "within"


def _result() -> dict[str, Any]:
    return {
        "metrics": {
            "conditions": "test conditions",
            "message_bytes": 1024,
            "flush": "ASYNC_FLUSH",
            "pairs": 8,
            "seconds_per_round": 2.0,
            "summary": metricscost.summary(_cases(), [16]),
        }
    }


def test_targets_and_markdown_show_the_interval() -> None:
    rows = {r["figure"]: r for r in report.ratios(_result())}
    rate = rows["metrics on / off msg/s, median of pair ratios (worst in-flight count)"]
    cpu = rows["metrics on / off CPU per message, 95 % upper bound (worst in-flight count)"]
    assert rate["value"] == pytest.approx(0.99) and rate["met"] is True
    assert cpu["value"] == pytest.approx(1.01) and cpu["met"] is True
    text = "\n".join(report._metrics_lines(_result()["metrics"]))
    assert "| 16 | CPU us/msg | 8 |" in text and "1.010 - 1.010 (99.2 %) | within |" in text
    assert "3.0 - 10.0" in text


def test_targets_unmeasured_without_an_interval() -> None:
    few = [c for c in _cases() if c["pair"] < 3]
    result = {"metrics": {"summary": metricscost.summary(few, [16])}}
    rows = {r["figure"]: r for r in report.ratios(result)}
    assert (
        rows["metrics on / off CPU per message, 95 % upper bound (worst in-flight count)"]["met"]
        is None
    )


def _round(**kw: Any) -> str:
    return json.dumps({"in_flight": 8, "seconds": 2.0, "start_at": time.monotonic(), **kw})


def test_serve_round_accepts_a_round_and_refuses_every_bad_field() -> None:
    n, seconds, _ = loadgen.serve_round(_round())
    assert (n, seconds) == (8, 2.0)
    bad = [
        "[1, 2]",
        "not json",
        _round(in_flight=0),
        _round(in_flight=loadgen.SERVE_MAX_IN_FLIGHT + 1),
        _round(in_flight=1.5),
        _round(seconds=0),
        _round(seconds=loadgen.SERVE_MAX_SECONDS + 1),
        _round(start_at=time.monotonic() + loadgen.SERVE_MAX_LEAD_S + 5),
        _round(start_at="now"),
    ]
    for line in bad:
        with pytest.raises(ValueError):
            loadgen.serve_round(line)


class _Metrics(http.server.BaseHTTPRequestHandler):
    """An endpoint whose metrics cost 0.25 CPU seconds more at every request, in two parts."""

    served = 0

    def do_GET(self) -> None:
        _Metrics.served += 1
        own = 0.125 * _Metrics.served
        body = (
            b"x 1\n# TYPE raftmq_metrics_cpu_seconds counter\n"
            + f'raftmq_metrics_cpu_seconds_total{{part="collect"}} {own}\n'.encode()
            + f'raftmq_metrics_cpu_seconds_total{{part="serve"}} {own}\n'.encode()
            + b'raftmq_metrics_cpu_seconds_created{part="serve"} 1.7e9\n'
        )
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


def test_the_scraper_runs_across_rounds_and_each_on_round_counts_its_own_scrapes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _Metrics.served = 0
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Metrics)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/metrics"
    node = types.SimpleNamespace(metrics_port=1, metrics_url=url)
    cluster = types.SimpleNamespace(nodes=[node, node], namesrv=None)
    groups: Any = {"on": (cluster, None), "off": (cluster, None)}
    scraped_in_round = iter([0, 1, 0])  # scrapes the scraper makes while each round runs

    def fake_rounds(sides: dict[str, Any], n: int, s: float) -> dict[str, Any]:
        for _ in range(next(scraped_in_round)):
            scraper._scrape_all()
        return {k: {"messages_per_s": 1.0} for k in sides}

    monkeypatch.setattr(metricscost, "measured_rounds", fake_rounds)
    monkeypatch.setattr(metricscost, "group_pids", lambda cluster: [])
    try:
        # A minute apart: the one scrape at the start, then only the rounds' own.
        with metricscost.Scraper(cluster, 60.0) as scraper:
            while scraper.counts()[0] < 2:  # the first pass, one URL after the other
                time.sleep(0.01)
            cases = [metricscost._rounds(("off", "on"), groups, 16, 1.0, scraper) for _ in "abc"]
    finally:
        server.shutdown()
    # The first pass, the one round's, and one more at the end (what own_cost spans).
    assert scraper.interval_s == 60.0 and scraper.counts() == (6, 0)
    assert [c["on"]["scrapes"] for c in cases] == [0, 2, 0]
    assert all(c["off"]["scrapes"] == 0 for c in cases)
    # Both URLs are the one fake process, each request 0.25 s more; a pass sums its two
    # answers: the first pass (requests 1, 2) to the last (requests 5, 6).
    own = scraper.own_cost()
    assert own["metrics_cpu_s"] == pytest.approx(0.25 * (5 + 6) - 0.25 * (1 + 2))
    assert own["group_cpu_s"] == 0 and own["share"] is None  # no group processes here
    assert metricscost.own_cpu_s(b'raftmq_metrics_cpu_seconds_total{part="x"} 2.5\n') == 2.5
    assert metricscost.own_cpu_s(b"other 1\n") == 0.0


def _crossover_cases(bias: float, cost: float) -> list[dict[str, Any]]:
    """Two periods of 8 pairs at 16 in flight: group g1 needs ``bias`` times g0's CPU per
    message whatever it serves; serving metrics costs ``cost`` times the CPU. g1 serves in
    period 0, g0 in period 1 (as bench.__main__._metrics_period swaps them)."""
    rng = random.Random(7)
    cases = []
    for period, on_group in ((0, "g1"), (1, "g0")):
        for i in range(8):
            base = 100.0 * (1 + rng.random())  # the machine's drift, shared within a pair
            group = {"g0": 1.0, "g1": bias}
            off_group = "g0" if on_group == "g1" else "g1"
            on_cpu = base * group[on_group] * cost
            off_cpu = base * group[off_group]
            for side, cpu in (("on", on_cpu), ("off", off_cpu)):
                cases.append({**_case(side, i, 16, 1e6 / cpu, cpu), "period": period})
    return cases


def test_a_crossover_cancels_a_groups_own_advantage() -> None:
    cases = _crossover_cases(bias=0.96, cost=1.01)
    (s,) = metricscost.summary(cases, [16])
    cpu = s["cpu_per_message"]
    assert s["periods"] == 2 and s["pairs"] == 8
    assert cpu["median"] == pytest.approx(1.01) and cpu["high"] == pytest.approx(1.01)
    # Each period alone is off by the group's 4 %, one each way.
    low, high = cpu["period_medians"]
    assert low == pytest.approx(1.01 * 0.96) and high == pytest.approx(1.01 / 0.96)
    assert s["rate"]["median"] == pytest.approx(1 / 1.01)
    # One period alone reads the bias as the cost: 1.01 x 0.96 < 1, a "gain" from metrics.
    (alone,) = metricscost.summary([c for c in cases if c["period"] == 0], [16])
    assert alone["cpu_per_message"]["median"] == pytest.approx(0.9696)
    text = "\n".join(report._metrics_lines({**_result()["metrics"], "periods": 2, "summary": [s]}))
    assert "in each of 2 crossover periods" in text
    assert "16 in flight, CPU us/msg: each period's median 0.970, 1.052" in text


def test_crossover_units_pair_periods_two_by_two() -> None:
    assert metricscost.crossover_units([[4.0, 1.0], [1.0, 4.0, 9.0]]) == [2.0, 2.0]
    with pytest.raises(ValueError, match="even number"):
        metricscost.crossover_units([[1.0], [1.0], [1.0]])


@pytest.mark.parametrize("periods", [0, 3, 10])
def test_mqbench_refuses_odd_or_too_many_periods(periods: int) -> None:
    from bench.__main__ import _check_args, _parser

    a = _parser().parse_args(["--metrics-periods", str(periods)])
    assert "--metrics-periods must be 1 or even" in _check_args(a, [1024], [16])


def test_the_report_gives_the_metrics_own_cpu_share() -> None:
    sec = {
        **_result()["metrics"],
        "own_cpu": [
            {"metrics_cpu_s": 0.2, "group_cpu_s": 100.0, "share": 0.002, "scrapes": 40},
            {"metrics_cpu_s": None, "group_cpu_s": None, "share": None},  # nothing scraped
            {"metrics_cpu_s": 0.6, "group_cpu_s": 100.0, "share": 0.006, "scrapes": 40},
        ],
    }
    text = "\n".join(report._metrics_lines(sec))
    assert "serving 80 scrapes): 0.800 s of the group's 200.0 s = 0.400 %" in text
    assert "(each period: 0.200 %, 0.600 %)" in text
