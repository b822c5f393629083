"""Issue #38: a file of a format newer than this release reads stops the node with one line
naming the file, the version found and the newest this release reads (FORMAT_TOO_NEW), and
nothing on disk changes: no recovery from a copy, no rewrite in the old format, no rebuild of
the broker's derived stores, no cut of the log (docs/FORMAT.md, "Format versions").

The store each test bumps is written by this release: a real one-node group in this process
(its DLedger store, promise file, broker snapshot, ConsumeQueue and key index), stopped cleanly.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import shutil
import struct
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from raftmq.dledger.v1 import dledger_pb2 as pb

from broker.app import LazyLog
from broker.state.errors import CorruptStoreError
from broker.state.errors import FormatTooNewError as BrokerFormatTooNewError
from broker.state.indexfile import INDEX_HEADER_CRC_OFFSET, check_formats
from broker.state.machine import BrokerStateMachine
from broker.state.message import Message, UniqIdGenerator, encode_batch
from broker.state.records import (
    ENTRY_MESSAGES,
    ENTRY_TOPIC,
    TOPIC_UPSERT,
    TopicConfig,
    encode_topic_record,
)
from dledger.core import ConfState, Role
from dledger.log import CorruptLogError, FormatTooNewError
from dledger.server.errors import StartError
from dledger.server.formats import check_store_formats
from dledger.server.membership import CONF_FILE, save_conf
from dledger.server.node import DLedgerNode, NodeConfig
from dledger.server.promises import promise_file, recover
from dledger.server.snapshots import HEADER_FILE, INSTALL_MARKER, STAGING_DIR, _header_dict
from dledger.storage import SegmentedLogStore, StoreConfig, codec
from dledger.storage.codec import RecordError, crc32c
from mqcluster.cluster import (
    STATE_FILE,
    ClusterError,
    ClusterFormatTooNewError,
    LocalCluster,
    _free_ports,
)
from mqcluster.cluster import main as cluster_main
from mqerrors import codes as E
from mqrelease import RELEASE

IDS = UniqIdGenerator(ip="10.0.0.3", pid=9, instance_hash=3)
# Bounds of the waits for the group that writes the template store.
LEADER_WAIT_S = 10.0
APPLY_WAIT_S = 10.0
POLL_S = 0.01
STORE = StoreConfig(segment_size_bytes=1 << 20, preallocate=False)


def _config(root: Path) -> NodeConfig:
    peer_port, client_port = _free_ports(2)
    return NodeConfig(
        group="g",
        self_id="n0",
        peers={"n0": f"127.0.0.1:{peer_port}"},
        client_host="127.0.0.1",
        client_port=client_port,
        store_dir=str(root / "dledger"),
        store=STORE,
    )


def _machine(root: Path) -> BrokerStateMachine:
    return BrokerStateMachine(root, hash_slots=1000, max_index_records=5000)


async def _write_some(node: DLedgerNode, sm: BrokerStateMachine) -> None:
    deadline = time.monotonic() + LEADER_WAIT_S
    while node.role is not Role.LEADER:
        assert time.monotonic() < deadline, "no leader"
        await asyncio.sleep(POLL_S)
    await node.propose([encode_topic_record(TOPIC_UPSERT, TopicConfig("T"))], ENTRY_TOPIC)
    messages = [
        Message(
            topic="T",
            queue_id=0,
            body=f"body-{n}".encode(),
            tags="A",
            keys=(f"k{n}",),
            store_timestamp_ms=1_000_000 + n,
            uniq_id=IDS.next_id(),
        )
        for n in range(5)
    ]
    _, last, _ = await node.propose([encode_batch(messages)[0]], ENTRY_MESSAGES)
    deadline = time.monotonic() + APPLY_WAIT_S
    while sm.last_applied < last:
        assert time.monotonic() < deadline, "not applied"
        await asyncio.sleep(POLL_S)


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A broker store written by this release: a one-node group that elected itself, created
    a topic and stored five messages with keys, then stopped cleanly."""
    root = tmp_path_factory.mktemp("template") / "store"
    sm = _machine(root)
    node = DLedgerNode(_config(root), sm)
    sm.attach(LazyLog(node))

    async def go() -> None:
        await node.start()
        try:
            await _write_some(node, sm)
        finally:
            await node.stop()

    asyncio.run(go())
    sm.close()
    dledger_dir = root / "dledger"
    if not (dledger_dir / CONF_FILE).exists():  # a static group saves none until a change
        save_conf(str(dledger_dir), ConfState(frozenset({"n0"}), frozenset(), (), 1, ()))
    for needed in ("dledger/checkpoint", "dledger/meta", "config/snapshot.json", "index"):
        assert (root / needed).exists(), needed
    return root


