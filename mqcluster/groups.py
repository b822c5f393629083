"""A cluster of several broker groups on this machine: one CA, one NameServer and one set of
users for all of them (docs/CLUSTER.md "Several broker groups").

The first group is an ordinary :class:`LocalCluster` in the base dir: it runs the NameServer
and holds the security files (CA, admin credentials, ACL key). Every other group lives in
``<base>/groups/<name>/`` as a :class:`LocalCluster` of its own that registers with the first
group's NameServer and takes its certificates from the same CA (``SharedParts``); the first
group's cluster.json lists them under ``groups``. So a cluster of one group is exactly what
``mqcluster up`` made before groups existed.

A group added to a running cluster gets, once it has a leader and before this returns:

- every topic the first group serves (same queue counts, permission and message type), so
  producers and consumers that refresh their routes spread over it;
- every user of the first group, however it was made (``mqcluster add-user``, ``mqadmin
  createUser``), copied with its secret sealed as stored (``ExportUsers`` on the first group,
  ``ImportUsers`` on the new one: every group shares the cluster's ``acl.key``, so the sealed
  secret opens there; no secret is ever in clear on the way), and every user recorded with
  ``mqcluster add-user`` (``<base>/users/<name>.json``, 0600) the first group may have lost;
- every ACL rule of the first group.
"""

from __future__ import annotations

import re
import secrets
import shutil
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import grpc
from raftmq.broker.v1 import broker_pb2 as bpb
from raftmq.broker.v1 import broker_pb2_grpc as bpb_grpc

from broker.state.names import is_system_topic
from client.admin import put_acl_rules
from mqcluster.cluster import (
    CLIENT_BLOCK_STEP,
    CLIENT_PORT_BASE,
    CLIENT_PORT_STEP,
    LEADER_WAIT_S,
    MAX_PORT_BLOCKS,
    STOP_GRACE_S,
    ClusterError,
    LocalCluster,
    SharedParts,
)
from mqsecurity.channels import ClientSecurity, open_channel
from mqsecurity.credentials import Credentials, load_credentials, save_credentials

GROUPS_DIR = "groups"
USERS_DIR = "users"
# Group names mqcluster gives: broker-a, broker-b, ... (RocketMQ's examples' names); one per
# port block of the fixed layout.
GROUP_NAMES = tuple(f"broker-{chr(ord('a') + k)}" for k in range(MAX_PORT_BLOCKS))
MAX_GROUPS = len(GROUP_NAMES)
# A group name: what brokerName and a directory name may both be.
_GROUP_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}")
# A user name mqcluster records (a file name too): RocketMQ AccessKeys are letters and digits.
_USER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
# 24 random bytes: a 32-character URL-safe SecretKey.
USER_SECRET_BYTES = 24
# Deadline of one admin call to a group's leader (users, ACL rules, topics).
ADMIN_CALL_TIMEOUT_S = 10.0
# How long copying the cluster's topics, users and rules to a new group may take in all
# (leader changes of the new group are retried within it).
COPY_WAIT_S = 30.0
RETRY_S = 0.2
# remove-group waits this long by default for consumers to read what the group still holds
# (RocketMQ operators drain a broker by turning its write permission off and watching
# consumerProgress; this is that wait, bounded), asking every DRAIN_POLL_S.
DRAIN_WAIT_S = 300.0
DRAIN_POLL_S = 1.0
USER_TYPES = ("Normal", "Super")


@dataclass(slots=True)
class GroupAdded:
    """What ``add_group`` did: the group, and what it copied to it."""

    group: str
    leader: str
    topics: list[str] = field(default_factory=list)
    users: list[str] = field(default_factory=list)
    acl_subjects: list[str] = field(default_factory=list)


