"""bench.backlog's arithmetic: the steps, the growth per million and its extrapolation, the
disk bound, what a node's log says about its open, the report of a whole result."""

from __future__ import annotations

import argparse
import os
import time
from datetime import datetime
from typing import Any

import pytest

from bench import backlog as bl


def test_step_targets_end_at_the_count_in_batch_multiples() -> None:
    assert bl.step_targets(1_000_000, 4) == [249_856, 499_968, 749_824, 1_000_000]
    assert all(t % bl.FILL_BATCH == 0 for t in bl.step_targets(1_000_000, 4)[:-1])
    # Fewer messages than steps of a batch each: one batch a step at most.
    assert bl.step_targets(600, 10) == [256, 600]
    assert bl.step_targets(100, 3) == [100]


def test_slope_per_million_is_the_least_squares_slope() -> None:
    points = [(1_000_000, 50.0), (2_000_000, 60.0), (3_000_000, 70.0)]
    assert bl.slope_per_million(points) == pytest.approx(10.0)
    assert bl.extrapolate(points, 30_000_000) == pytest.approx(340.0)
    # Flat memory extrapolates flat; noise around a flat line gives a slope near 0.
    flat = [(1_000_000, 80.0), (2_000_000, 82.0), (3_000_000, 80.0), (4_000_000, 82.0)]
    assert abs(bl.slope_per_million(flat) or 0) < 1.0
    assert bl.slope_per_million([(5, 1.0)]) is None
    assert bl.slope_per_million([(5, 1.0), (5, 2.0)]) is None
    assert bl.extrapolate([(5, 1.0)], 10) is None


def test_fits_disk_projects_the_measured_bytes_per_message() -> None:
    # 1,000 messages took 1 MB: 10,000 take 10 MB.
    assert bl.fits_disk(1_000, 1_000_000, 10_000, 10e6)
    assert not bl.fits_disk(1_000, 1_000_000, 10_001, 10e6)
    assert bl.fits_disk(0, 123, 10**9, 1.0)  # nothing measured yet: the estimate decides
    estimate = bl.estimated_disk_bytes(30_000_000, 128)
    assert 30e9 < estimate < 40e9  # the backlog: more than this machine's 10 GB


def _line(t: float, text: str) -> str:
    stamp = datetime.fromtimestamp(t)
    return f"{stamp:%Y-%m-%d %H:%M:%S},{stamp.microsecond // 1000:03d} INFO {text}\n"


def test_how_opened_tells_a_snapshot_from_a_replay() -> None:
    loaded = bl.how_opened(
        "x INFO broker.state.machine broker state opened applied=348 topics=3 offsets=0\n"
    )
    assert loaded["loaded_snapshot"] and not loaded["rebuilt_from_log"]
    assert loaded["opened_at_applied"] == 348
    replayed = bl.how_opened(
        "x WARNING broker.state.machine rebuilding broker state from the commitlog "
        "reason='no snapshot' first_index=1\n"
        "x INFO broker.state.machine broker state opened applied=0 topics=0 offsets=0\n"
    )
    assert replayed["rebuilt_from_log"] and not replayed["loaded_snapshot"]
    assert replayed["rebuild_reason"] == "'no snapshot' first_index=1"
    assert bl.how_opened("")["opened_at_applied"] is None


def test_log_marks_time_the_first_line_and_the_open() -> None:
    t0 = time.time() - 100
    text = (
        _line(t0 + 2.5, "dledger.server.node node=n0 starting")
        + _line(t0 + 4.0, "broker.state.machine something")
        + _line(t0 + 6.25, "broker.state.machine broker state opened applied=7 topics=1")
    )
    marks = bl.log_marks(text, t0)
    assert marks["first_log_line_s"] == pytest.approx(2.5, abs=0.002)
    assert marks["state_opened_s"] == pytest.approx(6.25, abs=0.002)
    assert bl.log_marks("", t0) == {"first_log_line_s": None, "state_opened_s": None}


def _step(stored: int, anon: float, rate: float) -> dict[str, Any]:
    return {
        "stored": stored,
        "sent": stored,
        "seconds": 1.0,
        "messages_per_s": rate,
        "rss_anon_mb": {"n0": anon, "n1": anon + 1},
        "rss_file_mb": {"n0": 100.0, "n1": 100.0},
        "peak_rss_anon_mb": {"n0": anon + 5, "n1": anon + 6},
        "disk_bytes": stored * 600,
        "failed_calls": 0,
    }


