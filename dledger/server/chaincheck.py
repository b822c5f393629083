"""The periodic chain check (docs/RAFT.md section 13, "Members compare their chains"): every
``chain_check_interval_ms`` the leader asks each peer, on the peer's client port (``Metadata``
with ``chain_index``), for its chained checksum at one index the leader names, and compares
it with its own there.

The index is committed and held by the peer: the lowest of the leader's commit index and the
match indexes of the peers asked (entries up to a match index are the leader's own, so every
member must hold the same content there). A mismatch counts in
``raftmq_corruption_chain_check_mismatch_total{peer}`` and logs an ERROR naming both members,
the index and both chains: their logs hold different content for an entry both committed,
which replication's own check (section 13) only sees for entries it sends again.

Replication finds content differences in entries it still sends; this finds them in entries
long committed that nobody reads, across members, where each member's scrubber (which checks
each entry against its own CRCs) cannot: a member whose entry was rewritten whole, CRCs
included, or that took different content at a bug.

A peer's answer is only compared, never acted on: a peer that answers for another index, or
says it does not hold the index (a snapshot base above it), is skipped for this round.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

import grpc
from raftmq.dledger.v1 import dledger_pb2 as pb
from raftmq.dledger.v1 import dledger_pb2_grpc as pb_grpc

from dledger.core import Role
from dledger.server.health import chain_or_none
from mqsecurity.channels import open_aio_channel

if TYPE_CHECKING:
    from dledger.server.node import DLedgerNode

logger = logging.getLogger(__name__)

# chainCheckIntervalMs default: one Metadata call per peer a minute costs nothing, and a
# content difference in committed entries is reported within a minute of being there.
DEFAULT_CHAIN_CHECK_INTERVAL_MS = 60_000
# Bounds (0 turns it off): at least a second (one check's calls take a few ms; faster is
# only load), at most a day (a longer gap leaves damage unseen for longer than the scrubber).
MIN_CHAIN_CHECK_INTERVAL_MS = 1_000
MAX_CHAIN_CHECK_INTERVAL_MS = 86_400_000
# One peer's answer: it answers from memory; a peer that takes longer is skipped this round.
CHAIN_CHECK_RPC_TIMEOUT_S = 3.0

# Asks one peer (its client address) for its Metadata at a chain index.
AskPeer = Callable[[str, int], Awaitable[pb.MetadataResponse]]


def peer_asker(node: DLedgerNode) -> AskPeer:
    async def ask(addr: str, index: int) -> pb.MetadataResponse:
        async with open_aio_channel(addr, node.cfg.client_security) as channel:
            resp: pb.MetadataResponse = await pb_grpc.DLedgerClientStub(channel).Metadata(
                pb.MetadataRequest(group=node.cfg.group, chain_index=index),
                timeout=CHAIN_CHECK_RPC_TIMEOUT_S,
            )
            return resp

    return ask


def check_index(node: DLedgerNode) -> tuple[int, list[str]]:
    """The index to compare at and the peers to ask (those with a client address and a
    match index); (0, []) when this member is not the leader or nothing is committed."""
    st = node.core.status()
    if st.role is not Role.LEADER:
        return 0, []
    peers = [p for p in st.peers if p.match_index > 0 and node.peer_client_addr(p.peer_id)]
    if not peers:
        return 0, []
    return min([st.commit_index, *(p.match_index for p in peers)]), [p.peer_id for p in peers]


async def check_once(node: DLedgerNode, ask: AskPeer) -> int:
    """One round; the number of peers whose chain differed."""
    index, peers = check_index(node)
    if not index:
        return 0
    mine = chain_or_none(node, index)
    if mine is None:
        return 0  # compacted here meanwhile: the next round names a newer index
    answers = await asyncio.gather(
        *(ask(node.peer_client_addr(p), index) for p in peers), return_exceptions=True
    )
    differed = 0
    for peer, resp in zip(peers, answers, strict=True):
        if isinstance(resp, BaseException):
            if not isinstance(resp, (grpc.RpcError, OSError, TimeoutError)):
                raise resp
            logger.debug("node=%s chain check: %s did not answer: %s", node.cfg.self_id, peer, resp)
            continue
        if not resp.chain_known or resp.chain_index != index:
            continue
        if resp.chain != mine:
            differed += 1
            node.chain_check_mismatches[peer] = node.chain_check_mismatches.get(peer, 0) + 1
            logger.error(
                "node=%s chain check: committed index %d differs: %s has chain %016x, %s has "
                "%016x (their logs hold different content for a committed entry at or below "
                "it; docs/RAFT.md section 13)",
                node.cfg.self_id,
                index,
                node.cfg.self_id,
                mine,
                peer,
                resp.chain,
            )
    return differed


async def chain_check_loop(node: DLedgerNode, interval_ms: int, ask: AskPeer) -> None:
    """For ever: a round every ``interval_ms`` (> 0)."""
    assert interval_ms > 0
    while True:
        await asyncio.sleep(interval_ms / 1000)
        await check_once(node, ask)
