"""broker.components.disk: the send path's watermark check (fake statvfs and clock) and its
config keys."""

from __future__ import annotations

import asyncio
import errno
import os
import signal
import subprocess
import sys
from types import SimpleNamespace
from typing import Any

import grpc
import pytest
from raftmq.broker.v1 import broker_pb2 as pb

from broker.app import assemble
from broker.components.disk import DiskGuard, Watermarks, used_percent
from broker.config import ConfigError, node_config, parse_config
from broker.frontends.v1.service import ServiceConfig
from dledger.core import Role
from dledger.server.errormap import DISK_FULL_RETRY_AFTER_MS
from dledger.storage import DiskFullError
from rpckit.status import read_error

BLOCKS = 1000


def _st(used_blocks: int) -> os.statvfs_result:
    # (bsize, frsize, blocks, bfree, bavail, files, ffree, favail, flag, namemax)
    free = BLOCKS - used_blocks
    return os.statvfs_result((4096, 4096, BLOCKS, free, free, 100, 50, 50, 0, 255))


class FakeDisk:
    def __init__(self) -> None:
        self.used_blocks = 0
        self.calls = 0
        self.error: OSError | None = None
        self.now = 100.0

    def statvfs(self, path: str) -> os.statvfs_result:
        self.calls += 1
        if self.error is not None:
            raise self.error
        return _st(self.used_blocks)

    def clock(self) -> float:
        return self.now


def _guard(disk: FakeDisk, path: str = "/store/n0", interval_ms: int = 100) -> DiskGuard:
    return DiskGuard(
        "n0",
        path,
        Watermarks(max_used_percent=90, resume_percent=80, check_interval_ms=interval_ms),
        statvfs=disk.statvfs,
        clock=disk.clock,
    )


def test_refuses_above_the_high_mark_and_resumes_below_the_low_mark() -> None:
    disk = FakeDisk()
    guard = _guard(disk)
    disk.used_blocks = 899
    guard.check()  # 89.9 %: writable
    disk.used_blocks, disk.now = 900, disk.now + 0.1
    with pytest.raises(DiskFullError) as info:
        guard.check()
    text = f"{info.value.code} {info.value}"
    assert text.startswith("DISK_FULL node=n0 path=/store/n0 used=90.0% max=90% ")
    # In the hysteresis band: still refused.
    disk.used_blocks, disk.now = 850, disk.now + 0.1
    with pytest.raises(DiskFullError):
        guard.check()
    disk.used_blocks, disk.now = 799, disk.now + 0.1
    guard.check()  # below the low mark: writable again, by itself
    assert not guard.full and guard.refused_count == 2


def test_statvfs_at_most_once_per_interval() -> None:
    disk = FakeDisk()
    guard = _guard(disk, interval_ms=100)
    for _ in range(1000):
        guard.check()
    assert disk.calls == 1
    disk.used_blocks = 950  # not seen until the interval has passed
    guard.check()
    disk.now += 0.099
    guard.check()
    assert disk.calls == 1
    disk.now += 0.002
    with pytest.raises(DiskFullError):
        guard.check()
    assert disk.calls == 2


def test_a_failing_statvfs_keeps_the_last_state() -> None:
    disk = FakeDisk()
    guard = _guard(disk)
    disk.used_blocks = 990
    with pytest.raises(DiskFullError):
        guard.check()
    disk.error = OSError(errno.ENOENT, "gone")
    disk.now += 1
    with pytest.raises(DiskFullError):
        guard.check()
    disk.error, disk.used_blocks, disk.now = None, 0, disk.now + 1
    guard.check()


def test_detail_is_bounded_for_a_huge_path() -> None:
    disk = FakeDisk()
    disk.used_blocks = BLOCKS
    guard = _guard(disk, path="/" + "x" * 5000)
    with pytest.raises(DiskFullError) as info:
        guard.check()
    assert len(str(info.value)) < 512


def test_used_percent_counts_root_reserved_blocks_as_used() -> None:
    st = os.statvfs_result((4096, 4096, 1000, 100, 50, 0, 0, 0, 0, 255))
    assert used_percent(st) == 95.0
    assert used_percent(os.statvfs_result((0,) * 10)) == 0.0


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"max_used_percent": 100}, "max_used_percent"),
        ({"max_used_percent": 5}, "max_used_percent"),
        ({"max_used_percent": 80, "resume_percent": 80}, "resume_percent"),
        ({"resume_percent": 0}, "resume_percent"),
        ({"check_interval_ms": 0}, "check_interval_ms"),
        ({"check_interval_ms": 3_600_000}, "check_interval_ms"),
    ],
)
def test_watermarks_are_validated(kwargs: dict[str, int], needle: str) -> None:
    with pytest.raises(ValueError, match=needle):
        Watermarks(**kwargs)