@pytest.fixture
def store(template: Path, tmp_path: Path) -> Path:
    root = tmp_path / "store"
    shutil.copytree(template, root, symlinks=True)
    return root


def _tree(root: Path) -> dict[str, tuple[str, int]]:
    """Every file and directory under ``root`` (and the promise file beside the store):
    content hash and modification time."""
    out: dict[str, tuple[str, int]] = {}
    for path in sorted([root, *root.rglob("*")]):
        st = path.lstat()
        digest = "dir" if path.is_dir() else hashlib.sha256(path.read_bytes()).hexdigest()
        out[str(path.relative_to(root))] = (digest, st.st_mtime_ns)
    return out


def _start_refused(root: Path) -> str:
    """Start a node on ``root``; the StartError's line (the test fails if it starts)."""
    sm = _machine(root)
    node = DLedgerNode(_config(root), sm)
    sm.attach(LazyLog(node))

    async def go() -> str:
        try:
            await node.start()
        except StartError as exc:
            return str(exc)
        await node.stop()
        sm.close()
        return "started"

    return asyncio.run(go())


def _set_u16(path: Path, offset: int, value: int, crc_at: int | None = None) -> None:
    """Set a u16 of ``path``; with ``crc_at``, also rewrite the CRC32C kept there (of the bytes
    before it, -4: the last four bytes of the file), as a newer release writing the file
    would. Without it, the change is what a flipped bit does."""
    data = bytearray(path.read_bytes())
    data[offset : offset + 2] = struct.pack(">H", value)
    if crc_at is not None:
        at = crc_at % len(data)
        data[at : at + 4] = struct.pack(">I", crc32c(bytes(data[:at])))
    path.write_bytes(bytes(data))


def _edit_json(path: Path, edit: Callable[[dict[str, object]], None]) -> None:
    doc = json.loads(path.read_bytes())
    edit(doc)
    path.write_text(json.dumps(doc))


def _bump_membership_file(doc: dict[str, object]) -> None:
    assert doc.get("v") == 1  # this release writes its version
    doc["v"] = 2


def _bump_membership_body(doc: dict[str, object]) -> None:
    body = doc["config"]
    assert isinstance(body, dict)
    body["v"] = 2


def _bump_snapshot(doc: dict[str, object]) -> None:
    assert doc["version"] == 2
    doc["version"] = 3


def _index_file(root: Path) -> Path:
    (path,) = sorted((root / "index").iterdir())
    return path


def _stage_install(root: Path, version: int) -> None:
    """A snapshot install a crash interrupted: the marker and the staged header (as
    ``make_ready`` writes it), bumped to ``version``."""
    staging = root / "dledger" / STAGING_DIR
    ready = staging / "ready"
    for sub in ("log", "app"):
        (ready / sub).mkdir(parents=True)
    header = _header_dict(
        pb.SnapshotHeader(
            snapshot_index=9, snapshot_term=1, base_index=9, base_term=1, segment_size_bytes=1
        )
    )
    assert header["v"] == 1
    (ready / HEADER_FILE).write_text(json.dumps({**header, "v": version}))
    (staging / INSTALL_MARKER).write_bytes(b"")


