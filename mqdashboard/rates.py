"""Bounded histories of sampled values, and per-second rates from successive samples.

A *counter* only grows (a topic's messages written, a group's messages consumed); its rate
between two samples is the growth divided by the time between them. A counter that went down
(a topic deleted and created again, an offset reset backwards) gives no rate for that
interval: the history starts again from the lower value instead of showing a negative rate.
A *gauge* (a group's lag) is kept as sampled.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Mapping

# Points kept per series: with the default 2 s interval, the last 10 minutes.
MAX_POINTS = 300
# Series kept per history: a dashboard of many topics samples only the first this many.
MAX_SERIES = 200

Point = tuple[float, float]


def rate_per_s(prev: Point, cur: Point) -> float | None:
    """The counter's rate between two samples ``(time_s, value)``; None when time did not
    move forward or the counter went down."""
    dt = cur[0] - prev[0]
    dv = cur[1] - prev[1]
    if dt <= 0 or dv < 0:
        return None
    return dv / dt


class History:
    """The last ``max_points`` samples of up to ``max_series`` named series. A series missing
    from a sample (a topic deleted) is dropped; a new one beyond ``max_series`` is not kept."""

    def __init__(self, max_points: int = MAX_POINTS, max_series: int = MAX_SERIES) -> None:
        if max_points < 2 or max_series < 1:
            raise ValueError("a history needs at least 2 points and 1 series")
        self.max_points = max_points
        self.max_series = max_series
        self._series: dict[str, deque[Point]] = {}

    def add(self, time_s: float, values: Mapping[str, float]) -> None:
        for name in [n for n in self._series if n not in values]:
            del self._series[name]
        for name, value in values.items():
            points = self._series.get(name)
            if points is None:
                if len(self._series) >= self.max_series:
                    continue
                points = self._series[name] = deque(maxlen=self.max_points)
            points.append((time_s, float(value)))

    def names(self) -> list[str]:
        return sorted(self._series)

    def points(self, name: str) -> list[Point]:
        """The samples of ``name``, oldest first (empty when unknown)."""
        return list(self._series.get(name, ()))

    def rates(self, name: str) -> list[Point]:
        """``(time_s, per second)`` between each pair of successive samples of a counter,
        skipping the intervals where it went down."""
        points = self.points(name)
        out: list[Point] = []
        for prev, cur in itertools.pairwise(points):
            r = rate_per_s(prev, cur)
            if r is not None:
                out.append((cur[0], r))
        return out

    def latest_rate(self, name: str) -> float | None:
        """The counter's rate over its last interval (None: fewer than two samples, or it
        went down)."""
        points = self._series.get(name)
        if points is None or len(points) < 2:
            return None
        return rate_per_s(points[-2], points[-1])

    def latest(self, name: str) -> float | None:
        points = self._series.get(name)
        return points[-1][1] if points else None
