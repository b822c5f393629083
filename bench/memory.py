"""Memory of benchmarked processes (issue #23): anonymous and file-backed resident memory, read
from ``/proc/PID/status`` (``RssAnon``, ``RssFile``), at rest and at peak.

``RssAnon`` is what a node really costs (heap, Python objects, buffers); ``RssFile`` is pages of
mapped files in the page cache (log segments, ConsumeQueues, the key index), which the kernel
may drop and read again. ``MemorySampler`` reads every process's status each
``SAMPLE_INTERVAL_S`` from a thread while the cases run; ``peaks`` takes the maximum of each
figure over the samples of a time window (the peak of a case is the maximum over the samples
taken during it). The pure parts (``parse_status``, ``peaks``, ``at_rest``) are unit tested.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# How often the sampler reads every process's status while cases run: often enough that a
# peak lasting a second is seen, cheap enough not to matter (one small read per process).
SAMPLE_INTERVAL_S = 0.25
# Samples kept per sampler; past it the oldest half is dropped (a whole mqbench run at
# SAMPLE_INTERVAL_S is far below it: 40,000 samples is 2.8 hours).
MAX_SAMPLES = 40_000
KIB_PER_MB = 1024  # MB here is MiB, as /proc reports kB = KiB
STATUS_FIELDS = ("RssAnon", "RssFile")


@dataclass(frozen=True, slots=True)
class Mem:
    """One process's resident memory at one moment, KiB (as ``/proc/PID/status`` gives it)."""

    rss_anon_kib: int
    rss_file_kib: int

    def as_mb(self) -> dict[str, float]:
        return {
            "rss_anon_mb": self.rss_anon_kib / KIB_PER_MB,
            "rss_file_mb": self.rss_file_kib / KIB_PER_MB,
        }


# (monotonic time, {process name: memory}); a process that could not be read is absent.
Sample = tuple[float, dict[str, Mem]]


def parse_status(text: str) -> dict[str, int]:
    """The ``STATUS_FIELDS`` of a ``/proc/PID/status`` text, in KiB (absent ones left out)."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        name, sep, rest = line.partition(":")
        if not sep or name not in STATUS_FIELDS:
            continue
        parts = rest.split()
        if len(parts) == 2 and parts[1] == "kB" and parts[0].isdigit():
            out[name] = int(parts[0])
    return out


def read_mem(pid: int | None) -> Mem | None:
    """``pid``'s RssAnon and RssFile now; None if it is gone or the kernel lacks the fields."""
    if pid is None:
        return None
    try:
        fields = parse_status(Path(f"/proc/{pid}/status").read_text())
    except OSError:
        return None
    if "RssAnon" not in fields or "RssFile" not in fields:
        return None
    return Mem(fields["RssAnon"], fields["RssFile"])


def snapshot(pids: Mapping[str, int | None]) -> dict[str, Mem]:
    """Every process of ``pids`` that can be read now."""
    out = {}
    for name, pid in pids.items():
        mem = read_mem(pid)
        if mem is not None:
            out[name] = mem
    return out


def peaks(
    samples: Sequence[Sample], start: float | None = None, stop: float | None = None
) -> dict[str, dict[str, float]]:
    """Per process, the maximum RssAnon and the maximum RssFile (MB, each its own maximum)
    over the samples taken in [``start``, ``stop``] (either bound None: open)."""
    top: dict[str, list[int]] = {}
    for t, mems in samples:
        if (start is not None and t < start) or (stop is not None and t > stop):
            continue
        for name, mem in mems.items():
            cur = top.setdefault(name, [0, 0])
            cur[0] = max(cur[0], mem.rss_anon_kib)
            cur[1] = max(cur[1], mem.rss_file_kib)
    return {name: Mem(a, f).as_mb() for name, (a, f) in sorted(top.items())}


def at_rest(samples: Sequence[Sample]) -> dict[str, dict[str, float]]:
    """Per process, the median of each figure over ``samples`` taken while nothing ran (a
    median, so one sample caught during a collection or a checkpoint does not set it)."""
    per: dict[str, tuple[list[int], list[int]]] = {}
    for _, mems in samples:
        for name, mem in mems.items():
            anon, file = per.setdefault(name, ([], []))
            anon.append(mem.rss_anon_kib)
            file.append(mem.rss_file_kib)
    return {name: Mem(_median(a), _median(f)).as_mb() for name, (a, f) in sorted(per.items())}


def _median(values: list[int]) -> int:
    ordered = sorted(values)
    return ordered[len(ordered) // 2]


def rest_samples(
    pids: Mapping[str, int | None],
    count: int,
    interval_s: float,
    read: Callable[[Mapping[str, int | None]], dict[str, Mem]] = snapshot,
) -> list[Sample]:
    """``count`` samples ``interval_s`` apart (for ``at_rest``)."""
    out: list[Sample] = []
    for i in range(count):
        if i:
            time.sleep(interval_s)
        out.append((time.monotonic(), read(pids)))
    return out


class MemorySampler:
    """Samples ``pids`` every ``interval_s`` from a daemon thread between ``__enter__`` and
    ``__exit__``; ``peaks(start, stop)`` gives the window's maxima."""

    def __init__(
        self,
        pids: Mapping[str, int | None],
        interval_s: float = SAMPLE_INTERVAL_S,
        read: Callable[[Mapping[str, int | None]], dict[str, Mem]] = snapshot,
    ) -> None:
        self.pids = dict(pids)
        self.interval_s = interval_s
        self._read = read
        self._samples: list[Sample] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bench-memory", daemon=True)

    def __enter__(self) -> MemorySampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.sample()  # the state at the end counts too

    def sample(self) -> None:
        mems = self._read(self.pids)
        with self._lock:
            self._samples.append((time.monotonic(), mems))
            if len(self._samples) > MAX_SAMPLES:
                del self._samples[: MAX_SAMPLES // 2]

    def samples(self) -> list[Sample]:
        with self._lock:
            return list(self._samples)

    def peaks(self, start: float | None = None, stop: float | None = None) -> dict[str, Any]:
        return peaks(self.samples(), start, stop)

    def _run(self) -> None:
        while True:  # at once, then every interval
            self.sample()
            if self._stop.wait(self.interval_s):
                return
