"""A load for DLedger-level process tests: unique values appended in a thread, and the check
that every acknowledged value is in every replica's committed log exactly once."""

from __future__ import annotations

import threading
import time
from collections import Counter

from support import wait_for

from dledger.server.client import ClientError, LogClient

# Pause after a failed append (an election, a redirect) before the next one.
RETRY_PAUSE_S = 0.01
# How long Writer.stop waits for its thread (one append's deadline and then some).
STOP_JOIN_S = 30.0
# Status codes a group answers while it changes leader (LEADERSHIP_LOST, NO_QUORUM,
# TRANSFER_IN_PROGRESS, a refused connection) or when an attempt outlives its deadline, and
# NOT_LEADER with no leader known yet (FAILED_PRECONDITION): the append may be tried again.
# Anything else is a real refusal.
RETRYABLE_STATUSES = ("UNAVAILABLE", "DEADLINE_EXCEEDED")


def append_until_acked(client: LogClient, value: bytes, timeout_s: float) -> int:
    """Append ``value`` until a majority acknowledges it; its index. A failed attempt's outcome
    is unknown (it may be committed too), so use it where a value may appear more than once.
    An election on a loaded machine (a member's loop stalled beyond the election timeout) ends
    an attempt with LEADERSHIP_LOST; the group must still take the value within ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return client.append([value]).last_index
        except ClientError as exc:
            retryable = exc.status in RETRYABLE_STATUSES or exc.code == "NOT_LEADER"
            if not retryable or time.monotonic() >= deadline:
                raise
            time.sleep(RETRY_PAUSE_S)


class Writer:
    """Appends unique values, ``batch`` at a time, until stopped or ``limit_s`` passed;
    records what was acknowledged. A failed append (outcome unknown) is never retried with the
    same values, so each acknowledged value must appear exactly once. ``pad`` is added to
    every value (bigger entries fill segments sooner)."""

    def __init__(
        self, client: LogClient, batch: int = 5, limit_s: float = 60.0, pad: bytes = b""
    ) -> None:
        self.client = client
        self.batch = batch
        self.pad = pad
        self.acked: list[bytes] = []
        self.ack_times: list[float] = []
        self.failures: Counter[str] = Counter()
        self._stop = threading.Event()
        self._limit_s = limit_s
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        seq = 0
        deadline = time.monotonic() + self._limit_s
        while not self._stop.is_set() and time.monotonic() < deadline:
            values = [f"v{seq + i}:".encode() + self.pad for i in range(self.batch)]
            seq += self.batch
            try:
                self.client.append(values)
            except ClientError as exc:
                self.failures[exc.code] += 1
                self._stop.wait(RETRY_PAUSE_S)
                continue
            self.acked.extend(values)
            self.ack_times.append(time.monotonic())

    def start(self) -> Writer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(STOP_JOIN_S)
        assert not self._thread.is_alive()

    def wait_acks(self, n: int, timeout_s: float) -> None:
        target = len(self.acked) + n
        wait_for(lambda: len(self.acked) >= target, timeout_s, f"{n} more acknowledged appends")


def assert_exactly_once(acked: list[bytes], logs: dict[str, list[bytes]]) -> None:
    """Every replica's committed log is the same, and holds each acknowledged value once."""
    first = next(iter(logs.values()))
    for name, log in logs.items():
        assert log == first, f"{name}'s committed log differs from the others'"
    counts = Counter(first)
    missing = [v[:12] for v in acked if counts[v] == 0]
    duplicated = [v[:12] for v in acked if counts[v] > 1]
    assert not missing, f"{len(missing)} acknowledged values lost, e.g. {missing[:5]}"
    assert not duplicated, f"acknowledged values duplicated: {duplicated[:5]}"
