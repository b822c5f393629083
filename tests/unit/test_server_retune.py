"""A running DLedgerNode's live settings (issue #35): early retention above the disk mark
(RocketMQ's diskMaxUsedSpaceRatio) deletes expired segments outside deleteWhen's hours, and
``retune`` changes that mark and the scrubber's pace without a restart. One node on free
ports with 1 MiB segments; the file system's usage is a fake."""

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
    """The share of the store's file system in use as the node's retention sees it (it reads
    ``used_percent(os.statvfs(store_dir))``; the store's own space checks keep the real disk)."""

    def __init__(self, percent: int) -> None:
        self.percent = percent

    def __call__(self, st: os.statvfs_result) -> float:
        return float(self.percent)


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
    usage = FakeUsage(70)
    monkeypatch.setattr("dledger.server.node.used_percent", usage)

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
    usage = FakeUsage(80)
    monkeypatch.setattr("dledger.server.node.used_percent", usage)

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