def test_growth_leaves_the_first_step_out() -> None:
    # The first step holds the start-up's bounded costs (a jump); after it, 2 MB per million.
    steps = [_step(100_000, 90.0, 20_000)] + [
        _step(n * 1_000_000, 60.0 + 2 * n, 20_000) for n in (1, 2, 3)
    ]
    g = bl.growth(steps, 30_000_000)
    assert g["per_node"]["n0"]["rss_anon_mb_per_million"] == pytest.approx(2.0)
    assert g["per_node"]["n0"]["rss_anon_mb_at_target"] == pytest.approx(120.0)
    assert g["per_node"]["n1"]["rss_anon_mb_at_target"] == pytest.approx(121.0)
    assert g["disk_gb_per_million"] == pytest.approx(0.6)
    assert g["fill_rate_per_million"] == pytest.approx(0.0)


def test_markdown_reports_every_part() -> None:
    opened = {"loaded_snapshot": True, "opened_at_applied": 10, "rebuilt_from_log": False}
    marks = {"answers_s": 1.0, "applied_s": 1.5, "serving_s": 2.0}
    marks |= {"first_log_line_s": 0.8, "state_opened_s": 1.2}
    probe = {"messages_per_s": 10_000.0}
    result = {
        "args": {"messages": 1000, "size": 128, "flush": "ASYNC_FLUSH", "probe_in_flight": 256}
        | {"probe_seconds": 3.0},
        "started": "2026-11-29T01:00:00+00:00",
        "load_avg": (1.0, 2.0, 3.0),
        "fill_stopped": "",
        "steps": [_step(500, 50.0, 9_000), _step(1000, 51.0, 9_500)],
        "probe_empty": probe,
        "probe_end": {"messages_per_s": 9_500.0},
        "end_over_empty": 0.95,
        "restart_one": {"node": "n1", **marks, **opened},
        "restart_all": {"first_send_s": 3.0, "all_serving_s": 4.0, "nodes": {"n0": marks | opened}},
        "read": {"messages": 1000, "expected": 1000, "seconds": 0.5, "messages_per_s": 2000.0}
        | {"stored_mb_per_s": 0.5, "body_mb_per_s": 0.25}
        | {"leader_cpu_us_per_message": 1.834, "reader_cpu_us_per_message": None},
        "memory_empty": {"n0": 40.0},
        "memory_after_restart_one": {"n0": 45.0},
        "memory_after_restart_all": {"n0": 44.0},
    }
    result["growth"] = bl.growth(result["steps"], 30_000_000)
    md = bl.markdown(result)
    assert md.startswith("# A deep backlog")
    assert "| 1,000 | 9,500 | n0 51, n1 52 |" in md
    assert "**0.95x**" in md and "**serving 2.0 s**" in md and "**4.0 s**" in md
    assert "loaded its snapshot at applied index 10" in md
    assert "CPU per message: the leader 1.83 us, the reader - us" in md


def test_process_cpu_is_read_from_proc() -> None:
    spent = time.process_time()
    got = bl.process_cpu_s(os.getpid())
    assert got is not None and abs(got - spent) < 0.5  # clock ticks of 10 ms, other threads
    assert bl.process_cpu_s(None) is None


def _args(**over: Any) -> argparse.Namespace:
    a = bl._parser().parse_args([])
    for k, v in over.items():
        setattr(a, k, v)
    return a


def test_check_args_bounds_every_figure() -> None:
    assert bl.check_args(_args()) == ""
    assert "--messages" in bl.check_args(_args(messages=bl.MAX_MESSAGES + 1))
    assert "--messages" in bl.check_args(_args(messages=0))
    assert "--size" in bl.check_args(_args(size=0))
    assert "--steps" in bl.check_args(_args(steps=bl.MAX_STEPS + 1))
    assert "--fill-seconds" in bl.check_args(_args(fill_seconds=0))
    assert "--probe-seconds" in bl.check_args(_args(probe_seconds=61))
    assert "--max-disk-gb" in bl.check_args(_args(max_disk_gb=0))


def test_node_env_names_one_node_of_the_group() -> None:
    """--node-env (a native heap profiler's preload on one node): per node, and refused
    with the item named when it is not NODE:KEY=VALUE of a node the group has."""
    envs = bl.parse_node_env(["n1:LD_PRELOAD=/x.so", "n1:OUT=/tmp/a=b", "n2:K="])
    assert envs == {"n1": {"LD_PRELOAD": "/x.so", "OUT": "/tmp/a=b"}, "n2": {"K": ""}}
    for bad in ("n3:K=V", "n1K=V", "n1:K", "n1:=V"):
        with pytest.raises(ValueError, match="NODE:KEY=VALUE"):
            bl.parse_node_env([bad])
