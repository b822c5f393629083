"""prockit.fatal ends the process on a failed task or thread; dledger.failpoints arms failures."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from dledger import failpoints
from prockit.fatal import CAUSE_MAX_CHARS, EXIT_FATAL, describe


def _run(code: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=30,
        env=env,
    )


def test_a_failed_supervised_task_ends_the_process_with_one_fatal_line() -> None:
    p = _run(
        """
        import asyncio, logging
        from prockit.fatal import spawn
        logging.basicConfig(level=logging.INFO)
        async def broken():
            await asyncio.sleep(0.01)
            raise ValueError("disk said no")
        async def main():
            spawn(broken(), "ready")
            await asyncio.sleep(5)
            print("still alive")
        asyncio.run(main())
        """
    )
    assert p.returncode == EXIT_FATAL, p
    assert "still alive" not in p.stdout
    fatal_lines = [ln for ln in p.stderr.splitlines() if "FATAL component=" in ln]
    assert len(fatal_lines) == 1, p.stderr
    assert "component=ready cause=ValueError: disk said no" in fatal_lines[0]


def test_a_cancelled_or_finished_task_is_not_fatal() -> None:
    p = _run(
        """
        import asyncio
        from prockit.fatal import spawn
        async def forever():
            await asyncio.sleep(60)
        async def quick():
            return 1
        async def main():
            t = spawn(forever(), "tick")
            spawn(quick(), "once")
            await asyncio.sleep(0.05)
            t.cancel()
            await asyncio.sleep(0.05)
            print("clean")
        asyncio.run(main())
        """
    )
    assert p.returncode == 0, p
    assert "clean" in p.stdout


def test_a_guarded_thread_that_raises_ends_the_process() -> None:
    p = _run(
        """
        import threading, time
        from prockit.fatal import guard_thread
        def body():
            raise OSError(28, "No space left on device")
        threading.Thread(target=guard_thread("flush", body)).start()
        time.sleep(5)
        print("still alive")
        """
    )
    assert p.returncode == EXIT_FATAL, p
    assert "component=flush cause=OSError: [Errno 28] No space left on device" in p.stderr


def test_the_cause_is_one_bounded_line() -> None:
    text = describe(ValueError("x" * 10_000 + "\nsecond line"))
    assert "\n" not in text and len(text) == CAUSE_MAX_CHARS


def test_failpoints_parse_and_fire_from_the_nth_hit(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(failpoints, "_armed", failpoints._parse("apply=raise@3"))
    monkeypatch.setattr(failpoints, "_hits", {})
    failpoints.hit("apply")
    failpoints.hit("apply")
    failpoints.hit("flush")  # not armed
    with pytest.raises(failpoints.FailpointError, match="apply"):
        failpoints.hit("apply")


@pytest.mark.parametrize("spec", ["aply=raise", "apply=explode", "apply=raise@x"])
def test_a_misspelt_failpoint_is_an_error(spec: str) -> None:
    with pytest.raises(ValueError):
        failpoints._parse(spec)


def test_failpoints_come_from_the_environment() -> None:
    import os

    env = {**os.environ, failpoints.ENV: "ready=raise"}
    p = _run(
        """
        from dledger import failpoints
        try:
            failpoints.hit("ready")
        except failpoints.FailpointError as exc:
            print("fired", exc)
        """,
        env=env,
    )
    assert p.returncode == 0 and "fired failpoint ready" in p.stdout, p
