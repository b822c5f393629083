"""The replicated user/ACL records: codec, apply rules, hostile bytes skipped identically by
every member, snapshots, and secrets sealed at rest."""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

import pytest

from broker.state.auth import records as rec
from broker.state.auth.model import MAX_RULES_PER_SUBJECT, MAX_USERS
from broker.state.auth.secrets import (
    SecretBox,
    check_sealed,
    generate_key_file,
    load_key_file,
)
from broker.state.auth.table import AuthTable
from broker.state.errors import ConfigError, InvalidRequestError
from broker.state.machine import BrokerStateMachine
from broker.state.records import ENTRY_AUTH
from dledger.log import Entry

BOX = SecretBox(bytes(range(32)))


def user_doc(name: str, secret: str = "s3cret-pw", **kw: str) -> dict[str, str]:
    return {"username": name, "secret": BOX.seal(name, secret), **kw}


def rule(resource: str, *actions: str, decision: str = "Allow") -> dict[str, object]:
    return {"resource": resource, "actions": list(actions), "decision": decision}


def apply(table: AuthTable, op: int, doc: dict[str, object], index: int = 1) -> None:
    table.apply(index, rec.encode_auth_record(op, doc))


def test_users_create_update_delete() -> None:
    table = AuthTable()
    apply(table, rec.USER_CREATE, user_doc("alice", type="Normal"))
    assert table.users["alice"].user_type == "Normal" and table.users["alice"].enabled
    apply(table, rec.USER_UPDATE, {"username": "alice", "status": "disable"}, 2)
    assert not table.users["alice"].enabled
    assert BOX.unseal("alice", table.users["alice"].sealed_secret) == "s3cret-pw"
    with pytest.raises(InvalidRequestError, match="already exists"):
        apply(table, rec.USER_CREATE, user_doc("alice"), 3)
    assert table.outcome(3) and table.outcome(2) == ""
    apply(table, rec.ACL_CREATE, {"subject": "User:alice", "rules": [rule("Topic:t", "Pub")]}, 4)
    apply(table, rec.USER_DELETE, {"username": "alice"}, 5)
    assert table.users == {} and table.acls == {}


def test_init_user_only_into_an_empty_table() -> None:
    table = AuthTable()
    apply(table, rec.USER_INIT, user_doc("admin", type="Super"))
    with pytest.raises(InvalidRequestError, match="already has users"):
        apply(table, rec.USER_INIT, user_doc("admin2", type="Super"), 2)
    assert list(table.users) == ["admin"]


def test_acl_create_update_delete() -> None:
    table = AuthTable()
    apply(table, rec.USER_CREATE, user_doc("bob"))
    subject = "User:bob"
    apply(
        table,
        rec.ACL_CREATE,
        {"subject": subject, "rules": [rule("Topic:a", "Pub"), rule("Group:g", "Sub")]},
        2,
    )
    with pytest.raises(InvalidRequestError, match="already has rules"):
        apply(table, rec.ACL_CREATE, {"subject": subject, "rules": [rule("Topic:a", "Sub")]}, 3)
    with pytest.raises(InvalidRequestError, match="has no rules for"):
        apply(table, rec.ACL_UPDATE, {"subject": subject, "rules": [rule("Topic:zz", "Sub")]}, 4)
    apply(
        table,
        rec.ACL_UPDATE,
        {"subject": subject, "rules": [rule("Topic:a", "Sub", decision="Deny")]},
        5,
    )
    assert [(str(r.resource), r.actions, r.decision) for r in table.acls[subject]] == [
        ("Group:g", ("Sub",), "Allow"),
        ("Topic:a", ("Sub",), "Deny"),
    ]
    apply(table, rec.ACL_DELETE, {"subject": subject, "resources": ["Topic:a"]}, 6)
    assert [str(r.resource) for r in table.acls[subject]] == ["Group:g"]
    apply(table, rec.ACL_DELETE, {"subject": subject, "resources": []}, 7)
    assert subject not in table.acls
    with pytest.raises(InvalidRequestError, match="no such user"):
        apply(
            table, rec.ACL_CREATE, {"subject": "User:nobody", "rules": [rule("Topic:a", "Pub")]}, 8
        )


def test_limits() -> None:
    table = AuthTable()
    apply(table, rec.USER_CREATE, user_doc("u"))
    too_many = [rule(f"Topic:t{i}", "Pub") for i in range(MAX_RULES_PER_SUBJECT + 1)]
    with pytest.raises(InvalidRequestError):
        apply(table, rec.ACL_CREATE, {"subject": "User:u", "rules": too_many}, 2)
    sealed = BOX.seal("x", "s3cret-pw")
    for i in range(MAX_USERS - 1):
        table.users[f"x{i}"] = table.users["u"]  # fill the table without sealing 1000 times
    with pytest.raises(InvalidRequestError, match="users"):
        apply(table, rec.USER_CREATE, {"username": "late", "secret": sealed}, 3)
    with pytest.raises(InvalidRequestError):
        rec.encode_auth_record(rec.ACL_CREATE, {"x": "y" * rec.MAX_RECORD_BYTES})


