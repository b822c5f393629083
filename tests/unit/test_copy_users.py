"""Copying users between broker groups (ExportUsers / ImportUsers, mqadmin copyUser): secrets
travel sealed under the cluster's acl.key, a user sealed under another key or any bad field is
refused with nothing proposed, importing twice changes nothing, and only Super users may call.
Two one-node groups on real state machines and in-memory logs (tests/broker_world.py)."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path

import pytest
from broker_world import world
from raftmq.broker.v1 import broker_pb2 as bpb

from broker.components.applied import NodeContext
from broker.components.authadmin import MAX_IMPORT_USERS, AuthAdmin, UserNotFoundError
from broker.components.settings import ServiceConfig
from broker.frontends import rpcmap
from broker.frontends.authguard import AuthGuard, AuthSettings
from broker.state.auth.model import User
from broker.state.auth.secrets import SecretBox
from broker.state.errors import InvalidRequestError
from dledger.core import Role
from dledger.core.errors import NotLeaderError
from mqsecurity.credentials import Credentials
from mqsecurity.signing import signed_metadata

CLUSTER_KEY = SecretBox(bytes(range(32)))
OTHER_KEY = SecretBox(bytes(range(1, 33)))
ADMIN = Credentials("admin", "admin-secret-1")
ALICE = Credentials("alice", "alice-secret-1")
BOB = Credentials("bob", "bob-secret-12")
PEER = "ipv4:127.0.0.1:40000"


def group(root: Path, box: SecretBox) -> AuthAdmin:
    node, sm, _, _ = world(root)
    ctx = NodeContext(node, sm, ServiceConfig("127.0.0.1", 10911))  # type: ignore[arg-type]
    admin = AuthAdmin(ctx, box)
    asyncio.run(admin.create_user(ADMIN.access_key, ADMIN.secret_key, "Super", ""))
    return admin


def proposals(admin: AuthAdmin) -> int:
    return admin.ctx.node.proposals  # type: ignore[attr-defined, no-any-return]


def test_export_then_import_round_trip_is_idempotent(tmp_path: Path) -> None:
    source, target = group(tmp_path / "a", CLUSTER_KEY), group(tmp_path / "b", CLUSTER_KEY)
    asyncio.run(source.create_user(ALICE.access_key, ALICE.secret_key, "", ""))
    asyncio.run(source.create_user(BOB.access_key, BOB.secret_key, "Super", "disable"))
    exported = source.export_users()
    assert [u.username for u in exported] == ["admin", "alice", "bob"]
    assert all(ALICE.secret_key not in repr(u) for u in exported)  # never in clear

    done = asyncio.run(target.import_users(exported))
    assert (done.created, done.updated, done.unchanged) == (["alice", "bob"], [], ["admin"])
    for name, secret in (("alice", ALICE.secret_key), ("bob", BOB.secret_key)):
        copied = target.table.users[name]
        assert copied == source.table.users[name]  # the record as stored, sealed the same
        assert CLUSTER_KEY.unseal(name, copied.sealed_secret) == secret
    assert target.get_user("bob").status == "disable"

    before = proposals(target)
    again = asyncio.run(target.import_users(source.export_users()))
    assert (again.created, again.updated) == ([], [])
    assert proposals(target) == before  # nothing proposed the second time

    # A changed user on the source is updated on the target; one user only by name.
    asyncio.run(source.update_user("alice", "alice-new-pw-1", "", ""))
    one = source.export_users("alice")
    assert [u.username for u in one] == ["alice"]
    assert asyncio.run(target.import_users(one)).updated == ["alice"]
    assert CLUSTER_KEY.unseal("alice", target.table.users["alice"].sealed_secret) == (
        "alice-new-pw-1"
    )
    with pytest.raises(UserNotFoundError):
        source.export_users("ghost")


def test_a_user_sealed_under_another_key_is_refused_and_nothing_changes(tmp_path: Path) -> None:
    other = group(tmp_path / "other", OTHER_KEY)
    asyncio.run(other.create_user(ALICE.access_key, ALICE.secret_key, "", ""))
    target = group(tmp_path / "b", CLUSTER_KEY)
    before, users = proposals(target), dict(target.table.users)
    with pytest.raises(InvalidRequestError, match=r"another acl\.key"):
        asyncio.run(target.import_users(other.export_users()))
    assert proposals(target) == before and target.table.users == users


def _hostile(good: User) -> list[tuple[list[User], str]]:
    """(users, the error expected): each breaks one rule."""
    swap = dataclasses.replace
    return [
        ([], "1..1000 users"),
        ([good] * (MAX_IMPORT_USERS + 1), "1..1000 users"),
        ([good, good], "given twice"),
        ([swap(good, username="")], "username"),
        ([swap(good, username="x" * 65)], "username"),
        ([swap(good, username="al ice")], "username"),
        ([swap(good, user_type="Root")], "type"),
        ([swap(good, status="")], "status"),
        ([swap(good, sealed_secret="")], "sealed secret"),
        ([swap(good, sealed_secret="%%%")], "base64"),
        ([swap(good, sealed_secret="A" * 4000)], "sealed secret"),
        ([swap(good, sealed_secret="QUFB")], "too short"),
        # The username is the sealing's associated data: a secret moved to another user fails.
        ([swap(good, username="mallory")], r"another acl\.key"),
    ]


def test_hostile_records_are_refused_and_nothing_changes(tmp_path: Path) -> None:
    source, target = group(tmp_path / "a", CLUSTER_KEY), group(tmp_path / "b", CLUSTER_KEY)
    asyncio.run(source.create_user(ALICE.access_key, ALICE.secret_key, "", ""))
    good = source.export_users("alice")[0]
    before, users = proposals(target), dict(target.table.users)
    for bad, error in _hostile(good):
        with pytest.raises(InvalidRequestError, match=error):
            asyncio.run(target.import_users(bad))
        # One bad user among good ones: none of them is written.
        if len(bad) == 1:
            with pytest.raises(InvalidRequestError, match=error):
                asyncio.run(target.import_users([*bad, swap_name(good, "zed")]))
    assert proposals(target) == before and target.table.users == users
    keyless = AuthAdmin(target.ctx, None)
    with pytest.raises(InvalidRequestError, match="aclEncryptionKeyPath"):
        asyncio.run(keyless.import_users([good]))


def swap_name(user: User, name: str) -> User:
    """``user`` under another name, sealed properly for it (a good record)."""
    secret = CLUSTER_KEY.unseal(user.username, user.sealed_secret)
    return dataclasses.replace(user, username=name, sealed_secret=CLUSTER_KEY.seal(name, secret))


def test_only_super_users_may_export_or_import(tmp_path: Path) -> None:
    source = group(tmp_path / "a", CLUSTER_KEY)
    asyncio.run(source.create_user(ALICE.access_key, ALICE.secret_key, "", ""))
    asyncio.run(source.put_acl("User:alice", ["Cluster:*"], ["All"], "Allow", [], update=False))
    guard = AuthGuard(source.ctx.sm, AuthSettings(True, True, cluster_name="c1"), CLUSTER_KEY)
    calls = {
        "ExportUsers": bpb.ExportUsersRequest(),
        "ImportUsers": bpb.ImportUsersRequest(),
    }
    for method, request in calls.items():
        path = rpcmap.BROKER + method
        assert rpcmap.RPC_NEEDS[path] == rpcmap.SUPER_ONLY
        # Even a Normal user allowed everything on the cluster is refused.
        refused = guard.check(path, dict(signed_metadata(ALICE)), PEER, request)
        assert refused is not None and "Super" in refused.reason
        assert guard.check(path, dict(signed_metadata(ADMIN)), PEER, request) is None


def test_a_follower_answers_not_leader_before_reading_its_table(tmp_path: Path) -> None:
    """copyUser then copyAcl through a follower: the follower may not have applied the user
    the leader just imported; its answer must be NOT_LEADER (the client follows it), not
    'no such user' from its stale table."""
    follower = group(tmp_path / "b", CLUSTER_KEY)
    follower.ctx.node.role = Role.FOLLOWER  # type: ignore[misc]
    writes = [
        follower.create_user("dave", "dave-secret-1", "", ""),
        follower.update_user("ghost", "", "", "disable"),
        follower.delete_user("ghost"),
        follower.put_acl("User:ghost", ["Topic:t"], ["Pub"], "", [], update=False),
        follower.delete_acl("User:ghost", []),
        follower.import_users(source_users(tmp_path)),
    ]
    for write in writes:
        with pytest.raises(NotLeaderError):
            asyncio.run(write)


def source_users(tmp_path: Path) -> list[User]:
    source = group(tmp_path / "a", CLUSTER_KEY)
    asyncio.run(source.create_user(ALICE.access_key, ALICE.secret_key, "", ""))
    return source.export_users()
