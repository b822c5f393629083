"""Damage found while a store runs: the scrubber, the store's verification reads, the marker
that makes the next open check every segment, and the DATA_LOSS answer that names the entry
(docs/STORAGE.md "Damage and repair")."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from types import SimpleNamespace

import grpc
import pytest

from dledger.log import CorruptLogError, Entry, HardState
from dledger.server import errormap, scrub
from dledger.server.node import DLedgerNode
from dledger.server.nodeconfig import ConfigError, NodeConfig
from dledger.server.scrub import Scrubber
from dledger.storage import damage
from dledger.storage.codec import ENTRY_HEADER_SIZE
from dledger.storage.promise import PromiseWriter, promise_path_for_store, read_promise
from dledger.storage.store import SegmentedLogStore, StoreConfig

SEG = 64 * 1024
CFG = StoreConfig(segment_size_bytes=SEG, index_segment_size_bytes=SEG)
BODY = 1000


def body_of(i: int) -> bytes:
    return (b"%06d" % i) * (BODY // 6)


def filled(root: Path, n: int) -> SegmentedLogStore:
    s = SegmentedLogStore(root, CFG)
    s.append([Entry(1, i, body_of(i)) for i in range(1, n + 1)])
    s.flush()
    return s


def flip_body(s: SegmentedLogStore, index: int) -> None:
    """Change one byte of entry ``index``'s body under the open store (through the page
    cache, as a disk returning other bytes would look to its mapping)."""
    pos = s.body_position(index) + 7
    seg = s.root / "commitlog" / f"{pos - pos % SEG:020d}"
    with open(seg, "r+b") as f:
        f.seek(pos % SEG)
        b = f.read(1)
        f.seek(pos % SEG)
        f.write(bytes([b[0] ^ 0x10]))


def run_pass(scrubber: Scrubber) -> bool:
    async def one() -> bool:
        return await scrubber._pass()

    try:
        return asyncio.run(one())
    finally:
        scrubber.close()


def test_a_scrub_pass_checks_every_entry_across_segments(tmp_path: Path) -> None:
    s = filled(tmp_path / "s", 300)  # ~5 segments of 64 KiB
    assert s.segment_count >= 4
    found: list[tuple[CorruptLogError, str]] = []
    scrubber = Scrubber(lambda: s, lambda e, by: found.append((e, by)), scrub.MAX_SCRUB_BYTES_PER_S)
    assert run_pass(scrubber)
    assert not found
    assert scrubber.entries_verified == 300
    assert scrubber.bytes_verified == 300 * (ENTRY_HEADER_SIZE + len(body_of(1)))
    s.close()


def test_the_scrubber_finds_damage_in_an_old_segment_and_reports_the_entry(
    tmp_path: Path,
) -> None:
    s = filled(tmp_path / "s", 300)
    flip_body(s, 40)  # the first segment: no open-time check reads it
    found: list[tuple[CorruptLogError, str]] = []
    scrubber = Scrubber(lambda: s, lambda e, by: found.append((e, by)), scrub.MAX_SCRUB_BYTES_PER_S)
    assert not run_pass(scrubber)
    assert len(found) == 1
    exc, by = found[0]
    assert by == "scrub" and exc.index == 40 and "body CRC" in str(exc)
    assert scrubber.damage_found == 1
    s.close()


def test_passes_begin_no_sooner_than_the_configured_interval(tmp_path: Path) -> None:
    """scrubMinPassIntervalSeconds: a small log is passed over again once that long after the
    previous pass began (1 s here: two passes within the deadline, not one a minute)."""
    s = filled(tmp_path / "s", 20)
    scrubber = Scrubber(
        lambda: s, lambda e, by: None, scrub.MAX_SCRUB_BYTES_PER_S, min_pass_interval_s=1
    )

    async def two_passes() -> float:
        task = asyncio.create_task(scrubber.run())
        started = time.monotonic()
        try:
            while scrubber.passes < 2:
                assert time.monotonic() - started < 20, "no second pass"
                await asyncio.sleep(0.01)
            return time.monotonic() - started
        finally:
            task.cancel()

    took_s = asyncio.run(two_passes())
    scrubber.close()
    s.close()
    assert took_s >= 1.0  # the second pass waited for the interval


def test_the_pass_interval_is_bounded() -> None:
    for bad in (0, scrub.MAX_SCRUB_PASS_INTERVAL_S + 1):
        with pytest.raises(ConfigError, match="scrub_min_pass_interval_s"):
            NodeConfig(
                group="g",
                self_id="n0",
                peers={"n0": "127.0.0.1:1"},
                client_host="127.0.0.1",
                client_port=2,
                store_dir="/x",
                scrub_min_pass_interval_s=bad,
            )


def test_verify_entries_steps_and_index_at_position(tmp_path: Path) -> None:
    s = filled(tmp_path / "s", 100)
    size = ENTRY_HEADER_SIZE + len(body_of(1))
    nxt, n = s.verify_entries(1, 10 * size)
    assert (nxt, n) == (11, 10 * size)
    assert s.verify_entries(100, 1) == (101, size)
    assert s.verify_entries(101, 1 << 20) == (101, 0)  # past the end: nothing to check
    for i in (1, 37, 100):
        pos = s.body_position(i)
        assert s.index_at_position(pos) == i
        assert s.index_at_position(pos - ENTRY_HEADER_SIZE) == i  # its header
    assert s.index_at_position(10**9) == 0
    flip_body(s, 37)
    with pytest.raises(CorruptLogError) as e:
        s.verify_entries(30, 1 << 20)
    assert e.value.index == 37
    assert s.verify_until(1, s.body_position(37) - ENTRY_HEADER_SIZE, 100) == 37
    with pytest.raises(CorruptLogError):
        s.verify_until(1, s.body_position(37), 100)
    s.close()


def test_a_marker_makes_the_next_open_cut_damage_anywhere(tmp_path: Path) -> None:
    s = filled(tmp_path / "s", 300)
    flip_body(s, 40)
    s.close()
    # Without the marker the open checks only from the checkpoint's segment: it opens whole.
    s = SegmentedLogStore(tmp_path / "s", CFG)
    assert s.damage is None and s.last_index() == 300
    s.close()
    marker = damage.next_restart(tmp_path / "s")
    assert marker.verify and marker.restarts == 1
    damage.write_marker(tmp_path / "s", marker)
    s = SegmentedLogStore(tmp_path / "s", CFG)
    assert s.damage is not None and (s.damage.first_index, s.damage.last_index) == (40, 300)
    assert s.last_index() == 39
    s.close()
    after = damage.read_marker(tmp_path / "s")
    assert after is not None and not after.verify and after.restarts == 1  # count kept
    assert damage.next_restart(tmp_path / "s").restarts == 2


def test_marker_restarts_reset_after_a_quiet_window_and_garbage_reads_as_verify(
    tmp_path: Path,
) -> None:
    old = damage.DamageMarker(verify=False, restarts=4, since_s=1000.0)
    damage.write_marker(tmp_path, old)
    later = 1000.0 + damage.DAMAGE_RESTART_WINDOW_S + 1
    assert damage.next_restart(tmp_path, now_s=later).restarts == 1
    assert damage.next_restart(tmp_path, now_s=1001.0).restarts == 5
    (tmp_path / damage.DAMAGE_FILE).write_bytes(b"\xff" * 4000)
    m = damage.read_marker(tmp_path)
    assert m is not None and m.verify


def test_a_damaged_entry_answers_data_loss_naming_it() -> None:
    exc = CorruptLogError("corrupt log entry index 42 in x", path="x", offset=7, index=42)
    failure = errormap.dledger_failure(exc, node=None)  # type: ignore[arg-type]
    assert failure is not None
    assert failure.status is grpc.StatusCode.DATA_LOSS
    assert failure.code == "LOG_DAMAGED" and "index=42" in failure.detail
    assert failure.retryable


def test_the_promise_is_raised_to_the_old_last_index_before_a_cut(tmp_path: Path) -> None:
    s = filled(tmp_path / "dledger-n0", 300)
    s.close()
    path = promise_path_for_store(tmp_path / "dledger-n0")
    writer = PromiseWriter(path, "g", "n0", None)
    writer.write(120, HardState(term=3, voted_for="n1"))  # what it had acknowledged
    writer.close()
    data = tmp_path / "dledger-n0" / "commitlog" / f"{0:020d}"
    with open(data, "r+b") as f:  # entry 10's body: inside what the checkpoint covers
        f.seek(9 * (ENTRY_HEADER_SIZE + BODY) + ENTRY_HEADER_SIZE + 3)
        f.write(b"\xee")
    node = SimpleNamespace(
        cfg=SimpleNamespace(
            store_dir=str(tmp_path / "dledger-n0"), promise_path="", group="g", self_id="n0"
        ),
        corruption_found={},
    )
    full = StoreConfig(
        segment_size_bytes=SEG, index_segment_size_bytes=SEG, full_verify_on_open=True
    )
    hook = DLedgerNode._before_damage_cut.__get__(node)  # type: ignore[attr-defined]
    s = SegmentedLogStore(tmp_path / "dledger-n0", full, before_damage_cut=hook)
    assert s.damage is not None and (s.damage.first_index, s.damage.last_index) == (10, 300)
    assert s.last_index() == 9
    s.close()
    promise = read_promise(path)
    assert promise is not None and promise.promised_index == 300  # raised before the cut
    assert promise.hard_state == HardState(term=3, voted_for="n1")  # the vote is kept
    assert node.corruption_found == {"open": 1}
