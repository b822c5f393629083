"""bench.clientcpu's arithmetic: the loadgen's CPU of the long run minus the short one's, per
extra send (its start-up drops out), the medians over rounds and the ratio."""

from __future__ import annotations

from typing import Any

from bench.clientcpu import _table, cpu_per_send_us


def _case(in_flight: int, long_run: tuple[int, float], short_run: tuple[int, float]) -> Any:
    return {
        "in_flight": in_flight,
        "runs": [
            {"seconds": 16.0, "sent": long_run[0], "cpu_s": long_run[1]},
            {"seconds": 2.0, "sent": short_run[0], "cpu_s": short_run[1]},
        ],
    }


def test_the_start_up_drops_out() -> None:
    # 1.0 s of start-up in both runs, 500 us per send.
    assert cpu_per_send_us(_case(1, (5000, 1.0 + 2.5), (600, 1.0 + 0.3))["runs"]) == 500.0


def test_too_few_extra_sends_give_no_figure() -> None:
    assert cpu_per_send_us(_case(1, (150, 2.0), (100, 1.0))["runs"]) is None


def test_medians_over_rounds_and_the_ratio() -> None:
    rows = {
        "before": [[_case(1, (1600, 1.6), (200, 0.2))], [_case(1, (1700, 2.0), (300, 0.6))]],
        "after": [[_case(1, (3200, 1.6), (400, 0.2))], [_case(1, (50, 1.0), (40, 0.9))]],
    }
    lines = _table(rows, {"before": "before a", "after": "after b"})
    assert lines[0].startswith("| in flight | before a: CPU us per send")
    assert lines[2] == "| 1 | 1,000 (1,000, 1,000) | 103 | 500 (500, -) | 102 | 0.50x |"
