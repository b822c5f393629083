"""bench.catchup's arithmetic and report: the peak of a window and when it came, the
arguments it refuses, the table of a result."""

from __future__ import annotations

from bench import catchup as cu
from bench.memory import Mem


def _mem(anon_mib: int) -> Mem:
    return Mem(anon_mib * 1024, 0)


def test_window_figures_take_the_peak_its_time_and_the_last_sample_of_the_window() -> None:
    samples = [
        (9.0, {"n0": _mem(500)}),  # before the window: not counted
        (10.0, {"n0": _mem(80), "n1": _mem(90)}),
        (10.5, {"n0": _mem(140), "n1": _mem(95)}),
        (11.0, {"n0": _mem(100)}),  # n1 not read at this instant
        (12.5, {"n0": _mem(600)}),  # after the window
    ]
    got = cu.window_figures(samples, 10.0, 11.0)
    assert got["n0"] == {"peak_mb": 140.0, "peak_at_s": 0.5, "last_mb": 100.0}
    assert got["n1"] == {"peak_mb": 95.0, "peak_at_s": 0.5, "last_mb": 95.0}
    assert cu.window_figures(samples, 20.0, 30.0) == {}


def test_check_args_refuses_what_the_bounds_do_not_allow() -> None:
    ok = cu._parser().parse_args([])
    assert cu.check_args(ok) == ""
    for argv in (
        ["--messages", "0"],
        ["--messages", str(cu.MAX_MESSAGES + 1)],
        ["--size", str(cu.MAX_SIZE + 1)],
        ["--messages", "3000000", "--size", "65536"],  # over MAX_FILL_BYTES
        ["--rounds", "0"],
        ["--sample-ms", "1"],
        ["--settle-seconds", "-1"],
        ["--node-env", "n9:A=B"],
    ):
        assert cu.check_args(cu._parser().parse_args(argv)) != "", argv


def test_markdown_has_a_row_per_round_with_each_role() -> None:
    res = {
        "leader": "n1",
        "follower": "n0",
        "catch_up_s": 4.0,
        "stored": 1000,
        "fill_s": 2.0,
        "load_avg": (1.5, 1.0, 1.0),
        "before_mb": {"n1": 80.0, "n2": 79.0},
        "settled_mb": {"n0": 90.0, "n1": 85.0, "n2": 78.0},
        "fill_peak_mb": {"n1": 100.0, "n2": 99.0},
        "catch_up": {
            "n0": {"peak_mb": 101.0, "peak_at_s": 3.0, "last_mb": 99.0},
            "n1": {"peak_mb": 141.0, "peak_at_s": 2.0, "last_mb": 90.0},
            "n2": {"peak_mb": 79.0, "peak_at_s": 0.0, "last_mb": 79.0},
        },
    }
    args = vars(cu._parser().parse_args([]))
    text = cu.markdown(
        {"stamp": "T", "args": args, "trees": {"this": "/x"}, "rounds": {"this": [res]}}
    )
    assert "| this | 1 | 4.0 | 80 / 141 / 85 | 0 / 101 / 90 | 79 / 79 / 78 | 1.5 |" in text
    assert "n1(L) 80->141@2.0s->85" in cu.summary_line(res)
