"""The server's side of membership: the saved configuration and the address book."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

import pytest

from dledger.core import ChangeKind, ConfChange, ConfState
from dledger.log import ConfigError
from dledger.server.membership import (
    CONF_FILE,
    MAX_REFUSED_JOINS,
    MAX_SHARED_SETTINGS,
    AddressBook,
    IncompatibleStoreError,
    RefusedJoins,
    check_shared_settings,
    load_conf,
    save_conf,
)
from dledger.server.node import NodeConfig
from dledger.storage import StoreConfig


def test_saved_configuration_round_trips(tmp_path: Path) -> None:
    assert load_conf(str(tmp_path), "n0") is None
    conf = ConfState(frozenset({"n0", "n1", "n2"})).apply(
        ConfChange(ChangeKind.ADD_LEARNER, "n3", "h:4", "h:14"), 42
    )
    save_conf(str(tmp_path), conf)
    assert load_conf(str(tmp_path), "n0") == conf
    save_conf(str(tmp_path), conf, is_joining=True)
    joining = load_conf(str(tmp_path), "n9")
    assert joining is not None and joining.voters == frozenset() and joining.learners == {"n9"}
    assert not (tmp_path / (CONF_FILE + ".tmp")).exists()


@pytest.mark.parametrize(
    "text",
    [
        "",
        "{",
        "[]",
        '{"index": -1, "config": {}}',
        '{"index": 3, "config": {"v": 1, "voters": [], "learners": [], "removed": []}}',
        '{"index": "3", "config": {"v": 1, "voters": ["a"], "learners": [], "removed": []}}',
        " " * (70 << 10),
    ],
)
def test_a_damaged_file_is_a_clear_config_error(tmp_path: Path, text: str) -> None:
    (tmp_path / CONF_FILE).write_text(text)
    with pytest.raises(ConfigError, match="not a membership file"):
        load_conf(str(tmp_path), "n0")


def test_address_book_prefers_the_settings_then_the_configuration_then_what_it_learnt() -> None:
    book = AddressBook({"n0": "h:1", "n1": "h:2"}, {"n0": "h:11"})
    book.learn("n1", "x:2", "x:12")
    book.learn("n5", "x:5", "x:15")
    assert (book.peer_addr("n0"), book.client_addr("n0")) == ("h:1", "h:11")
    assert book.peer_addr("n1") == "h:2"  # the settings win over what a joiner was told
    assert book.peer_addr("n5") == "x:5" and book.peer_addr("n7") == ""
    conf = ConfState(frozenset({"n0", "n1"})).apply(
        ConfChange(ChangeKind.ADD_VOTER, "n2", "h:3", "h:13"), 7
    )
    book.update(conf)
    assert book.client_addr("n2") == "h:13"
    assert book.in_use(conf) == {"h:1": "n0", "h:11": "n0", "h:2": "n1", "h:3": "n2", "h:13": "n2"}
    assert book.known(conf.members) == {
        "n0": ("h:1", "h:11"),
        "n1": ("h:2", ""),
        "n2": ("h:3", "h:13"),
    }


GROUP_SETTINGS = {"mappedFileSizeCommitLog": "1073741824", "dedupWindowSeconds": "600"}


def test_a_join_with_other_shared_settings_is_refused_naming_each_and_both_values() -> None:
    check_shared_settings("g", GROUP_SETTINGS, dict(GROUP_SETTINGS), "n3")  # the same: fine
    theirs = {"mappedFileSizeCommitLog": "65536", "extra": "1"}
    with pytest.raises(IncompatibleStoreError) as info:
        check_shared_settings("g", GROUP_SETTINGS, theirs, "n3")
    text = str(info.value)
    assert info.value.code == "INCOMPATIBLE_STORE"
    assert "'mappedFileSizeCommitLog' is '65536' on n3, '1073741824' in the group" in text
    # Missing on either side differs too (a node of another version).
    assert "'dedupWindowSeconds' is unset on n3, '600' in the group" in text
    assert "'extra' is '1' on n3, unset in the group" in text
    # A hostile request cannot make the refusal long.
    many = {f"k{i}" * 40: "v" * 500 for i in range(MAX_SHARED_SETTINGS)}
    with pytest.raises(IncompatibleStoreError) as info:
        check_shared_settings("g", GROUP_SETTINGS, many, "n3")
    assert len(str(info.value)) < 1000 and "more" in str(info.value)
    with pytest.raises(IncompatibleStoreError, match="at most"):
        check_shared_settings("g", GROUP_SETTINGS, {**many, "x": "y"}, "n3")


def test_the_leader_refuses_adding_or_promoting_a_node_whose_join_it_refused() -> None:
    refused = RefusedJoins()
    with pytest.raises(IncompatibleStoreError):
        refused.check("g", GROUP_SETTINGS, {}, "n3")
    for kind in (ChangeKind.ADD_LEARNER, ChangeKind.ADD_VOTER, ChangeKind.PROMOTE):
        with pytest.raises(IncompatibleStoreError, match="n3 cannot join group g"):
            refused.check_change(kind, "n3")
    refused.check_change(ChangeKind.REMOVE, "n3")  # removing it is always possible
    refused.check_change(ChangeKind.ADD_LEARNER, "n4")  # no Join seen: nothing known
    refused.check("g", GROUP_SETTINGS, dict(GROUP_SETTINGS), "n3")  # fixed and restarted
    refused.check_change(ChangeKind.PROMOTE, "n3")
    for i in range(MAX_REFUSED_JOINS + 1):  # bounded: the oldest goes first
        with pytest.raises(IncompatibleStoreError):
            refused.check("g", GROUP_SETTINGS, {}, f"m{i}")
    refused.check_change(ChangeKind.PROMOTE, "m0")
    with pytest.raises(IncompatibleStoreError):
        refused.check_change(ChangeKind.PROMOTE, f"m{MAX_REFUSED_JOINS}")


def test_a_node_config_always_shares_its_segment_size(tmp_path: Path) -> None:
    peers = {"n0": "127.0.0.1:1"}
    store = StoreConfig(segment_size_bytes=1 << 20)
    cfg = NodeConfig("g", "n0", peers, "127.0.0.1", 2, str(tmp_path), store)
    assert cfg.all_shared_settings() == {"segment_size_bytes": str(1 << 20)}
    cfg = NodeConfig(
        "g",
        "n0",
        peers,
        "127.0.0.1",
        2,
        str(tmp_path),
        store,
        segment_size_setting="mappedFileSizeCommitLog",
        shared_settings={"dedupWindowSeconds": "600"},
    )
    assert cfg.all_shared_settings() == {
        "dedupWindowSeconds": "600",
        "mappedFileSizeCommitLog": str(1 << 20),
    }
    with pytest.raises(ConfigError, match="the node adds it"):
        NodeConfig(
            "g",
            "n0",
            peers,
            "127.0.0.1",
            2,
            str(tmp_path),
            shared_settings={"segment_size_bytes": "1"},
        )


def test_the_configuration_is_written_whole_and_durably(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A full disk can make ``write(2)`` take fewer bytes than asked: the rest must follow,
    never a truncated membership.json renamed into place. The file is fsynced before the
    rename and the directory after it."""
    conf = ConfState(frozenset({"n0", "n1", "n2"})).apply(
        ConfChange(ChangeKind.ADD_LEARNER, "n3", "h:4", "h:14"), 42
    )
    real_write, real_fsync, real_replace = os.write, os.fsync, os.replace
    events: list[str] = []

    def short_write(fd: int, data: bytes | memoryview) -> int:  # at most 7 bytes a call
        events.append("write")
        return real_write(fd, bytes(data[:7]))

    def fsync(fd: int) -> None:
        events.append("fsync dir" if stat.S_ISDIR(os.fstat(fd).st_mode) else "fsync file")
        real_fsync(fd)

    def replace(src: Any, dst: Any) -> None:
        events.append("rename")
        real_replace(src, dst)

    monkeypatch.setattr(os, "write", short_write)
    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    save_conf(str(tmp_path), conf)
    monkeypatch.undo()
    assert events.count("write") > 1  # the file is longer than one short write
    assert [e for e in events if e != "write"] == ["fsync file", "rename", "fsync dir"]
    assert load_conf(str(tmp_path), "n0") == conf
    assert not (tmp_path / (CONF_FILE + ".tmp")).exists()


def test_a_joiner_below_the_groups_feature_level_is_refused() -> None:
    """docs/RAFT.md section 14: the leader would send it nothing; a release before feature
    levels sends no level (0, read as level 1)."""
    from dledger.log import FeatureLevelError
    from dledger.server.membership import check_joiner_level

    check_joiner_level("g", "n3", 0, 1)  # an old joiner in a group that never raised
    check_joiner_level("g", "n3", 2, 2)
    with pytest.raises(FeatureLevelError, match="n3' supports feature levels up to 1, but") as e:
        check_joiner_level("g", "n3", 0, 2)
    assert e.value.code == "FEATURE_LEVEL_UNSUPPORTED" and "group g is at level 2" in str(e.value)
