"""A small synchronous client of the DLedger log service (what tests, mqcluster and tools use).

It finds the leader by asking any node, follows ``NOT_LEADER`` redirects (the leader address
in the structured error, ``raftmq.common.v1.ErrorInfo``), and reports failures with the node's
machine-readable code. Users can equally call the generated stubs in ``raftmq.dledger.v1``
directly.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import grpc
from raftmq.dledger.v1 import dledger_pb2 as pb
from raftmq.dledger.v1 import dledger_pb2_grpc as pb_grpc

from dledger.log import DLedgerError, Entry
from dledger.server.convert import entry_from_pb
from dledger.server.transport import CHANNEL_OPTIONS
from mqerrors import codes as E
from mqsecurity.channels import PLAINTEXT, ClientSecurity, open_channel
from rpckit.status import code_of_text, read_error
from rpckit.tlsdiag import tls_diagnosis

# Redirects followed by one call before it gives up (a group elects within a few hops).
MAX_REDIRECTS = 5
# A membership change waits for the one in flight, a learner's catching up (a promotion) and
# a leader's hand-over (its own removal): seconds on a healthy group.
MEMBER_CHANGE_TIMEOUT_S = 60.0
# Shortest wait between two tries of a refused change (the server's hint when longer).
RETRY_MIN_MS = 50
# The role a node has once each change kind is in effect ("": no longer a member; the same
# table as client.members', which may not import this package).
ROLE_AFTER_CHANGE = {
    "ADD_VOTER": "VOTER",
    "PROMOTE": "VOTER",
    "ADD_LEARNER": "LEARNER",
    "REMOVE": "",
}


# gRPC's own failures (no ErrorInfo) after which a write may still have been carried out.
UNKNOWN_OUTCOME_STATUSES = frozenset(
    {"DEADLINE_EXCEEDED", "UNAVAILABLE", "CANCELLED", "UNKNOWN", "INTERNAL"}
)


class ClientError(DLedgerError):
    """A call failed; ``status`` is the gRPC status code name, ``code`` the node's code,
    ``leader_addr`` the leader's client address a NOT_LEADER answer named ("" otherwise),
    ``outcome_unknown``: a write that may have happened (the node said so, or gRPC failed on
    its own with a status in :data:`UNKNOWN_OUTCOME_STATUSES`)."""

    def __init__(
        self,
        message: str,
        *,
        status: str,
        code: str,
        leader_addr: str = "",
        outcome_unknown: bool = False,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.leader_addr = leader_addr
        self.outcome_unknown = outcome_unknown


@dataclass(frozen=True, slots=True)
class AppendResult:
    first_index: int
    last_index: int
    term: int
    node: str  # client address of the leader that acknowledged it


def _error(exc: grpc.RpcError, addr: str) -> ClientError:
    status = exc.code().name if isinstance(exc, grpc.Call) else "UNKNOWN"
    detail = (exc.details() if isinstance(exc, grpc.Call) else str(exc)) or ""
    info = read_error(exc)
    diagnosis = tls_diagnosis(detail) if info is None else None
    if diagnosis is not None:  # a TLS mistake: never connected, so nothing was done
        code, message = diagnosis
        return ClientError(f"{addr}: {code} {message}", status=status, code=code)
    if info is None:  # a node older than the structured error, or gRPC's own failure
        return ClientError(
            f"{addr}: {status} {detail}",
            status=status,
            code=code_of_text(detail) or status,
            outcome_unknown=status in UNKNOWN_OUTCOME_STATUSES,
        )
    return ClientError(
        f"{addr}: {status} {detail}",
        status=status,
        code=info.code,
        leader_addr=info.leader_addr,
        outcome_unknown=info.outcome_unknown,
    )


class LogClient:
    """Talks to the client ports of one group's nodes, as ``security`` says (plaintext by
    default; TLS, a client certificate and signed calls when it carries them)."""

    def __init__(
        self,
        addrs: Sequence[str],
        group: str = "",
        timeout_s: float = 5.0,
        security: ClientSecurity = PLAINTEXT,
    ) -> None:
        if not addrs:
            raise ClientError(
                "at least one node address", status="INVALID_ARGUMENT", code=E.NO_ADDR
            )
        self.addrs = list(addrs)
        self.group = group
        self.timeout_s = timeout_s
        self.security = security
        self._channels: dict[str, grpc.Channel] = {}
        self._leader: str | None = None

    def close(self) -> None:
        for ch in self._channels.values():
            ch.close()
        self._channels.clear()

    def __enter__(self) -> LogClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _stub(self, addr: str) -> pb_grpc.DLedgerClientStub:
        ch = self._channels.get(addr)
        if ch is None:
            ch = open_channel(addr, self.security, CHANNEL_OPTIONS)
            self._channels[addr] = ch
        return pb_grpc.DLedgerClientStub(ch)

    def metadata(self, addr: str, timeout_s: float | None = None) -> pb.MetadataResponse:
        try:
            md: pb.MetadataResponse = self._stub(addr).Metadata(
                pb.MetadataRequest(group=self.group), timeout=timeout_s or self.timeout_s
            )
            return md
        except grpc.RpcError as exc:
            raise _error(exc, addr) from None

    def find_leader(self) -> str | None:
        """Client address of the leader, asking the nodes in turn; None if none knows one."""
        for addr in self.addrs:
            try:
                md = self.metadata(addr, timeout_s=1.0)
            except ClientError:
                continue
            if md.role == "LEADER":
                return addr
            if md.leader_client_addr:
                return md.leader_client_addr
        return None

    def append(self, bodies: Sequence[bytes], entry_type: int = 0) -> AppendResult:
        """Append a batch; returns once a majority holds it (per the group's flush mode).

        Raises :class:`ClientError` when the outcome is a failure *or unknown* (e.g.
        ``LEADERSHIP_LOST``, ``NO_QUORUM``): the entries may or may not be committed.
        """
        request = pb.AppendEntriesRequest(group=self.group, bodies=list(bodies), type=entry_type)
        addr = self._leader or self.find_leader() or self.addrs[0]
        for _ in range(MAX_REDIRECTS):
            try:
                resp = self._stub(addr).Append(request, timeout=self.timeout_s)
            except grpc.RpcError as exc:
                err = _error(exc, addr)
                if err.code == E.NOT_LEADER and err.leader_addr:
                    addr = err.leader_addr
                    self._leader = addr
                    continue
                self._leader = None
                raise err from None
            self._leader = addr
            return AppendResult(resp.first_index, resp.last_index, resp.term, addr)
        self._leader = None
        raise ClientError("no leader found after redirects", status="UNAVAILABLE", code=E.NO_LEADER)

    def get(self, addr: str, index: int, max_count: int = 1000) -> tuple[list[Entry], int]:
        """Committed entries from ``index`` on, as ``addr`` holds them, and its commit index."""
        try:
            resp = self._stub(addr).Get(
                pb.GetRequest(group=self.group, index=index, max_count=max_count),
                timeout=self.timeout_s,
            )
        except grpc.RpcError as exc:
            raise _error(exc, addr) from None
        return [entry_from_pb(e) for e in resp.entries], resp.commit_index

    def read_all(self, addr: str, upto: int | None = None) -> list[Entry]:
        """Every committed entry ``addr`` holds (up to ``upto``), paging through Get."""
        out: list[Entry] = []
        index = 1
        while True:
            entries, commit = self.get(addr, index, max_count=5000)
            if upto is not None:
                entries = [e for e in entries if e.index <= upto]
            out.extend(entries)
            if not entries or (upto is not None and out and out[-1].index >= upto):
                return out
            index = entries[-1].index + 1
            if index > commit:
                return out

    def list_members(self, addr: str | None = None) -> pb.ListMembersResponse:
        """The configuration as ``addr`` (default: the leader, else the first node) knows it."""
        addr = addr or self.find_leader() or self.addrs[0]
        try:
            resp: pb.ListMembersResponse = self._stub(addr).ListMembers(
                pb.ListMembersRequest(group=self.group), timeout=self.timeout_s
            )
            return resp
        except grpc.RpcError as exc:
            raise _error(exc, addr) from None

    def change_member(
        self,
        kind: str,
        node_id: str,
        peer_addr: str = "",
        client_addr: str = "",
        timeout_s: float = MEMBER_CHANGE_TIMEOUT_S,
    ) -> pb.ChangeMemberResponse:
        """One membership change (``ChangeMemberRequest.kind``) on the leader, following
        redirects and waiting out retryable refusals (a change in flight, a learner catching
        up, a leader handing over before its own removal) for up to ``timeout_s``."""
        request = pb.ChangeMemberRequest(
            group=self.group,
            kind=kind,
            node_id=node_id,
            peer_addr=peer_addr,
            client_addr=client_addr,
        )
        deadline = time.monotonic() + timeout_s
        addr = self._leader or self.find_leader() or self.addrs[0]
        maybe_applied = False  # an attempt whose outcome is unknown may have committed
        while True:
            left = deadline - time.monotonic()
            try:
                resp: pb.ChangeMemberResponse = self._stub(addr).ChangeMember(
                    request, timeout=max(0.1, min(self.timeout_s, left))
                )
                return resp
            except grpc.RpcError as exc:
                err, info = _error(exc, addr), read_error(exc)
                retryable = info.retryable if info is not None else err.status == "UNAVAILABLE"
                maybe_applied |= err.outcome_unknown
                if not retryable or time.monotonic() >= deadline:
                    done = self._in_effect(request, deadline) if maybe_applied else None
                    if done is not None:
                        return done  # an attempt whose answer was lost committed the change
                    raise err from None
                if err.code == E.NOT_LEADER:
                    addr = err.leader_addr or self.find_leader() or addr
                wait_ms = max(info.retry_after_ms if info is not None else 0, RETRY_MIN_MS)
                time.sleep(min(wait_ms / 1000, max(left, 0)))

    def _in_effect(
        self, request: pb.ChangeMemberRequest, deadline: float
    ) -> pb.ChangeMemberResponse | None:
        """The committed configuration if ``request`` is already in effect in it (an attempt
        whose answer was lost committed it, so the retry was refused), else None."""
        if request.kind not in ROLE_AFTER_CHANGE:
            return None
        while True:
            try:
                members = self.list_members()
            except ClientError:
                return None
            role = next((m.role for m in members.members if m.id == request.node_id), "")
            if role != ROLE_AFTER_CHANGE[request.kind]:  # a removed node has no role
                return None
            if members.config_committed:
                return pb.ChangeMemberResponse(
                    members=members.members, index=members.config_index, term=members.term
                )
            if time.monotonic() >= deadline:
                return None
            time.sleep(RETRY_MIN_MS / 1000)

    def set_feature_level(
        self, level: int = 0, timeout_s: float = MEMBER_CHANGE_TIMEOUT_S
    ) -> pb.SetFeatureLevelResponse:
        """Raise the group's feature level to ``level`` (0: the leader's release's highest) on
        the leader, following redirects and waiting out retryable refusals (a change in
        flight, a new leader's first commit) for up to ``timeout_s``. A raise a member does
        not support is FEATURE_LEVEL_UNSUPPORTED at once (the message names the member). A
        retry after a lost answer is safe: a level already committed answers with it."""
        request = pb.SetFeatureLevelRequest(group=self.group, level=level)
        deadline = time.monotonic() + timeout_s
        addr = self._leader or self.find_leader() or self.addrs[0]
        while True:
            left = deadline - time.monotonic()
            try:
                resp: pb.SetFeatureLevelResponse = self._stub(addr).SetFeatureLevel(
                    request, timeout=max(0.1, min(self.timeout_s, left))
                )
                return resp
            except grpc.RpcError as exc:
                err, info = _error(exc, addr), read_error(exc)
                retryable = info.retryable if info is not None else err.status == "UNAVAILABLE"
                if not retryable or time.monotonic() >= deadline:
                    raise err from None
                if err.code == E.NOT_LEADER:
                    addr = err.leader_addr or self.find_leader() or addr
                wait_ms = max(info.retry_after_ms if info is not None else 0, RETRY_MIN_MS)
                time.sleep(min(wait_ms / 1000, max(left, 0)))

    def transfer_leadership(self, target_id: str) -> pb.TransferLeadershipResponse:
        addr = self.find_leader() or self.addrs[0]
        try:
            resp: pb.TransferLeadershipResponse = self._stub(addr).TransferLeadership(
                pb.TransferLeadershipRequest(group=self.group, target_id=target_id),
                timeout=self.timeout_s,
            )
            return resp
        except grpc.RpcError as exc:
            raise _error(exc, addr) from None
