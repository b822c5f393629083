"""``client.members.change_member`` (mqadmin's member commands): a retry refused because the
first attempt, whose answer was lost, already committed the change is reported done; a refusal
without such an attempt, or with the change not in the committed configuration, is raised."""

from __future__ import annotations

from typing import Any

import pytest

from client import members
from client.errors import MQClientError
from client.members import MemberRow, Members

N3 = MemberRow("n3", "VOTER", "127.0.0.1:1", "127.0.0.1:2", 7, True)
REFUSED = MQClientError("INVALID_MEMBERSHIP_CHANGE", "FAILED_PRECONDITION", "n3: already a voter")
LOST = MQClientError(
    "UNAVAILABLE", "UNAVAILABLE", "no answer", retryable=True, outcome_unknown=True
)


def _group(
    monkeypatch: pytest.MonkeyPatch, first_lost: bool, committed: bool, role: str = "VOTER"
) -> None:
    def follow_leader(channels: Any, addr: str, call: Any, timeout_s: float, unknown: Any) -> Any:
        if first_lost:
            unknown.append(LOST)
        raise REFUSED

    row = MemberRow(N3.node_id, role, N3.peer_addr, N3.client_addr, 7, True)
    monkeypatch.setattr(members, "follow_leader", follow_leader)
    monkeypatch.setattr(
        members, "list_members", lambda channels, addr: Members((row,), "n0", 42, committed, 3)
    )


def test_a_refused_retry_of_a_committed_change_is_reported_done(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _group(monkeypatch, first_lost=True, committed=True)
    index, rows = members.change_member(None, "a:1", "PROMOTE", "n3")  # type: ignore[arg-type]
    assert (index, [r.node_id for r in rows]) == (42, ["n3"])


@pytest.mark.parametrize(
    ("first_lost", "committed", "role"),
    [
        (False, True, "VOTER"),  # nothing was lost: the refusal is the answer
        (True, False, "VOTER"),  # not committed yet: not done
        (True, True, "LEARNER"),  # the configuration does not hold the change
    ],
)
def test_other_refusals_are_raised(
    monkeypatch: pytest.MonkeyPatch, first_lost: bool, committed: bool, role: str
) -> None:
    _group(monkeypatch, first_lost, committed, role)
    with pytest.raises(MQClientError) as info:
        members.change_member(None, "a:1", "PROMOTE", "n3")  # type: ignore[arg-type]
    assert info.value is REFUSED