def _state(root: Path) -> BrokerStateMachine:
    from broker_world import MemoryLog

    sm = BrokerStateMachine(root, hash_slots=100, max_index_records=100)
    sm.attach(MemoryLog())
    sm.applied_index()
    return sm


HOSTILE = [
    b"",
    b"\x01",
    b"\x02\x02{}",
    b"\x01\x63{}",
    b"\x01\x02\xff\xfe",
    b"\x01\x02[]",
    b"\x01\x02" + b"[" * 60_000,  # nesting deeper than the JSON decoder's recursion limit
    b"\x01\x02" + json.dumps({"username": "a" * 65, "secret": "x"}).encode(),
    b"\x01\x02" + json.dumps({"username": "a", "secret": "not base64!"}).encode(),
    b"\x01\x02" + json.dumps({"username": "a", "secret": "QUFB"}).encode(),
    b"\x01\x02" + json.dumps({"username": "a", "secret": 5}).encode(),
    b"\x01\x05" + json.dumps({"subject": "User:a", "rules": "x"}).encode(),
    b"\x01\x05" + json.dumps({"subject": "Role:a", "rules": []}).encode(),
    b"\x01\x07" + json.dumps({"subject": "User:a", "resources": [1]}).encode(),
    b"\x01\x03" + json.dumps({"username": "ghost", "type": "Super"}).encode(),
]


def test_hostile_records_are_skipped_identically_by_every_member(tmp_path: Path) -> None:
    members = [_state(tmp_path / f"n{i}") for i in range(3)]
    rng = random.Random(18)
    bodies = list(HOSTILE)
    good = rec.encode_auth_record(rec.USER_CREATE, user_doc("alice"))
    bodies += [bytes(rng.randrange(256) for _ in range(rng.randrange(1, 80))) for _ in range(200)]
    bodies += [good[: rng.randrange(len(good))] for _ in range(50)]
    bodies.append(good)
    entries = [Entry(term=1, index=i + 1, body=b, type=ENTRY_AUTH) for i, b in enumerate(bodies)]
    for sm in members:
        sm.apply(entries)
    tables = [json.dumps(sm.auth.to_snapshot(), sort_keys=True) for sm in members]
    assert tables[0] == tables[1] == tables[2]
    assert list(members[0].auth.users) == ["alice"]
    assert all(sm.last_applied == len(bodies) for sm in members)
    for sm in members:
        sm.close()


def test_snapshot_keeps_users_and_rules_sealed(tmp_path: Path) -> None:
    from broker_world import MemoryLog

    sm = _state(tmp_path)
    log = sm.log
    assert isinstance(log, MemoryLog)
    for op, doc in [
        (rec.USER_CREATE, user_doc("alice", "alice-plain-secret")),
        (rec.ACL_CREATE, {"subject": "User:alice", "rules": [rule("Topic:order-*", "Pub")]}),
    ]:
        sm.apply([log.add(rec.encode_auth_record(op, doc), ENTRY_AUTH)])
    sm.close()
    raw = (tmp_path / "config" / "snapshot.json").read_bytes()
    assert b"alice-plain-secret" not in raw and b"order-*" in raw
    again = BrokerStateMachine(tmp_path, hash_slots=100, max_index_records=100)
    again.attach(log)
    again.applied_index()
    assert BOX.unseal("alice", again.auth.users["alice"].sealed_secret) == "alice-plain-secret"
    assert [str(r.resource) for r in again.auth.acls["User:alice"]] == ["Topic:order-*"]
    again.close()


def test_hostile_snapshot_entries_are_left_out() -> None:
    table = AuthTable()
    good = BOX.seal("ok", "s3cret-pw")
    bad = table.load_snapshot(
        {
            "users": {"ok": [good, "Normal", "enable"], "b@d": [good, "Normal", "enable"], "x": 5},
            "acls": {"User:ok": [rule("Topic:t", "Pub")], "User:ghost": [rule("Topic:t", "Pub")]},
        }
    )
    assert list(table.users) == ["ok"] and list(table.acls) == ["User:ok"]
    assert len(bad) == 3


def test_secret_box(tmp_path: Path) -> None:
    sealed = BOX.seal("alice", "pw-12345678")
    assert "pw-12345678" not in sealed and check_sealed(sealed) == sealed
    assert BOX.seal("alice", "pw-12345678") != sealed  # fresh nonce
    with pytest.raises(InvalidRequestError):
        BOX.unseal("mallory", sealed)  # the username is bound in
    with pytest.raises(InvalidRequestError):
        SecretBox(bytes(32)).unseal("alice", sealed)
    path = str(tmp_path / "acl.key")
    generate_key_file(path)
    assert os.stat(path).st_mode & 0o777 == 0o600
    box = load_key_file(path)
    assert box.unseal("a", box.seal("a", "pw-12345678")) == "pw-12345678"
    os.chmod(path, 0o644)
    with pytest.raises(ConfigError, match="chmod 600"):
        load_key_file(path)
    os.chmod(path, 0o600)
    Path(path).write_text("abcd\n")
    with pytest.raises(ConfigError, match="64 hex digits"):
        load_key_file(path)
    with pytest.raises(ConfigError, match="cannot open"):
        load_key_file(str(tmp_path / "missing"))