CONF = """\
dLegerPeers=n0-127.0.0.1:40911;n1-127.0.0.1:40912;n2-127.0.0.1:40913
dLegerSelfId=n1
storePathRootDir=/tmp/rmqstore/node01
"""


def test_disk_keys_defaults_and_values() -> None:
    cfg = parse_config(CONF)
    assert cfg.disk_watermarks == Watermarks()
    # RocketMQ's defaults and meanings: early deletion above 75 %, refusal at 90 %.
    assert (cfg.diskMaxUsedSpaceRatio, cfg.diskSpaceWarningLevelRatio) == (75, 90)
    assert cfg.diskSpaceResumeRatio == 85 and cfg.notes == ()
    assert node_config(cfg).retention_early_used_percent == 75
    assert node_config(cfg).store.reserve_bytes == cfg.diskSpaceReserveBytes == 4 << 20
    cfg = parse_config(
        CONF + "diskSpaceWarningLevelRatio=0.75\ndiskSpaceResumeRatio=60\ndiskCheckIntervalMs=20\n"
        "diskSpaceReserveBytes=0\ndiskMaxUsedSpaceRatio=50\n"
    )
    assert cfg.disk_watermarks == Watermarks(75, 60, 20) and cfg.notes == ()
    assert node_config(cfg).retention_early_used_percent == 50
    assert node_config(cfg).store.reserve_bytes == 0
    assert parse_config(CONF + "diskSpaceWarningLevelRatio=80\n").disk_watermarks == Watermarks(
        80, 75
    )
    off = parse_config(CONF + "diskMaxUsedSpaceRatio=0\ndiskSpaceResumeRatio=80\n")
    assert (off.diskMaxUsedSpaceRatio, off.disk_watermarks, off.notes) == (
        0,
        Watermarks(90, 80),
        (),
    )


def test_a_release_0_2_0_refusal_mark_keeps_its_meaning_with_a_warning() -> None:
    # 0.2.0 wrote the refusal mark as diskMaxUsedSpaceRatio, with our diskSpaceResumeRatio.
    cfg = parse_config(CONF + "diskMaxUsedSpaceRatio=80\ndiskSpaceResumeRatio=70\n")
    assert cfg.disk_watermarks == Watermarks(80, 70)
    assert cfg.diskMaxUsedSpaceRatio == 75  # early deletion: RocketMQ's default
    (note,) = cfg.notes
    assert note.startswith("broker.conf: diskMaxUsedSpaceRatio=80 with diskSpaceResumeRatio is a ")
    assert "rename the key to diskSpaceWarningLevelRatio" in note
    # Alone, the key has RocketMQ's meaning (its stock 75), and the warning says how 0.2.0 read it.
    cfg = parse_config(CONF + "diskMaxUsedSpaceRatio=80\n")
    assert cfg.disk_watermarks == Watermarks(90, 85) and cfg.diskMaxUsedSpaceRatio == 80
    (note,) = cfg.notes
    assert "set diskSpaceWarningLevelRatio=80 to refuse there" in note
    # With the new key set, the file is read as written, without a warning.
    cfg = parse_config(CONF + "diskMaxUsedSpaceRatio=80\ndiskSpaceWarningLevelRatio=0.95\n")
    assert (cfg.diskMaxUsedSpaceRatio, cfg.disk_watermarks, cfg.notes) == (
        80,
        Watermarks(95, 90),
        (),
    )


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        ("diskMaxUsedSpaceRatio=100", "'diskMaxUsedSpaceRatio'"),
        ("diskMaxUsedSpaceRatio=abc", "'diskMaxUsedSpaceRatio'"),
        ("diskMaxUsedSpaceRatio=5", "0 turns early deletion off"),
        ("diskSpaceWarningLevelRatio=80\ndiskSpaceResumeRatio=80", "'diskSpaceResumeRatio'"),
        ("diskSpaceWarningLevelRatio=100", "'diskSpaceWarningLevelRatio'"),
        ("diskSpaceWarningLevelRatio=1.5", "not between 0 and 1"),
        ("diskSpaceWarningLevelRatio=0.905", "not a whole percent"),
        ("diskSpaceWarningLevelRatio=0.05", "'diskSpaceWarningLevelRatio'"),
        ("diskSpaceWarningLevelRatio=0.x", "not a number"),
        ("diskCheckIntervalMs=1", "'diskCheckIntervalMs'"),
        ("diskSpaceReserveBytes=-1", "'diskSpaceReserveBytes'"),
        ("diskSpaceReserveBytes=2147483648", "'diskSpaceReserveBytes'"),
    ],
)
def test_bad_disk_keys_name_the_key(extra: str, needle: str) -> None:
    with pytest.raises(ConfigError, match=needle):
        parse_config(CONF + extra + "\n")


