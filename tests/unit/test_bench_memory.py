"""bench.memory: /proc/PID/status parsing, peaks and rest figures from samples, the sampler;
and the floor leader's acknowledgement bookkeeping (bench.floor._Fanout)."""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from bench import floor, memory
from bench.memory import Mem

STATUS = """\
Name:\tpython
VmPeak:\t  400000 kB
VmHWM:\t  150000 kB
VmRSS:\t  140000 kB
RssAnon:\t   40960 kB
RssFile:\t  102400 kB
RssShmem:\t       0 kB
Threads:\t12
"""


def test_parse_status_takes_the_memory_fields_in_kib() -> None:
    assert memory.parse_status(STATUS) == {"RssAnon": 40960, "RssFile": 102400}
    assert memory.parse_status("RssAnon:\tlots kB\nRssFile: 1 MB\n") == {}


def test_read_mem_of_this_process_and_of_a_gone_one() -> None:
    mine = memory.read_mem(os.getpid())
    assert mine is not None and mine.rss_anon_kib > 0 and mine.rss_file_kib > 0
    assert memory.read_mem(None) is None
    assert memory.read_mem(2**22 + 12345) is None  # above pid_max's default: never a process


def _samples() -> list[memory.Sample]:
    return [
        (1.0, {"n0": Mem(1024, 4096), "n1": Mem(2048, 1024)}),
        (2.0, {"n0": Mem(3072, 2048), "n1": Mem(1024, 2048)}),  # n0's anon peak
        (3.0, {"n0": Mem(2048, 8192)}),  # n1 unreadable here; n0's file peak
        (4.0, {"n0": Mem(10240, 10240), "n1": Mem(10240, 10240)}),  # after the window
    ]


def test_peaks_take_each_figure_s_own_maximum_within_the_window() -> None:
    assert memory.peaks(_samples(), 1.0, 3.0) == {
        "n0": {"rss_anon_mb": 3.0, "rss_file_mb": 8.0},
        "n1": {"rss_anon_mb": 2.0, "rss_file_mb": 2.0},
    }
    assert memory.peaks(_samples())["n1"] == {"rss_anon_mb": 10.0, "rss_file_mb": 10.0}
    assert memory.peaks(_samples(), start=2.5) == {
        "n0": {"rss_anon_mb": 10.0, "rss_file_mb": 10.0},
        "n1": {"rss_anon_mb": 10.0, "rss_file_mb": 10.0},
    }
    assert memory.peaks(_samples(), 5.0, 6.0) == {}
    assert memory.peaks([]) == {}


def test_at_rest_is_the_median_so_one_odd_sample_does_not_set_it() -> None:
    samples = [(float(t), {"n0": Mem(anon, 4096)}) for t, anon in enumerate((1024, 1024, 99_000))]
    assert memory.at_rest(samples) == {"n0": {"rss_anon_mb": 1.0, "rss_file_mb": 4.0}}


def test_rest_samples_reads_count_times() -> None:
    calls: list[Mapping[str, int | None]] = []

    def read(pids: Mapping[str, int | None]) -> dict[str, Mem]:
        calls.append(pids)
        return {"n0": Mem(len(calls), 1)}

    out = memory.rest_samples({"n0": 1}, 3, 0.0, read)
    assert [m["n0"].rss_anon_kib for _, m in out] == [1, 2, 3]
    assert [t for t, _ in out] == sorted(t for t, _ in out)


def test_sampler_samples_until_exit_and_once_more_at_exit() -> None:
    count = 0
    two_seen = threading.Event()

    def read(pids: Mapping[str, int | None]) -> dict[str, Mem]:
        nonlocal count
        count += 1
        if count >= 2:
            two_seen.set()
        return {"n0": Mem(1024 * count, 1024)}

    with memory.MemorySampler({"n0": 1}, interval_s=0.001, read=read) as sampler:
        assert two_seen.wait(10)
    taken = count
    assert len(sampler.samples()) == taken >= 3  # the last one at exit
    assert sampler.peaks()["n0"]["rss_anon_mb"] == float(taken)


def test_sampler_of_real_processes() -> None:
    with memory.MemorySampler({"me": os.getpid(), "gone": None}, interval_s=0.01) as sampler:
        pass
    assert set(sampler.peaks()) == {"me"}


# --- the floor leader -------------------------------------------------------------------


class _Context:
    def __init__(self) -> None:
        self.aborted: tuple[Any, str] | None = None

    async def abort(self, code: Any, details: str) -> None:
        self.aborted = (code, details)
        raise RuntimeError(details)


async def _acks_stream(acks: asyncio.Queue[bytes | None]) -> Any:
    while (ack := await acks.get()) is not None:
        yield ack


def test_fanout_answers_a_call_only_when_both_followers_acked() -> None:
    async def scenario() -> None:
        fan = floor._Fanout(["a", "b"])
        fan._queues = [asyncio.Queue(), asyncio.Queue()]
        call = asyncio.ensure_future(fan.call(b"x" * 16, _Context()))  # type: ignore[arg-type]
        await asyncio.sleep(0)
        frames = [q.get_nowait() for q in fan._queues]
        assert frames[0] == frames[1] == (0).to_bytes(8, "big") + b"x" * 16
        fan._acked(0)
        await asyncio.sleep(0)
        assert not call.done()
        fan._acked(7)  # unknown: ignored
        fan._acked(0)
        assert await asyncio.wait_for(call, 5) == (0).to_bytes(8, "big")
        assert fan._pending == {}

    asyncio.run(scenario())


def test_fanout_fails_pending_calls_when_a_follower_stream_ends() -> None:
    async def scenario() -> None:
        fan = floor._Fanout(["a", "b"])
        fan._queues = [asyncio.Queue(), asyncio.Queue()]
        ctx = _Context()
        call = asyncio.ensure_future(fan.call(b"x", ctx))  # type: ignore[arg-type]
        await asyncio.sleep(0)
        acks: asyncio.Queue[bytes | None] = asyncio.Queue()
        acks.put_nowait((0).to_bytes(8, "big"))
        acks.put_nowait(None)  # the follower closes its stream
        await fan._read_acks("b", _acks_stream(acks))
        with pytest.raises(RuntimeError, match="not acknowledged"):
            await asyncio.wait_for(call, 5)
        assert ctx.aborted is not None and "closed its stream" in ctx.aborted[1]
        later = _Context()
        with pytest.raises(RuntimeError, match="closed its stream"):
            await fan.call(b"y", later)  # type: ignore[arg-type]

    asyncio.run(scenario())


def test_floor_group_commands_name_the_followers_and_find_the_package(tmp_path: Path) -> None:
    group = floor.FloorGroup(tmp_path)
    group.root = tmp_path
    group._prepare()
    leader, f0, f1 = (group._command(i) for i in range(3))
    ports = [str(p) for p in group.ports]
    assert leader[1:4] == ["-m", "bench.floor", "serve"] and leader[5] == ports[0]
    assert leader[-2:] == ["--followers", f"127.0.0.1:{ports[1]},127.0.0.1:{ports[2]}"]
    assert f0[-2:] == ["--port", ports[1]] and "--followers" not in f0 + f1
    assert group._env()["PYTHONPATH"].split(os.pathsep)[0] == str(floor.REPO_ROOT)
    assert group.target == f"127.0.0.1:{ports[0]}"
