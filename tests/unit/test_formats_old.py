"""Stores written by each earlier release open with this tree, and their state reads back.

The fixtures (tests/fixtures/formats/<tag>.tar.gz, made by tests/fixtures/make_formats.py from
the tag's own tree) are a one-node store plus broker root with every record type that release
had. The broker's snapshot covers the first half of the log; the second half is applied here,
so both the old snapshot document and the old records are read by today's code. What the old
release's state machine held after the whole log is in the fixture's ``expected.json``; this
tree must hold the same (docs/FORMAT.md "Format versions": a reader opens every older version
the previous releases wrote; docs/UPGRADE.md).
"""

from __future__ import annotations

import json
import struct
import tarfile
from pathlib import Path
from typing import Any

import pytest
from fixtures.make_formats import (
    ACL_KEY,
    CQ_RECORDS_PER_FILE,
    HASH_SLOTS,
    MAX_INDEX_RECORDS,
    RELEASES,
    dump_state,
    extract_tar,
    store_config,
)

from broker.state.auth.secrets import SecretBox
from broker.state.machine import BrokerStateMachine
from dledger.core.membership import ConfState
from dledger.log import HardState
from dledger.server.formats import check_store_formats
from dledger.server.membership import load_conf
from dledger.storage import codec
from dledger.storage.promise import read_promise
from dledger.storage.store import SegmentedLogStore
from msgcodec import Message, decode_message

FORMATS = Path(__file__).resolve().parents[1] / "fixtures" / "formats"
# The checkpoint each release wrote: v0.1.0's format 1 (IDX1 index records, migrated on open:
# the index is rebuilt and format 2 written), v0.2.0's format 2 (opened as it is). Facts about
# the files, so numbers, not this tree's constants.
CHECKPOINT_WRITTEN = {"v0.1.0": 1, "v0.2.0": 2}
INDEX_MAGIC_WRITTEN = {"v0.1.0": codec.INDEX_MAGIC_V1, "v0.2.0": codec.INDEX_MAGIC}
# What this tree writes when it opens a store of a group at the baseline feature level (a
# one-node store never raised one): checkpoint format 2, which the previous release still
# reads (format 3 only once the group's level is raised, docs/UPGRADE.md).
CHECKPOINT_AT_BASELINE = 2
# The 64-byte index record of Raft index 1 (the slot of index 0 is never written).
INDEX_RECORD_BYTES = 64
# A fixture is committed to the repository: it stays small (about 25 KB today).
MAX_FIXTURE_BYTES = 64 << 10


def extract(tag: str, into: Path) -> tuple[Path, dict[str, Any]]:
    """The release's fixture extracted into ``into``: (broker root, expected.json)."""
    with tarfile.open(FORMATS / f"{tag}.tar.gz") as tar:
        extract_tar(tar, into)
    expected = json.loads((into / "expected.json").read_text())
    assert expected["release"] == tag and expected["commit"] == RELEASES[tag]
    return into, expected


def checkpoint_version(store_dir: Path) -> int:
    return int(struct.unpack_from(">H", (store_dir / "checkpoint").read_bytes(), 4)[0])


def first_index_magic(store_dir: Path) -> int:
    raw = (store_dir / "index" / f"{0:020d}").read_bytes()
    return int(struct.unpack_from(">I", raw, INDEX_RECORD_BYTES)[0])


def open_broker(root: Path, store: SegmentedLogStore) -> BrokerStateMachine:
    sm = BrokerStateMachine(
        root,
        hash_slots=HASH_SLOTS,
        max_index_records=MAX_INDEX_RECORDS,
        cq_records_per_file=CQ_RECORDS_PER_FILE,
    )
    sm.check_formats()  # what the node asks at start, before anything is opened
    sm.attach(store)
    return sm


def message_at(store: SegmentedLogStore, position: int) -> Message:
    (size,) = struct.unpack(">I", store.read_at(position, 4))  # a message's total size leads
    return decode_message(store.read_at(position, size))


@pytest.fixture(params=sorted(RELEASES))
def release(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def test_fixture_is_a_store_of_that_release(release: str, tmp_path: Path) -> None:
    root, expected = extract(release, tmp_path)
    store_dir = root / expected["store_dir"]
    assert checkpoint_version(store_dir) == CHECKPOINT_WRITTEN[release]
    assert first_index_magic(store_dir) == INDEX_MAGIC_WRITTEN[release]
    assert (root / f"{expected['store_dir']}.promise").exists() == expected["promise"]
    assert set(expected["entry_types"]) == {1, 2, *range(16, 25)}  # every record type
    assert (FORMATS / f"{release}.tar.gz").stat().st_size < MAX_FIXTURE_BYTES


def test_dledger_store_opens_and_every_entry_reads_back(release: str, tmp_path: Path) -> None:
    root, expected = extract(release, tmp_path)
    store_dir = root / expected["store_dir"]
    node = expected["node"]
    check_store_formats(str(store_dir), node)  # the start's refusal of newer formats: none
    store = SegmentedLogStore(store_dir, store_config())
    try:
        assert (store.first_index(), store.last_index()) == (1, expected["last_index"])
        types = [store.read(i).type for i in range(1, store.last_index() + 1)]
        assert types == expected["entry_types"]
        assert store.load_hard_state() == HardState(term=1, voted_for=node)
    finally:
        store.close()
    # Whatever the release wrote, the store is format 2 once this release opened it.
    assert checkpoint_version(store_dir) == CHECKPOINT_AT_BASELINE
    assert first_index_magic(store_dir) == codec.INDEX_MAGIC
    conf = load_conf(str(store_dir), node)
    assert conf == ConfState(voters=frozenset({node}), index=2)
    promise = read_promise(root / f"{expected['store_dir']}.promise")
    if expected["promise"]:
        assert promise is not None and promise.promised_index == expected["last_index"]
        assert (promise.group, promise.node_id) == (expected["group"], node)
    else:
        assert promise is None


def test_broker_state_reads_back(release: str, tmp_path: Path) -> None:
    root, expected = extract(release, tmp_path)
    store = SegmentedLogStore(root / expected["store_dir"], store_config())
    try:
        sm = open_broker(root, store)
        assert sm.applied_index() == expected["snapshot_applied"]  # the old snapshot loaded
        sm.apply([store.read(i) for i in range(sm.applied_index() + 1, store.last_index() + 1)])
        assert sm.skip_log.skipped == 0  # every old record applied, none passed over
        assert dump_state(sm, store) == expected["state"]
        # The users' secrets, sealed by the old release, open with the same key file today.
        box = SecretBox(ACL_KEY)
        for name, user in sm.auth.users.items():
            assert box.unseal(name, user.sealed_secret) == f"{name}-secret"
        # The old key index answers a key lookup (the first message sent had key-1).
        first = expected["state"]["messages"]["Orders/0"][0]
        hits = sm.index.query_key("Orders", first[2][0], 10)
        assert [message_at(store, p).uniq_id for p in hits] == [first[0]]
        sm.close()  # this release's snapshot of the old state
        again = open_broker(root, store)
        assert again.applied_index() == expected["last_index"]
        assert dump_state(again, store) == expected["state"]
        again.close()
    finally:
        store.close()