BUMPS: dict[str, tuple[Callable[[Path], None], str, int, int]] = {
    # name: (bump the template, the file named, version found, newest this release reads)
    "checkpoint": (
        lambda r: _set_u16(r / "dledger/checkpoint", 4, 4, -4),
        "dledger/checkpoint",
        4,
        3,
    ),
    "meta": (lambda r: _set_u16(r / "dledger/meta", 4, 2, -4), "dledger/meta", 2, 1),
    "membership.json": (
        lambda r: _edit_json(r / "dledger" / CONF_FILE, _bump_membership_file),
        f"dledger/{CONF_FILE}",
        2,
        1,
    ),
    "membership CONFIG body": (
        lambda r: _edit_json(r / "dledger" / CONF_FILE, _bump_membership_body),
        f"dledger/{CONF_FILE}",
        2,
        1,
    ),
    "snapshot header.json": (
        lambda r: _stage_install(r, 2),
        f"dledger/{STAGING_DIR}/ready/{HEADER_FILE}",
        2,
        1,
    ),
    "broker snapshot.json": (
        lambda r: _edit_json(r / "config/snapshot.json", _bump_snapshot),
        "config/snapshot.json",
        3,
        2,
    ),
    "key index": (
        lambda r: _set_u16(_index_file(r), 4, 2, INDEX_HEADER_CRC_OFFSET),
        "index/",
        2,
        1,
    ),
}


@pytest.mark.parametrize("name", sorted(BUMPS))
def test_a_newer_file_stops_the_node_and_changes_nothing(store: Path, name: str) -> None:
    bump, named, found, newest = BUMPS[name]
    bump(store)
    promise = promise_file(str(store / "dledger"), "")
    before, promise_before = _tree(store), promise.read_bytes()
    line = _start_refused(store)
    assert str(store / named) in line, line
    assert f"format version {found} is newer than {newest}, the newest raftmq {RELEASE}" in line
    assert "\n" not in line
    assert _tree(store) == before
    assert promise.read_bytes() == promise_before


def test_the_store_written_by_this_release_starts(store: Path) -> None:
    """The control: the same store, not bumped, opens (so what stops the others is the bump)."""
    assert _start_refused(store) == "started"


def test_a_newer_meta_is_not_recovered_from_the_promise_copy(store: Path) -> None:
    """The reader itself, past the start's check: a newer ``meta`` is not damage, so the
    copy in the promise file does not replace it in the old format."""
    meta = store / "dledger/meta"
    _set_u16(meta, 4, 2, -4)
    before = meta.read_bytes()
    s = SegmentedLogStore(store / "dledger", STORE)
    try:
        with pytest.raises(FormatTooNewError) as info:
            recover("g", "n0", s, promise_file(str(store / "dledger"), ""), 0)
    finally:
        s.close()
    assert not isinstance(info.value, CorruptLogError) and info.value.code == E.FORMAT_TOO_NEW
    assert (info.value.found, info.value.newest) == (2, 1)
    assert meta.read_bytes() == before


def test_a_flipped_bit_in_the_version_is_damage_not_a_newer_release(store: Path) -> None:
    """A version field that reads newer but whose CRC fails is a flipped bit (the storage
    nemesis' "hardstate" fault): damage, which the node repairs as it did before versions
    were checked (``meta`` from the promise file's copy), never a reason to stop."""
    meta = store / "dledger/meta"
    _set_u16(meta, 4, 2)
    with pytest.raises(RecordError):
        codec.decode_hard_state(meta.read_bytes())
    check_store_formats(str(store / "dledger"), "n0")  # the start's look lets it through
    s = SegmentedLogStore(store / "dledger", STORE)
    try:
        recover("g", "n0", s, promise_file(str(store / "dledger"), ""), 0)
    finally:
        s.close()
    assert codec.decode_hard_state(meta.read_bytes()).term >= 1  # rewritten from the copy
    checkpoint = store / "dledger/checkpoint"
    _set_u16(checkpoint, 4, 4)
    with pytest.raises(RecordError):
        codec.decode_checkpoint(checkpoint.read_bytes())
    index = _index_file(store)
    _set_u16(index, 4, 2)
    check_formats(store / "index")  # left to the open, which reports a damaged header


