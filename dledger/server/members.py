"""Who is on the other end of a peer stream, when the peer port speaks mutual TLS.

The TLS handshake already refused every client without a certificate signed by the group's CA.
What is left to decide here: does the certificate name a member of *this* group, one of its
peers other than this node (``raftmq://member/<group>/<node-id>``, `mqsecurity.pki`)? The
sender's id is the certificate's, never the stream's metadata: a stream whose metadata names
another group or another id than its certificate is refused as a lie (``PEER_IDENTITY``), not
corrected. Every refusal is a `Refused` carrying the reason counted in
`mqsecurity.refusals` and the failure the call ends with (`rpckit.status`).
"""

from __future__ import annotations

from collections.abc import Container, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import grpc

from dledger.server.convert import MAX_NODE_ID_CHARS, echo
from mqerrors import codes as E
from mqsecurity import refusals
from mqsecurity.pki import member_identity
from rpckit import status

if TYPE_CHECKING:
    from dledger.server.node import DLedgerNode

# The headers a peer stream carries (PeerLink sets them; with TLS they only have to agree with
# the certificate).
GROUP_HEADER = "x-raftmq-group"
FROM_HEADER = "x-raftmq-from"
# A peer stream (or peer socket) refused at its start (a key of DLedgerNode.dropped(), beside
# the node's and the core's other DROP_* reasons).
DROP_STREAM_REFUSED = "stream_refused"
# Characters of a claimed name quoted in a refusal (details and log lines stay short).
QUOTE_MAX_CHARS = 64


@dataclass(frozen=True, slots=True)
class Refused:
    """A peer stream refused: ``reason`` for `mqsecurity.refusals`, ``failure`` for the caller."""

    reason: str
    failure: status.RpcFailure


def _quote(text: str) -> str:
    return repr(text if len(text) <= QUOTE_MAX_CHARS else text[:QUOTE_MAX_CHARS] + "...")


def _not_member(group: str, why: str) -> Refused:
    return Refused(
        refusals.PEER_CERTIFICATE,
        status.RpcFailure(
            grpc.StatusCode.PERMISSION_DENIED, E.NOT_A_MEMBER, f"of group {_quote(group)}: {why}"
        ),
    )


def stream_sender(
    auth_context: Mapping[str, Sequence[bytes]],
    metadata: Iterable[tuple[str, str | bytes]],
    group: str,
    self_id: str,
    peers: Container[str],
) -> str | Refused:
    """The member id of the certificate a peer stream came with, or why it is refused."""
    pems = auth_context.get("x509_pem_cert") or []
    if len(pems) != 1:
        return Refused(
            refusals.PEER_CERTIFICATE,
            status.RpcFailure(
                grpc.StatusCode.UNAUTHENTICATED,
                E.NO_CERTIFICATE,
                "a peer stream needs a member certificate (mutual TLS)",
            ),
        )
    who = member_identity(pems[0])
    if who is None:
        return _not_member(group, "the certificate names no member")
    if who.group != group:
        return _not_member(group, f"the certificate names group {_quote(who.group)}")
    if who.node_id == self_id or who.node_id not in peers:
        return _not_member(group, f"the certificate names {_quote(who.node_id)}, not a peer")
    claims = {k: v for k, v in metadata if k in (GROUP_HEADER, FROM_HEADER)}
    claimed_group = claims.get(GROUP_HEADER, group)
    claimed_id = claims.get(FROM_HEADER, who.node_id)
    if claimed_group != group or claimed_id != who.node_id:
        return Refused(
            refusals.PEER_IDENTITY,
            status.RpcFailure(
                grpc.StatusCode.PERMISSION_DENIED,
                E.PEER_IDENTITY,
                f"certificate of {_quote(who.node_id)} claims group={_quote(str(claimed_group))} "
                f"from={_quote(str(claimed_id))}",
            ),
        )
    return who.node_id


def claimed_sender_refusal(node: DLedgerNode, group: str, sender: str) -> Refused | None:
    """Plaintext: why a stream (or peer socket) claiming to come from ``sender`` of ``group``
    is refused (counted as DROP_STREAM_REFUSED), or None when it is served."""
    if group == node.cfg.group and len(sender) <= MAX_NODE_ID_CHARS and node.accepts_peer(sender):
        return None
    node.note_drop(DROP_STREAM_REFUSED, f"group={echo(group)} from={echo(sender)}")
    return Refused(
        DROP_STREAM_REFUSED,
        status.RpcFailure(
            grpc.StatusCode.PERMISSION_DENIED,
            E.NOT_A_MEMBER,
            f"of group {echo(node.cfg.group)}: group={echo(group)} from={echo(sender)}",
        ),
    )


class AcceptedPeers:
    """The members a peer stream may come from, as the configuration says (a container)."""

    def __init__(self, node: DLedgerNode) -> None:
        self.node = node

    def __contains__(self, node_id: object) -> bool:
        return isinstance(node_id, str) and self.node.accepts_peer(node_id)
