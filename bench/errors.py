"""The root of ``bench``'s exceptions: every error the benchmarks raise on purpose."""

from __future__ import annotations


class BenchError(Exception):
    """A benchmark cannot run or its result cannot be trusted."""