def test_a_newer_broker_snapshot_is_not_rebuilt_from_the_log(store: Path) -> None:
    """The reader itself, past the start's check: the derived stores are kept."""
    _edit_json(store / "config/snapshot.json", _bump_snapshot)
    s = SegmentedLogStore(store / "dledger", STORE)
    sm = _machine(store)
    sm.attach(s)
    before = _tree(store / "consumequeue"), _tree(store / "index")
    try:
        with pytest.raises(BrokerFormatTooNewError) as info:
            sm.applied_index()
    finally:
        s.close()
    assert "broker snapshot" in str(info.value) and "version 3 is newer than 2" in str(info.value)
    assert (_tree(store / "consumequeue"), _tree(store / "index")) == before


def test_a_newer_key_index_is_not_corrupt_store(store: Path) -> None:
    from broker.state.indexfile import IndexStore

    _set_u16(_index_file(store), 4, 2, INDEX_HEADER_CRC_OFFSET)
    with pytest.raises(BrokerFormatTooNewError) as info:
        IndexStore(store, hash_slots=1000, max_records=5000)
    assert not isinstance(info.value, CorruptStoreError) and info.value.code == E.FORMAT_TOO_NEW


def test_a_newer_cluster_state_is_refused(tmp_path: Path) -> None:
    cluster = LocalCluster(tmp_path)
    cluster.group = "broker-a"
    cluster._save_state()
    path = tmp_path / STATE_FILE
    doc = json.loads(path.read_bytes())
    assert doc["version"] == 1
    path.write_text(json.dumps({**doc, "version": 2}))
    before = _tree(tmp_path)
    with pytest.raises(ClusterFormatTooNewError) as info:
        LocalCluster(tmp_path)
    assert isinstance(info.value, ClusterError) and info.value.code == E.FORMAT_TOO_NEW
    assert f"{path}: format version 2 is newer than 1" in str(info.value)
    assert _tree(tmp_path) == before


def test_mqcluster_says_one_line_for_a_newer_cluster_state(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cluster = LocalCluster(tmp_path)
    cluster.group = "broker-a"
    cluster._save_state()
    _edit_json(tmp_path / STATE_FILE, lambda d: d.update(version=2))
    assert cluster_main(["--base-dir", str(tmp_path), "status"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("mqcluster: cluster state ") and "\n" not in err
    assert "format version 2 is newer than 1" in err


def test_files_without_a_version_read_as_version_1(store: Path, tmp_path: Path) -> None:
    """Written before the version key existed: membership.json, header.json, cluster.json."""
    _edit_json(store / "dledger" / CONF_FILE, lambda d: d.pop("v"))
    assert _start_refused(store) == "started"
    (tmp_path / "c").mkdir()
    cluster = LocalCluster(tmp_path / "c")
    cluster.group = "broker-a"
    cluster._save_state()
    _edit_json(tmp_path / "c" / STATE_FILE, lambda d: d.pop("version"))
    assert LocalCluster(tmp_path / "c").group == "broker-a"


def test_a_staged_header_without_a_version_is_read(tmp_path: Path) -> None:
    from dledger.server.snapshots import pending_install

    root = tmp_path / "s"
    _stage_install(root, 1)
    path = root / "dledger" / STAGING_DIR / "ready" / HEADER_FILE
    _edit_json(path, lambda d: d.pop("v"))
    assert pending_install(str(root / "dledger")) == 9
    assert base64.b64decode(json.loads(path.read_bytes())["config"]) == b""


def test_mqaudit_stops_on_a_newer_store_instead_of_reporting_damage(store: Path) -> None:
    """The audit reads checkpoints with the store's decoder: a newer one is an input it cannot
    read (one line), not a BAD_CHECKPOINT finding against the replica."""
    from spark_audit.plan import InputError, ReplicaSource, plan_replica

    _set_u16(store / "dledger/checkpoint", 4, 4, -4)
    with pytest.raises(InputError) as info:
        plan_replica(ReplicaSource("g", "n0", str(store / "dledger")))
    assert "format version 4 is newer than 3" in str(info.value)
