"""bench.compare's table: per in-flight level, each tree's median over rounds and the ratio."""

from __future__ import annotations

from bench.compare import _table


def _case(in_flight: int, rate: float, p50: float) -> dict[str, float]:
    return {"in_flight": in_flight, "messages_per_s": rate, "p50_ms": p50}


def test_medians_over_rounds_and_the_after_over_before_ratio() -> None:
    rows = {
        "before": [
            [_case(1, 100, 2.0), _case(16, 1000, 3.0)],
            [_case(1, 300, 4.0), _case(16, 900, 5.0)],
            [_case(1, 200, 3.0), _case(16, 1100, 4.0)],
        ],
        "after": [
            [_case(1, 250, 1.0), _case(16, 2000, 2.0)],
            [_case(1, 150, 1.0), _case(16, 1800, 2.0)],
            [_case(1, 100, 1.0), _case(16, 2200, 2.0)],
        ],
    }
    lines = _table(rows, {"before": "before a", "after": "after b"})
    assert lines[0].startswith("| in flight | before a msg/s")
    assert lines[2] == "| 1 | 200 (100, 300, 200) | 3.00 | 150 (250, 150, 100) | 1.00 | 0.75x |"
    assert (
        lines[3]
        == "| 16 | 1,000 (1,000, 900, 1,100) | 4.00 | 2,000 (2,000, 1,800, 2,200) | 2.00 | 2.00x |"
    )
