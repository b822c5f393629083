"""prockit.malloc: a server's malloc arenas capped at start-up, and malloc_trim."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import textwrap

import pytest

from prockit import malloc

# A child that starts THREADS threads allocating at once (each meeting a locked arena makes
# one of its own without a cap), then prints glibc's per-arena statistics to stderr.
THREADS = 8
CHILD = textwrap.dedent(
    f"""
    import ctypes, sys, threading
    from prockit import malloc
    if sys.argv[1] == "cap":
        malloc.cap_arenas({{}})
    libc = ctypes.CDLL(None)
    libc.malloc.restype = ctypes.c_void_p
    start = threading.Barrier({THREADS})
    def work():
        start.wait()
        for _ in range(2000):
            libc.free(ctypes.c_void_p(libc.malloc(1000)))
    threads = [threading.Thread(target=work) for _ in range({THREADS})]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    libc.malloc_stats()
    """
)

glibc = pytest.mark.skipif(
    not sys.platform.startswith("linux") or os.confstr("CS_GNU_LIBC_VERSION") is None,
    reason="glibc's malloc only",
)


def _arenas(mode: str) -> int:
    env = {k: v for k, v in os.environ.items() if k != malloc.ARENA_ENV}
    out = subprocess.run(
        [sys.executable, "-c", CHILD, mode], env=env, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    return sum(1 for line in out.stderr.splitlines() if line.startswith("Arena "))


@glibc
def test_cap_holds_a_threaded_process_to_the_server_arenas() -> None:
    assert _arenas("cap") <= malloc.SERVER_MALLOC_ARENAS
    assert _arenas("none") > malloc.SERVER_MALLOC_ARENAS  # the test can tell the difference


@glibc
def test_an_operators_environment_wins() -> None:
    assert malloc.cap_arenas({malloc.ARENA_ENV: "4"}) is None


@glibc
def test_trim_runs() -> None:
    block = bytearray(64 << 20)  # freed at once: its pages may go back
    del block
    assert malloc.trim() in (True, False)


def test_trim_periodically_trims_off_the_loop_until_cancelled(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import threading

    calls: list[int] = []
    monkeypatch.setattr(malloc, "trim", lambda: calls.append(threading.get_ident()) or True)

    async def run() -> None:
        task = asyncio.get_running_loop().create_task(malloc.trim_periodically(0.01))
        deadline = asyncio.get_running_loop().time() + 10.0
        while len(calls) < 3 and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(run())
    assert len(calls) >= 3
    assert threading.get_ident() not in calls  # on the executor, not the event loop's thread


def test_the_broker_caps_its_arenas_before_it_builds_the_node_and_trims() -> None:
    import inspect

    from broker import __main__ as broker_main

    main_source = inspect.getsource(broker_main.main)
    assert "malloc.cap_arenas()" in main_source
    assert main_source.index("malloc.cap_arenas()") < main_source.index("build(cfg)")
    assert "malloc.trim_periodically()" in inspect.getsource(broker_main._serve)