class Groups:
    """The broker groups of the cluster in ``base_dir`` (see the module's docstring)."""

    def __init__(self, base_dir: str | Path) -> None:
        self.first = LocalCluster(base_dir)
        self.base = self.first.base

    # ------------------------------------------------------------------ the groups

    @property
    def extra_names(self) -> list[str]:
        """The added groups' names, as cluster.json lists them (checked: each names a
        directory under groups/)."""
        names = self.first.extra_state.get("groups", [])
        if (
            not isinstance(names, list)
            or len(names) >= MAX_GROUPS
            or not all(isinstance(n, str) and _GROUP_NAME.fullmatch(n) for n in names)
        ):
            raise ClusterError(f"{self.base}/cluster.json: 'groups' is not a list of group names")
        return [str(n) for n in names]

    def _group_dir(self, name: str) -> Path:
        return self.base / GROUPS_DIR / name

    def all(self) -> list[LocalCluster]:
        """Every group, the first (the NameServer's) first."""
        return [self.first, *(LocalCluster(self._group_dir(n)) for n in self.extra_names)]

    def group(self, name: str) -> LocalCluster:
        for g in self.all():
            if g.group == name:
                return g
        known = ", ".join(g.group for g in self.all() if g.group) or "none"
        raise ClusterError(f"unknown group {name!r}; groups: {known}")

    def _save_names(self, names: list[str]) -> None:
        self.first.extra_state["groups"] = names
        self.first._save_state()

    @property
    def namesrv_addr(self) -> str:
        ns = self.first.namesrv
        if ns is None:
            raise ClusterError("several groups need a NameServer (set up without --no-namesrv)")
        return ns.addr

    def security(self) -> ClientSecurity:
        return self.first.client_security()

    # ------------------------------------------------------------------ setup

    def configure(self, groups: int, nodes: int = 3, **kwargs: object) -> None:
        """``groups`` groups of ``nodes`` nodes (``kwargs``: LocalCluster.configure's: the
        first group's NameServer, security and ports; every group gets the same settings)."""
        if not 1 <= groups <= MAX_GROUPS:
            raise ClusterError(f"--groups must be in [1, {MAX_GROUPS}], got {groups}")
        self._refuse_running()
        for name in self.extra_names:  # a previous cluster's groups: replaced
            shutil.rmtree(self._group_dir(name), ignore_errors=True)
        kwargs.setdefault("group", GROUP_NAMES[0])
        if groups > 1 and not kwargs.get("namesrv"):
            raise ClusterError("several groups need a NameServer (drop --no-namesrv)")
        self.first.extra_state["groups"] = []
        self.first.configure(nodes, **kwargs)  # type: ignore[arg-type]
        names = []
        taken = self.first.configured_ports()
        for k in range(1, groups):
            name = GROUP_NAMES[k]
            taken |= self._configure_extra(name, nodes, k, taken).configured_ports()
            names.append(name)
        self._save_names(names)

    def _refuse_running(self) -> None:
        for g in self.all():
            if any(g.pid(n) is not None for n in g.nodes) or g.namesrv_pid() is not None:
                raise ClusterError(
                    f"a cluster is running in {self.base}; run 'mqcluster down' first"
                )

    def _configure_extra(self, name: str, nodes: int, block: int, taken: set[int]) -> LocalCluster:
        """Group ``name`` configured like the first; with automatic ports, none of ``taken``
        (the other groups' ports: those not started yet are free, and a port drawn twice would
        leave one node unable to bind while the other answers in its place)."""
        first = self.first
        group = LocalCluster(self._group_dir(name))
        auto = any(n.client_port != _fixed_client_port(first, i) for i, n in enumerate(first.nodes))
        group.configure(
            nodes,
            group=name,
            auto_ports=auto,
            extra=dict(first.settings),
            secure=first.secure,
            shared=SharedParts(self.namesrv_addr, first.layout),
            port_block=block,
            avoid_ports=taken,
        )
        return group

    # ------------------------------------------------------------------ processes

    def up(self, wait_s: float = LEADER_WAIT_S) -> dict[str, str]:
        """Start the NameServer and every group; each group's leader, by group."""
        leaders = {}
        for g in self.all():
            leaders[g.group] = g.up(wait_s)
        return leaders

    def down(self, grace_s: float = STOP_GRACE_S) -> list[str]:
        """Stop the added groups, then the first (its NameServer last, so nodes unregister)."""
        killed: list[str] = []
        for g in reversed(self.all()):
            killed += [f"{g.group}/{n}" for n in g.down(grace_s)]
        return killed

    # ------------------------------------------------------------------ add and remove

    def add_group(
        self, name: str = "", nodes: int = 3, wait_s: float = LEADER_WAIT_S
    ) -> GroupAdded:
        """A new group in the running cluster: configured from the first group's settings,
        started, and given the cluster's topics, users and ACL rules (module docstring)."""
        existing = self.all()
        taken = {g.group for g in existing}
        name = name or next((n for n in GROUP_NAMES if n not in taken), "")
        if not name:
            raise ClusterError(f"the cluster has {len(existing)} groups, the most is {MAX_GROUPS}")
        if not _GROUP_NAME.fullmatch(name) or name in taken or name == GROUPS_DIR:
            raise ClusterError(
                f"group name {name!r} is taken or not 1-64 letters, digits, '-' or '_'"
            )
        if len(existing) >= MAX_GROUPS:
            raise ClusterError(f"the cluster has {len(existing)} groups, the most is {MAX_GROUPS}")
        if self.first.namesrv_pid() is None:
            raise ClusterError("the cluster's NameServer is not running: 'mqcluster up' first")
        block = min(set(range(MAX_PORT_BLOCKS)) - {g.port_block for g in existing})
        if self._group_dir(name).exists():
            shutil.rmtree(self._group_dir(name))  # a removed group's old files
        ports = {p for g in existing for p in g.configured_ports()}
        group = self._configure_extra(name, nodes, block, ports)
        self._save_names([*self.extra_names, name])
        try:
            leader = group.up(wait_s)
        except ClusterError:
            group.down()
            raise
        added = GroupAdded(name, leader)
        self._copy_to(group, added)
        return added

    def remove_group(
        self, name: str, *, purge: bool = False, drain_timeout_s: float = DRAIN_WAIT_S
    ) -> list[str]:
        """Take group ``name`` out of the cluster: its topics made read-only first (producers
        route around it on their next refresh; consumers can still drain it), then, up to
        ``drain_timeout_s`` (0: not at all), a wait until no consumer group has a message of
        it left to read, then its nodes stopped (they unregister from the NameServer). A
        drain that does not end in time raises ClusterError naming what is left, with the
        topics left read-only and the nodes running. Its store stays on disk unless
        ``purge``. The first group (the NameServer's) cannot be removed. Returns the topics
        made read-only."""
        if name == self.first.group:
            raise ClusterError(
                f"{name} runs the cluster's NameServer and holds its CA: it cannot be removed"
            )
        group = self.group(name)
        frozen = []
        if any(group.pid(n) is not None for n in group.nodes):
            frozen = self._write_protect(group)
            if drain_timeout_s > 0:
                self._wait_drained(group, drain_timeout_s)
        group.down()
        self._save_names([n for n in self.extra_names if n != name])
        if purge:
            group.purge()
        return frozen

    def _write_protect(self, group: LocalCluster) -> list[str]:
        names = []
        for topic in self._leader_call(group, _list_topics):
            if _copied(topic.topic_name) and topic.perm & PERM_WRITE:
                protected = bpb.TopicConfig()
                protected.CopyFrom(topic)
                protected.perm = topic.perm & ~PERM_WRITE
                self._leader_call(group, _create_topic(protected))
                names.append(topic.topic_name)
        return names

    def _wait_drained(self, group: LocalCluster, timeout_s: float) -> None:
        """Until no consumer group with an offset on ``group`` has a message left to read
        there (its lag summed over queues), or ClusterError after ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while True:
            left = self._leader_call(group, _unread)
            if not left:
                return
            if time.monotonic() >= deadline:
                shown = ", ".join(f"{g} on {t}: {n}" for (g, t), n in sorted(left.items()))
                raise ClusterError(
                    f"{group.group} still holds unread messages after {timeout_s:g} s "
                    f"({shown}); its topics stay read-only and its nodes running: let those "
                    "consumers finish, then run remove-group again (--drain-timeout 0 "
                    "removes it now, and those messages are not delivered while it is down)"
                )
            time.sleep(DRAIN_POLL_S)

    # ------------------------------------------------------------------ users

    def users_dir(self) -> Path:
        return self.base / USERS_DIR

    def add_user(self, username: str, user_type: str = "Normal") -> tuple[Path, list[str]]:
        """A user on every group, its credentials kept in ``<base>/users/<name>.json`` (0600)
        so that groups added later get it too; the file and the groups."""
        if not _USER_NAME.fullmatch(username) or username == self.admin_name():
            raise ClusterError(
                f"user name {username!r}: 1-64 letters, digits, '.', '_', '-', not the admin"
            )
        if user_type not in USER_TYPES:
            raise ClusterError(f"user type {user_type!r}: one of {', '.join(USER_TYPES)}")
        path = self.users_dir() / f"{username}.json"
        if path.exists():
            raise ClusterError(f"user {username} exists ({path})")
        self.users_dir().mkdir(mode=0o700, exist_ok=True)
        credentials = Credentials(username, secrets.token_urlsafe(USER_SECRET_BYTES))
        save_credentials(str(path), credentials)
        (path.with_suffix(".type")).write_text(user_type + "\n")
        done = []
        for g in self.running():
            self._ensure_user(g, credentials, user_type)
            done.append(g.group)
        return path, done

    def admin_name(self) -> str:
        creds = self.security().credentials
        return creds.access_key if creds is not None else ""

    def recorded_users(self) -> Iterator[tuple[Credentials, str]]:
        if not self.users_dir().is_dir():
            return
        for path in sorted(self.users_dir().glob("*.json")):
            kind = path.with_suffix(".type")
            user_type = kind.read_text().strip() if kind.exists() else "Normal"
            yield load_credentials(str(path)), user_type

    def running(self) -> list[LocalCluster]:
        return [g for g in self.all() if any(g.pid(n) is not None for n in g.nodes)]

    def _ensure_user(self, group: LocalCluster, creds: Credentials, user_type: str) -> None:
        """``creds``' user on ``group`` unless it has one of that name already."""
        if any(u.username == creds.access_key for u in self._leader_call(group, _list_users)):
            return
        req = bpb.CreateUserRequest(
            username=creds.access_key, password=creds.secret_key, user_type=user_type
        )
        self._leader_call(group, lambda stub: stub.CreateUser(req, timeout=ADMIN_CALL_TIMEOUT_S))

    # ------------------------------------------------------------------ copying

    def _copy_to(self, group: LocalCluster, added: GroupAdded) -> None:
        """The first group's topics, users and ACL rules and the recorded users, onto
        ``group``."""
        first = self.first
        for topic in self._leader_call(first, _list_topics):
            if _copied(topic.topic_name):
                self._leader_call(group, _create_topic(topic))
                added.topics.append(topic.topic_name)
        if not first.secure:
            return
        sealed = self._leader_call(first, _export_users)
        given: set[str] = set()
        if sealed:  # a secure first group has its admin at least, once it has led
            done = self._leader_call(group, _import_users(sealed))
            given |= set(done.created) | set(done.updated)
        for creds, user_type in self.recorded_users():
            self._ensure_user(group, creds, user_type)
            given.add(creds.access_key)
        added.users = sorted(given - {self.admin_name()})
        have = {a.subject: a for a in self._leader_call(group, _list_acls)}
        for acl in self._leader_call(first, _list_acls):
            self._leader_call(group, _put_acl(acl, have.get(acl.subject)))
            added.acl_subjects.append(acl.subject)

    def _leader_call(self, group: LocalCluster, call: Callable[[bpb_grpc.BrokerStub], T]) -> T:
        """``call`` on ``group``'s leader, retried over leader changes for COPY_WAIT_S."""
        deadline = time.monotonic() + COPY_WAIT_S
        security = self.security()
        while True:
            leader = group.node(group.wait_leader(max(1.0, deadline - time.monotonic())))
            try:
                with open_channel(leader.client_addr, security) as ch:
                    return call(bpb_grpc.BrokerStub(ch))
            except grpc.RpcError as exc:
                retry = exc.code() in (
                    grpc.StatusCode.UNAVAILABLE,
                    grpc.StatusCode.FAILED_PRECONDITION,
                )
                if not retry or time.monotonic() >= deadline:
                    raise ClusterError(
                        f"{group.group} ({leader.client_addr}): {exc.code().name} {exc.details()}"
                    ) from None
                time.sleep(RETRY_S)


