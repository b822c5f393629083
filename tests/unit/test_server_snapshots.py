"""A snapshot transfer is as hostile as any peer input: the receiver's checks
(dledger.server.snapshots) refuse bad headers, names, offsets, sizes and checksums before
anything reaches the core."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from raftmq.dledger.v1 import dledger_pb2 as pb

from dledger.server.snapshots import (
    SNAPSHOT_CHUNK_BYTES,
    SnapshotRefused,
    _check_header,
    _check_name,
    _digest_update,
    _Staging,
)

SEG = 64 * 1024


def _header(**kw: int) -> pb.SnapshotHeader:
    fields = dict(
        term=3,
        snapshot_index=100,
        snapshot_term=2,
        base_index=40,
        base_term=1,
        start_position=2 * SEG,
        segment_size_bytes=SEG,
    )
    fields.update(kw)
    return pb.SnapshotHeader(**fields)


def test_good_header_and_names_pass() -> None:
    _check_header(_header(), SEG)
    for name in (
        "log/00000000000000131072",
        "app/consumequeue/T%RETRY%g/0/00000000000000000000",
        "app/config/snapshot.json",
        "app/index/20261124230000000",
    ):
        _check_name(name)


@pytest.mark.parametrize(
    "bad",
    [
        {"snapshot_index": 0},
        {"snapshot_term": 4},  # above the leader's term
        {"snapshot_term": 0},
        {"base_index": 101},
        {"base_term": 3},
        {"segment_size_bytes": 2 * SEG},  # not this store's
        {"start_position": SEG + 1},
        {"snapshot_index": 1 << 63},
    ],
)
def test_bad_headers_are_refused(bad: dict[str, int]) -> None:
    with pytest.raises(SnapshotRefused):
        _check_header(_header(**bad), SEG)


@pytest.mark.parametrize(
    "name",
    [
        "log/../../etc",
        "log/123",
        "app/../x",
        "app/a/./b",
        "app//x",
        "app/x\x00y",
        "/etc/passwd",
        "other/x",
        "app/" + "a" * 2000,
    ],
)
def test_bad_names_are_refused(name: str) -> None:
    with pytest.raises(SnapshotRefused):
        _check_name(name)


def test_staging_checks_order_size_and_digest(tmp_path: Path) -> None:
    st = _Staging(tmp_path)
    st.write(pb.SnapshotData(name="app/a", offset=0, data=b"xy"))
    st.write(pb.SnapshotData(name="app/a", offset=2, zeros=3))
    st.write(pb.SnapshotData(name="log/00000000000000000000", offset=0, zeros=4))
    assert (tmp_path / "app" / "a").read_bytes() == b"xy\0\0\0"
    assert (tmp_path / "log" / "00000000000000000000").read_bytes() == b"\0" * 4
    expected = hashlib.sha256()
    _digest_update(expected, "app/a", 0, b"xy", 0)
    _digest_update(expected, "app/a", 2, b"", 3)
    _digest_update(expected, "log/00000000000000000000", 0, b"", 4)
    assert st.digest.digest() == expected.digest() and st.total == 9
    for bad in (
        pb.SnapshotData(name="app/a", offset=0, data=b"again"),  # a file seen before
        pb.SnapshotData(name="app/b", offset=5, data=b"gap"),  # not at its end
        pb.SnapshotData(name="app/c", offset=0, data=b"x" * (SNAPSHOT_CHUNK_BYTES + 1)),
        pb.SnapshotData(name="app/d", offset=0, data=b"x", zeros=1),  # both
        pb.SnapshotData(name="app/e", offset=0, zeros=SNAPSHOT_CHUNK_BYTES + 1),
    ):
        with pytest.raises(SnapshotRefused):
            st.write(bad)
    assert not (tmp_path / "app" / "b").exists()
