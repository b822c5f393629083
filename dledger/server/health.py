"""A member's replica health as ``Metadata`` answers it (``mqadmin replicaStatus``,
docs/CLUSTER.md "Replica status"): the repair state, the chained checksum at its commit
index and at an index the caller names, the damage counters, the scrubber's progress and what
the application's own derived-state checks found.

Nothing here knows about messages: the application's checks come from its state machine's
optional ``derived_mismatches()`` (name -> count), as the broker's state machine offers.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from raftmq.dledger.v1 import dledger_pb2 as pb

from dledger.log import DLedgerError

if TYPE_CHECKING:
    from dledger.server.node import DLedgerNode

logger = logging.getLogger(__name__)

# Entries of the application's derived-state map in an answer at most: a state machine that
# reports too many names is cut, so an answer stays small (the broker reports two stores).
MAX_DERIVED_NAMES = 16
# Characters of one derived-state name at most (the same cut).
MAX_DERIVED_NAME_CHARS = 64


def chain_or_none(node: DLedgerNode, index: int) -> int | None:
    """This member's chain at ``index``; None when the log does not hold it (compacted below
    the snapshot base, above the last index, the store being replaced or damaged there)."""
    try:
        return node.store.chain_at(index)
    except DLedgerError:
        return None


def derived_mismatches(node: DLedgerNode) -> dict[str, int]:
    """The state machine's derived-state mismatches by name, bounded; {} when it has none."""
    hook = getattr(node.sm, "derived_mismatches", None)
    if not callable(hook):
        return {}
    found = hook()
    out: dict[str, int] = {}
    for name, n in sorted(found.items())[:MAX_DERIVED_NAMES]:
        out[str(name)[:MAX_DERIVED_NAME_CHARS]] = max(0, int(n))
    return out


def health_fields(node: DLedgerNode, chain_index: int) -> pb.MetadataResponse:
    """The health fields of a ``MetadataResponse`` (``chain_index`` 0: none asked), to merge
    into the rest."""
    st = node.core.status()
    scrub = node.scrubber
    commit_chain = chain_or_none(node, st.commit_index)
    chain = chain_or_none(node, chain_index) if chain_index else None
    return pb.MetadataResponse(
        repairing=st.repairing,
        promised_index=st.promised_index,
        repairs_completed=st.repairs_completed,
        commit_chain=commit_chain or 0,
        chain_index=chain_index,
        chain=chain or 0,
        chain_known=chain is not None,
        corruption_found=node.corruption_found,
        chain_mismatches=st.chain_mismatches,
        committed_repairs=st.committed_repairs,
        chain_check_mismatches=sum(node.chain_check_mismatches.values()),
        scrub_last_pass_end_ms=scrub.last_pass_end_unix_ms if scrub is not None else 0,
        scrub_bytes_verified=scrub.bytes_verified if scrub is not None else 0,
        derived_mismatches=derived_mismatches(node),
        state_rebuilds=node.state_rebuilds,
        rewind_restarts_recent=node.rewind_restarts_recent,
    )
