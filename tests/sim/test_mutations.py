"""Each test-only mutation (of the core, or of the simulated driver) must be caught by the
simulator within 2,000 seeds.

The seeds searched are the ones the unmutated sweep (test_sim.py) runs without a violation,
so a catch is the mutation's doing; the failing seed is also re-run without the mutation.
"""

from __future__ import annotations

import pytest

from dledger.core import MUTATIONS
from dledger.sim import DRIVER_MUTATIONS, run_seed, run_seeds

MAX_SEEDS = 2_000
# Group size searched per mutation (the one that catches it fastest).
NODES = {
    "vote_without_log_check": 3,
    "commit_old_term_by_count": 3,
    "reply_before_persisting_vote": 5,
    "no_truncate_conflict": 3,
    "leader_never_steps_down": 3,
    "accept_ack_beyond_last": 3,
    "snapshot_out_of_order": 3,
    "send_before_persist": 3,
    "conf_change_while_pending": 3,
    "removed_member_votes": 3,
    "forget_promise": 3,
    "skip_chain_check": 3,
    "raise_without_reports": 3,
}
# Mutations whose harm needs a chain of events the random schedules do not reach within
# MAX_SEEDS (five steps, each with its own timing): a deterministic unit scenario plays the
# chain and shows the harm instead (a leader elected without a committed entry).
UNIT_SCENARIOS = {
    "conf_change_before_term_commit": (
        "tests/unit/test_core_membership.py::"
        "test_mutation_change_before_term_commit_loses_a_committed_entry"
    ),
}
ALL_MUTATIONS = MUTATIONS | DRIVER_MUTATIONS


def test_every_mutation_has_a_case() -> None:
    assert set(NODES) | set(UNIT_SCENARIOS) == ALL_MUTATIONS
    assert not set(NODES) & set(UNIT_SCENARIOS)


@pytest.mark.parametrize("mutation", sorted(NODES))
def test_mutation_is_caught(mutation: str) -> None:
    nodes = NODES[mutation]
    summary = run_seeds(range(MAX_SEEDS), nodes, mutations=frozenset({mutation}))
    failure = summary.first_failure
    assert failure is not None, f"{mutation} survived {MAX_SEEDS} seeds"
    print(f"{mutation}: caught by seed {failure.seed} ({nodes} nodes): {failure.violation}")
    assert run_seed(failure.seed, nodes).violation is None  # the same seed, unmutated
