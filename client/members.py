"""A broker group's members, from the admin side: ``mqadmin listMember``, ``addMember``,
``promoteMember``, ``removeMember`` (docs/CLUSTER.md "Changing a group's members") and
``setFeatureLevel`` (docs/RAFT.md "Feature level").

The calls go to the group's ``raftmq.dledger.v1.DLedgerClient`` service on any node's client
port; a change is made by the leader, so this follows ``NOT_LEADER`` redirects and waits out
what the group says is worth retrying (a change in flight, a learner catching up, a leader
handing over before its own removal) until the deadline.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import grpc
from raftmq.dledger.v1 import dledger_pb2 as dpb
from raftmq.dledger.v1 import dledger_pb2_grpc as dpb_grpc

from client.errors import MQClientError
from client.route import ChannelPool
from mqerrors import codes as E

T_ = TypeVar("T_")

# A change waits for the one in flight, for a learner to catch up (a promotion) and for a
# leader to hand over (its own removal): seconds on a healthy group, more for a big log.
MEMBER_CHANGE_TIMEOUT_S = 60.0
LIST_TIMEOUT_S = 5.0
# Shortest wait between two tries (the server's retry hint is used when longer).
RETRY_MIN_S = 0.1
CHANGE_KINDS = ("ADD_LEARNER", "ADD_VOTER", "PROMOTE", "REMOVE")
# The role a node has once each change kind is in effect ("": no longer a member).
ROLE_AFTER_CHANGE = {
    "ADD_VOTER": "VOTER",
    "PROMOTE": "VOTER",
    "ADD_LEARNER": "LEARNER",
    "REMOVE": "",
}


@dataclass(frozen=True, slots=True)
class MemberRow:
    node_id: str
    role: str  # VOTER or LEARNER
    peer_addr: str
    client_addr: str
    match_index: int  # on the leader's view; 0 from a follower
    recent_active: bool
    # The feature level it reported supporting (the leader's view; 0: not known there)
    supported_feature_level: int = 0


@dataclass(frozen=True, slots=True)
class Members:
    members: tuple[MemberRow, ...]
    leader_id: str
    config_index: int
    config_committed: bool
    term: int
    feature_level: int = 1  # the group's, in the configuration in force


def _rows(members: object) -> tuple[MemberRow, ...]:
    return tuple(
        MemberRow(
            m.id,
            m.role,
            m.peer_addr,
            m.client_addr,
            m.match_index,
            m.recent_active,
            m.supported_feature_level,
        )
        for m in members  # type: ignore[attr-defined]
    )


def follow_leader(
    channels: ChannelPool,
    addr: str,
    call: Callable[[dpb_grpc.DLedgerClientStub, float], T_],
    timeout_s: float,
    unknown: list[MQClientError] | None = None,
) -> T_:
    """``call`` on ``addr``'s group, following redirects to its leader and retrying what the
    group says is retryable until ``timeout_s`` passes (``unknown`` gets the first retried
    error after which the call may have taken effect: ``outcome_unknown``)."""
    deadline = time.monotonic() + timeout_s
    while True:
        remaining = deadline - time.monotonic()
        try:
            return call(dpb_grpc.DLedgerClientStub(channels.get(addr)), max(remaining, 0.05))
        except grpc.RpcError as exc:
            err = MQClientError.from_rpc(exc)
            if not err.retryable or time.monotonic() >= deadline:
                raise err from exc
            if unknown is not None and err.outcome_unknown and not unknown:
                unknown.append(err)  # the first is enough: the change may have committed
            if err.code == E.NOT_LEADER and err.leader_addr and err.leader_addr != addr:
                addr = err.leader_addr
                continue
            time.sleep(min(max(err.retry_after_ms / 1000, RETRY_MIN_S), max(remaining, 0)))


def list_members(channels: ChannelPool, addr: str) -> Members:
    """The configuration as the leader knows it (as ``addr`` knows it when no leader)."""

    def call(at: str) -> dpb.ListMembersResponse:
        stub = dpb_grpc.DLedgerClientStub(channels.get(at))
        resp: dpb.ListMembersResponse = stub.ListMembers(
            dpb.ListMembersRequest(), timeout=LIST_TIMEOUT_S
        )
        return resp

    try:
        resp = call(addr)
        leader_addr = next((m.client_addr for m in resp.members if m.id == resp.leader_id), "")
        if leader_addr and leader_addr != addr:
            # The leader's answer has every member's progress.
            with contextlib.suppress(grpc.RpcError):  # unreachable from here: keep the first
                resp = call(leader_addr)
    except grpc.RpcError as exc:
        raise MQClientError.from_rpc(exc) from exc
    return Members(
        _rows(resp.members),
        resp.leader_id,
        resp.config_index,
        resp.config_committed,
        resp.term,
        max(resp.feature_level, 1),  # 0: a node of a release before feature levels
    )


def change_member(
    channels: ChannelPool,
    addr: str,
    kind: str,
    node_id: str,
    peer_addr: str = "",
    client_addr: str = "",
    timeout_s: float = MEMBER_CHANGE_TIMEOUT_S,
) -> tuple[int, tuple[MemberRow, ...]]:
    """One change (``CHANGE_KINDS``), answered once committed: (its index, the members)."""
    if kind not in CHANGE_KINDS:
        raise MQClientError.local(E.UNKNOWN_CHANGE, f"kind {kind!r:.40}")
    req = dpb.ChangeMemberRequest(
        kind=kind, node_id=node_id, peer_addr=peer_addr, client_addr=client_addr
    )

    def call(stub: dpb_grpc.DLedgerClientStub, t: float) -> dpb.ChangeMemberResponse:
        resp: dpb.ChangeMemberResponse = stub.ChangeMember(req, timeout=t)
        return resp

    unknown: list[MQClientError] = []
    try:
        resp = follow_leader(channels, addr, call, timeout_s, unknown)
    except MQClientError as exc:
        # An attempt whose answer was lost may have committed: the retry is then refused
        # ("already a voter", "not a member") although the change is done.
        if exc.code == E.INVALID_MEMBERSHIP_CHANGE and unknown:
            done = _in_effect(channels, addr, kind, node_id)
            if done is not None:
                return done
        raise
    return resp.index, _rows(resp.members)


def set_feature_level(
    channels: ChannelPool, addr: str, level: int = 0, timeout_s: float = MEMBER_CHANGE_TIMEOUT_S
) -> tuple[int, int]:
    """Raise ``addr``'s group to feature level ``level`` (0: the leader release's highest),
    answered once committed: (the committed level, its CONFIG entry's index). A member that
    does not support it refuses the raise (FEATURE_LEVEL_UNSUPPORTED naming it); a retry
    after a lost answer gets the committed level."""
    req = dpb.SetFeatureLevelRequest(level=level)

    def call(stub: dpb_grpc.DLedgerClientStub, t: float) -> dpb.SetFeatureLevelResponse:
        resp: dpb.SetFeatureLevelResponse = stub.SetFeatureLevel(req, timeout=t)
        return resp

    resp = follow_leader(channels, addr, call, timeout_s)
    return resp.level, resp.index


def _in_effect(
    channels: ChannelPool, addr: str, kind: str, node_id: str
) -> tuple[int, tuple[MemberRow, ...]] | None:
    """The committed configuration (index, members) if it already holds the change."""
    try:
        now = list_members(channels, addr)
    except MQClientError:
        return None
    role = next((m.role for m in now.members if m.node_id == node_id), "")
    if not now.config_committed or role != ROLE_AFTER_CHANGE.get(kind, "?"):
        return None
    return now.config_index, now.members
