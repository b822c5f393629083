"""The server's side of membership: the saved configuration and the address book."""

from __future__ import annotations

from pathlib import Path

import pytest

from dledger.core import ChangeKind, ConfChange, ConfState
from dledger.log import ConfigError
from dledger.server.membership import CONF_FILE, AddressBook, load_conf, save_conf


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
