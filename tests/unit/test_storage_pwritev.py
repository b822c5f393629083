"""A batch is written with pwritev from its parts (no joined copy): every byte lands in order,
past the kernel's IOV_MAX buffers per call, and after a short write."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from dledger.storage import files


def _parts(n: int) -> list[bytes]:
    return [bytes([i % 251]) * (1 + i % 7) for i in range(n)]


@pytest.mark.parametrize("n", [0, 1, 3, files.IOV_MAX, files.IOV_MAX + 1, 2 * files.IOV_MAX + 5])
def test_parts_land_in_order(tmp_path: Path, n: int) -> None:
    parts = _parts(n)
    path = tmp_path / "f"
    path.write_bytes(b"\xee" * 10)
    fd = os.open(path, os.O_RDWR)
    try:
        files._pwritev_all(fd, parts, 3)
    finally:
        os.close(fd)
    joined = b"".join(parts)
    data = path.read_bytes()
    assert data[:3] == b"\xee" * 3
    assert data[3 : 3 + len(joined)] == joined


def test_a_short_write_is_finished(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = os.pwritev
    calls = []

    def short(fd: int, buffers: list[bytes], offset: int) -> int:
        calls.append(len(buffers))
        head = b"".join(buffers)[:5]  # as if a signal cut the write after 5 bytes
        return real(fd, [head], offset)

    monkeypatch.setattr(files.os, "pwritev", short)
    parts = _parts(40)
    path = tmp_path / "f"
    fd = os.open(path, os.O_RDWR | os.O_CREAT)
    try:
        files._pwritev_all(fd, parts, 0)
    finally:
        os.close(fd)
    assert calls == [40]
    assert path.read_bytes() == b"".join(parts)
