"""SIGKILL a real process that appends under SYNC_FLUSH; every acknowledged entry survives."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dledger.storage.store import SegmentedLogStore, StoreConfig

pytestmark = pytest.mark.integration

SEG = 64 * 1024
CHILD = r"""
import sys, threading
from dledger.storage.store import FlushDiskType, SegmentedLogStore, StoreConfig

def body(thread, seq):
    return (f"{thread}:{seq}:".encode() * 400)[: 40 + (thread * 131 + seq * 17) % 3000]

store = SegmentedLogStore(sys.argv[1], StoreConfig(
    segment_size_bytes=65536, index_segment_size_bytes=65536,
    flush_disk_type=FlushDiskType.SYNC_FLUSH))
out = threading.Lock()

def worker(thread):
    seq = 0
    while True:
        index = store.append_bodies(1, [body(thread, seq)])
        store.flush()  # group commit: durable when it returns
        with out:
            sys.stdout.write(f"{index} {thread} {seq}\n")
            sys.stdout.flush()
        seq += 1

threads = [threading.Thread(target=worker, args=(t,), daemon=True) for t in range(8)]
for t in threads:
    t.start()
for t in threads:
    t.join()
"""


def body(thread: int, seq: int) -> bytes:
    return (f"{thread}:{seq}:".encode() * 400)[: 40 + (thread * 131 + seq * 17) % 3000]


@pytest.mark.parametrize("kill_after_acks", [1, 300, 3000])
def test_sigkill_mid_append_loses_no_acknowledged_entry(
    tmp_path: Path, kill_after_acks: int
) -> None:
    root = tmp_path / "store"
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    proc = subprocess.Popen(
        [sys.executable, str(script), str(root)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
    )
    acked: dict[int, tuple[int, int]] = {}
    try:
        assert proc.stdout is not None
        deadline = time.monotonic() + 20
        while len(acked) < kill_after_acks and time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            index, thread, seq = map(int, line.split())
            acked[index] = (thread, seq)
        proc.send_signal(signal.SIGKILL)
        rest, err = proc.communicate(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=10)
    assert proc.returncode == -signal.SIGKILL, err.decode(errors="replace")[-2000:]
    for text in rest.decode().splitlines():
        parts = text.split()
        if len(parts) == 3:  # a line cut by the kill was never acknowledged
            index, thread, seq = map(int, parts)
            acked[index] = (thread, seq)
    assert len(acked) >= kill_after_acks

    store = SegmentedLogStore(
        root, StoreConfig(segment_size_bytes=SEG, index_segment_size_bytes=SEG)
    )
    try:
        assert store.recovered_from_crash
        assert store.last_index() >= max(acked)
        for index, (thread, seq) in acked.items():
            assert store.read(index).body == body(thread, seq), index
        assert store.verify() == store.last_index()
    finally:
        store.close()