# RocketMQ's PermName.PERM_WRITE.
PERM_WRITE = 2
T = TypeVar("T")


def _fixed_client_port(cluster: LocalCluster, i: int) -> int:
    """Node ``i``'s client port in the fixed layout (not --auto-ports)."""
    return CLIENT_PORT_BASE + CLIENT_BLOCK_STEP * cluster.port_block + CLIENT_PORT_STEP * i


def _copied(topic: str) -> bool:
    """Topics a new group gets: the users' own (not system topics; a consumer group's retry
    and dead-letter topics are made on demand where they are needed)."""
    return not is_system_topic(topic) and not topic.startswith(("%RETRY%", "%DLQ%"))


def _list_topics(stub: bpb_grpc.BrokerStub) -> list[bpb.TopicConfig]:
    return list(stub.ListTopics(bpb.ListTopicsRequest(), timeout=ADMIN_CALL_TIMEOUT_S).topics)


def _unread(stub: bpb_grpc.BrokerStub) -> dict[tuple[str, str], int]:
    """(consumer group, topic) -> messages it has not consumed, where that is above 0: every
    group with an offset (or a live consumer), on each of its topics but dead-letter ones
    (nobody consumes those as part of the flow)."""
    listed = stub.ListConsumerGroups(
        bpb.ListConsumerGroupsRequest(), timeout=ADMIN_CALL_TIMEOUT_S
    ).groups
    left = {}
    for info in listed:
        for topic in info.topics:
            if topic.startswith("%DLQ%"):
                continue
            req = bpb.GetConsumerLagRequest(consumer_group=info.consumer_group, topic=topic)
            lag = stub.GetConsumerLag(req, timeout=ADMIN_CALL_TIMEOUT_S)
            total = sum(max(q.lag, 0) for q in lag.queues)
            if total > 0:
                left[(info.consumer_group, topic)] = total
    return left