class _Aborted(Exception):
    pass


class _Context:
    def peer(self) -> str:
        return "ipv4:127.0.0.1:5555"

    async def abort(self, code: grpc.StatusCode, detail: str, trailing_metadata: Any) -> None:
        raise _Aborted(code, detail, read_error(_Answer(code, detail, trailing_metadata)))


class _Answer(grpc.RpcError):
    """The failed call as a client sees it: status, text detail, trailers."""

    def __init__(self, code: grpc.StatusCode, detail: str, trailers: Any) -> None:
        self.answer = (code, detail, trailers)

    def code(self) -> grpc.StatusCode:
        return self.answer[0]

    def details(self) -> str:
        return str(self.answer[1])

    def trailing_metadata(self) -> Any:
        return self.answer[2]


@pytest.mark.parametrize(
    "call",
    [
        lambda s, ctx: s.SendMessage(
            pb.SendMessageRequest(topic="T", messages=[pb.Message(body=b"x")]), ctx
        ),
        lambda s, ctx: s.ConsumerSendMsgBack(
            pb.ConsumerSendMsgBackRequest(consumer_group="g"), ctx
        ),
    ],
    ids=["SendMessage", "ConsumerSendMsgBack"],
)
def test_the_send_paths_answer_resource_exhausted_disk_full(call: Any) -> None:
    disk = FakeDisk()
    disk.used_blocks = 950
    node = SimpleNamespace(role=Role.LEADER, leader_id="n0", self_id="n0")
    sm = SimpleNamespace(
        add_listener=lambda fn: None,
        add_change_listener=lambda fn: None,
        config_overrides={},
    )
    cfg = ServiceConfig("127.0.0.1", 10911)
    servicer = assemble(node, sm, cfg, disk_guard=_guard(disk)).servicer  # type: ignore[arg-type]
    with pytest.raises(_Aborted) as info:
        asyncio.run(call(servicer, _Context()))
    code, detail, fields = info.value.args
    assert code is grpc.StatusCode.RESOURCE_EXHAUSTED
    assert detail.startswith("DISK_FULL node=n0 path=/store/n0 used=95.0% ")
    # The structured error tells a client to come back later, not at once.
    assert (fields.code, fields.retryable) == ("DISK_FULL", True)
    assert fields.retry_after_ms == DISK_FULL_RETRY_AFTER_MS


def test_a_crash_by_signal_leaves_a_line_in_the_log() -> None:
    """The issue's leader "exited with no log line at all" (a SIGBUS in a mapped file)."""
    code = (
        "import os, signal\n"
        "from broker.__main__ import enable_crash_traces\n"
        "enable_crash_traces()\n"
        "os.kill(os.getpid(), signal.SIGBUS)\n"
    )
    p = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert p.returncode == -signal.SIGBUS
    assert "Fatal Python error: Bus error" in p.stderr


def test_new_marks_take_effect_at_the_next_check() -> None:
    """The disk marks are live (broker.liveconfig.LiveSettings): retune() samples again at the
    next send, whatever the interval, with the new marks."""
    disk = FakeDisk()
    guard = _guard(disk, interval_ms=60_000)
    disk.used_blocks = 850
    guard.check()  # 85 %: under 90
    guard.retune(Watermarks(max_used_percent=80, resume_percent=75, check_interval_ms=20))
    with pytest.raises(DiskFullError, match="max=80% resume_below=75%"):
        guard.check()  # sampled again at once, although 60 s had not passed
    guard.retune(Watermarks(max_used_percent=95, resume_percent=90, check_interval_ms=20))
    guard.check()  # 85 % is below the new resume mark: accepted
    assert not guard.full and guard._interval_s == 0.02
