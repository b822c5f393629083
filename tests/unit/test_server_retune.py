"""A running DLedgerNode's live settings (issue #35): early retention above the disk mark
(RocketMQ's diskMaxUsedSpaceRatio) deletes expired segments outside deleteWhen's hours, and
``retune`` changes that mark and the scrubber's pace without a restart. One node on free
ports with 1 MiB segments; the file system's usage is a fake ``statvfs``."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Awaitable, Callable
from datetime import datetime
from pathlib import Path

import pytest

from dledger.log import APPLICATION_TYPE_MIN, ConfigError
from dledger.server.node import DLedgerNode, NodeConfig
from dledger.storage import StoreConfig
from mqcluster.cluster import _free_ports

SEGMENT_BYTES = 1 << 20
BODY_BYTES = 100 << 10
BODIES = 30  # about 3 MiB: three full segments and the active one
DEADLINE_S = 10.0
# A deleteWhen hour twelve hours away from now: the hour rule never allows deletion here.
OTHER_HOUR = f"{(datetime.now().hour + 12) % 24:02d}"
BLOCKS = 1000


async def _until(cond: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.02)


async def _rounds(node: DLedgerNode, n: int) -> None:
    """Wait until the retention loop has done ``n`` more rounds."""
    target = node.retention_rounds + n
    await _until(lambda: node.retention_rounds >= target, f"{n} retention rounds")


class FakeUsage:
    """``os.statvfs`` of the store's file system at ``percent`` used; other paths: real."""

    def __init__(self, store_dir: str, percent: int) -> None:
        self.store_dir, self.percent = store_dir, percent
        self.real = os.statvfs

    def __call__(self, path: str | os.PathLike[str]) -> os.statvfs_result:
        if str(path) != self.store_dir:
            return self.real(path)
        free = BLOCKS * (100 - self.percent) // 100
        return os.statvfs_result((4096, 4096, BLOCKS, free, free, 100, 50, 50, 0, 255))


def _run(
    tmp_path: Path, early_percent: int, body: Callable[[DLedgerNode], Awaitable[None]]
) -> None:
    ports = _free_ports(2)
    cfg = NodeConfig(
        group="g",
        self_id="n0",
        peers={"n0": f"127.0.0.1:{ports[0]}"},
        client_host="127.0.0.1",
        client_port=ports[1],
        store_dir=str(tmp_path / "store"),
        store=StoreConfig(segment_size_bytes=SEGMENT_BYTES, preallocate=False),
        file_reserved_time_hours=0,  # every sealed segment is expired
        delete_when=OTHER_HOUR,
        retention_check_interval_s=0.05,
        retention_early_used_percent=early_percent,
    )

    async def go() -> None:
        node = DLedgerNode(cfg, seed=1)
        await node.start()
        try:
            await _until(lambda: node.core.leader_id == "n0", "the node to lead")
            for i in range(BODIES):
                await node.propose([bytes([i % 256]) * BODY_BYTES], APPLICATION_TYPE_MIN)
            assert node.store.segment_count >= 3
            await body(node)
        finally:
            await node.stop()

    asyncio.run(go())


def test_retention_deletes_expired_segments_early_only_above_the_mark(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    usage = FakeUsage(str(tmp_path / "store"), 70)
    monkeypatch.setattr(os, "statvfs", usage)

    async def body(node: DLedgerNode) -> None:
        # 70 % used, mark 75: the hour rule holds, nothing is deleted.
        await _rounds(node, 3)
        assert node.store.first_index() == 1
        usage.percent = 80  # above the mark: the expired segments go, outside deleteWhen
        await _until(lambda: node.store.first_index() > 1, "early deletion")
        assert node.store.segment_count >= 1 and node.last_index == BODIES + 1  # + the no-op

    _run(tmp_path, 75, body)


def test_retune_moves_the_mark_and_the_scrubbers_pace_while_running(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    usage = FakeUsage(str(tmp_path / "store"), 80)
    monkeypatch.setattr(os, "statvfs", usage)

    async def body(node: DLedgerNode) -> None:
        assert node.scrubber is not None and node.scrubber.bytes_per_s > 0
        await _rounds(node, 3)  # 80 % is below the mark of 90
        assert node.store.first_index() == 1
        with pytest.raises(ConfigError, match="retention_early_used_percent=5"):
            node.retune(retention_early_used_percent=5)
        assert node.cfg.retention_early_used_percent == 90  # a refused change changes nothing
        node.retune(scrub_bytes_per_s=0)
        assert node.scrubber.bytes_per_s == 0 and node.cfg.scrub_bytes_per_s == 0
        node.retune(retention_early_used_percent=75)
        await _until(lambda: node.store.first_index() > 1, "early deletion at the new mark")
        node.retune(scrub_bytes_per_s=1 << 20)
        assert node.scrubber.bytes_per_s == node.scrubber.pacer.bytes_per_s == 1 << 20
        node.retune(retention_early_used_percent=0)  # off
        assert not node._retention_early()

    _run(tmp_path, 90, body)