def _list_users(stub: bpb_grpc.BrokerStub) -> list[bpb.User]:
    return list(stub.ListUser(bpb.ListUserRequest(), timeout=ADMIN_CALL_TIMEOUT_S).users)


def _list_acls(stub: bpb_grpc.BrokerStub) -> list[bpb.Acl]:
    return list(stub.ListAcl(bpb.ListAclRequest(), timeout=ADMIN_CALL_TIMEOUT_S).acls)


def _export_users(stub: bpb_grpc.BrokerStub) -> list[bpb.SealedUser]:
    return list(stub.ExportUsers(bpb.ExportUsersRequest(), timeout=ADMIN_CALL_TIMEOUT_S).users)


def _import_users(
    users: list[bpb.SealedUser],
) -> Callable[[bpb_grpc.BrokerStub], bpb.ImportUsersResponse]:
    def call(stub: bpb_grpc.BrokerStub) -> bpb.ImportUsersResponse:
        req = bpb.ImportUsersRequest(users=users)
        done: bpb.ImportUsersResponse = stub.ImportUsers(req, timeout=ADMIN_CALL_TIMEOUT_S)
        return done

    return call


def _create_topic(topic: bpb.TopicConfig) -> Callable[[bpb_grpc.BrokerStub], None]:
    def call(stub: bpb_grpc.BrokerStub) -> None:
        stub.CreateTopic(bpb.CreateTopicRequest(topic=topic), timeout=ADMIN_CALL_TIMEOUT_S)

    return call


def _put_acl(acl: bpb.Acl, have: bpb.Acl | None) -> Callable[[bpb_grpc.BrokerStub], bpb.Acl]:
    """The subject's rules on the target as ``mqadmin copyAcl`` writes them
    (:func:`client.admin.put_acl_rules`: UpdateAcl where ``have`` has the resource, CreateAcl
    elsewhere)."""
    return lambda stub: put_acl_rules(stub, acl, have, ADMIN_CALL_TIMEOUT_S)
