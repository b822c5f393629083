"""client.senders: the producer's sender threads. Made on demand up to a bound and reused,
idle ones exit, deferred work runs on the thread that deferred it (or elsewhere once
released), and nothing handed is dropped by ``close``."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest
from support import wait_for

from client.senders import Senders

# Every wait below is for a condition, bounded by this.
WAIT_S = 10.0


def _alive(name: str) -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith(f"{name}-")]


@pytest.fixture
def senders() -> Iterator[Senders]:
    pool = Senders("test-sender", 3, 30.0)
    yield pool
    pool.close(WAIT_S)
    assert not _alive("test-sender")


def test_work_in_a_row_reuses_its_sender(senders: Senders) -> None:
    threads: list[str] = []
    for _ in range(30):
        done = threading.Event()

        def work(done: threading.Event = done) -> None:
            threads.append(threading.current_thread().name)
            done.set()

        senders.hand(work)
        assert done.wait(WAIT_S)
    # One sender, or two when a piece was handed while the first was leaving the last one.
    assert senders.started <= 2 and len(set(threads)) <= 2, threads


def test_at_most_the_bound_and_the_rest_waits_its_turn(senders: Senders) -> None:
    gate = threading.Event()
    ran: list[int] = []
    lock = threading.Lock()

    def blocked(i: int) -> None:
        assert gate.wait(WAIT_S)
        with lock:
            ran.append(i)

    for i in range(7):
        senders.hand(blocked, i)
    wait_for(lambda: len(_alive("test-sender")) == 3, WAIT_S, "three senders")
    assert senders.started == 3 and not ran
    gate.set()
    wait_for(lambda: len(ran) == 7, WAIT_S, "every piece of work")
    assert sorted(ran) == list(range(7)) and senders.started == 3


def test_an_idle_sender_exits() -> None:
    pool = Senders("idle-sender", 2, 0.05)
    done = threading.Event()
    pool.hand(done.set)
    assert done.wait(WAIT_S)
    wait_for(lambda: not _alive("idle-sender"), WAIT_S, "the idle sender to exit")
    again = threading.Event()
    pool.hand(again.set)  # a new sender for new work
    assert again.wait(WAIT_S) and pool.started == 2
    pool.close(WAIT_S)


def test_deferred_work_runs_after_on_the_same_thread_and_the_rest_elsewhere(
    senders: Senders,
) -> None:
    events: list[tuple[str, str]] = []
    lock = threading.Lock()
    all_done = threading.Event()

    def note(what: str) -> None:
        with lock:
            events.append((what, threading.current_thread().name))
            if len(events) == 3:
                all_done.set()

    third_ran = threading.Event()

    def second() -> None:
        note("second")
        assert third_ran.wait(WAIT_S)  # keeps this sender busy: the third cannot come here

    def third() -> None:
        note("third")
        third_ran.set()

    def first() -> None:
        senders.hand_after(second)
        senders.hand_after(third)
        note("first")

    senders.hand(first)
    assert all_done.wait(WAIT_S)
    by_what = dict(events)
    assert [e[0] for e in events if e[0] != "third"] == ["first", "second"]
    assert by_what["second"] == by_what["first"]  # deferred: after, on the same sender
    assert by_what["third"] != by_what["first"]  # beyond the first: another sender


def test_released_work_does_not_wait_for_the_work_that_deferred_it(senders: Senders) -> None:
    ran_on: list[str] = []
    deferred_ran = threading.Event()
    outcome: list[bool] = []

    def deferred() -> None:
        ran_on.append(threading.current_thread().name)
        deferred_ran.set()

    def waits_for_it() -> None:
        senders.hand_after(deferred)
        senders.release_deferred()
        outcome.append(deferred_ran.wait(WAIT_S))  # would never be set if kept deferred

    senders.hand(waits_for_it)
    wait_for(lambda: bool(outcome), 2 * WAIT_S, "the work to end")
    assert outcome == [True] and ran_on


def test_hand_after_off_a_sender_is_hand(senders: Senders) -> None:
    done = threading.Event()
    senders.hand_after(done.set)
    assert done.wait(WAIT_S)


def test_close_runs_the_work_handed_before_and_after() -> None:
    pool = Senders("close-sender", 1, 30.0)
    gate = threading.Event()
    ran: list[str] = []

    def work(what: str) -> None:
        assert gate.wait(WAIT_S)
        ran.append(what)

    pool.hand(work, "busy")
    pool.hand(work, "queued")
    closing = threading.Thread(target=pool.close, args=(WAIT_S,))
    closing.start()
    gate.set()
    closing.join(2 * WAIT_S)
    assert not closing.is_alive() and ran == ["busy", "queued"]
    assert not _alive("close-sender")
    late = threading.Event()
    pool.hand(late.set)  # after close: a thread of its own
    assert late.wait(WAIT_S)
