"""Subscription group records (type 22) with their creator and the delete op (issue #32): the
version-2 record round trip, version-1 records of the previous release still read, a delete
applied on every member, and the snapshot rows with and without the owner."""

from __future__ import annotations

import pytest

from broker.state.subgroups import (
    OP_CREATE_IF_ABSENT,
    OP_DELETE,
    OP_UPSERT,
    SUBGROUP_RECORD_VERSION,
    SUBGROUP_RECORD_VERSION_OWNED,
    InvalidSubGroupRecordError,
    SubGroup,
    SubGroupTable,
    check_group,
    decode_subgroup_record,
    encode_subgroup_record,
)


def test_owned_records_round_trip_and_unowned_ones_stay_version_1() -> None:
    owned = encode_subgroup_record(OP_CREATE_IF_ABSENT, SubGroup("g", owner="alice"))
    assert owned[0] == SUBGROUP_RECORD_VERSION_OWNED
    assert decode_subgroup_record(owned) == (OP_CREATE_IF_ABSENT, SubGroup("g", owner="alice"))
    plain = encode_subgroup_record(OP_UPSERT, SubGroup("g", fifo=True))
    assert plain[0] == SUBGROUP_RECORD_VERSION  # what the previous release reads
    assert decode_subgroup_record(plain) == (OP_UPSERT, SubGroup("g", fifo=True))
    gone = encode_subgroup_record(OP_DELETE, SubGroup("g"))
    assert gone[0] == SUBGROUP_RECORD_VERSION_OWNED
    with pytest.raises(InvalidSubGroupRecordError):  # a delete is never a version-1 record
        decode_subgroup_record(bytes([SUBGROUP_RECORD_VERSION]) + gone[1:])
    with pytest.raises(InvalidSubGroupRecordError):  # an owner cut short
        decode_subgroup_record(owned[:-1])
    with pytest.raises(InvalidSubGroupRecordError):  # the leader checks before it encodes
        check_group(SubGroup("g", owner="x" * 300))


def test_the_table_counts_groups_by_creator_and_deletes() -> None:
    table = SubGroupTable()
    table.apply(encode_subgroup_record(OP_CREATE_IF_ABSENT, SubGroup("a", owner="alice")))
    table.apply(encode_subgroup_record(OP_CREATE_IF_ABSENT, SubGroup("b", owner="alice")))
    # An admin's upsert of alice's group changes its config, not its creator.
    table.apply(encode_subgroup_record(OP_UPSERT, SubGroup("b", fifo=True, owner="admin")))
    assert table.held_by("alice") == 2 and table.held_by("admin") == 0
    group = table.get("b")
    assert group is not None and group.fifo and group.owner == "alice"
    assert table.apply(encode_subgroup_record(OP_DELETE, SubGroup("a"))) is None
    assert table.get("a") is None and table.held_by("alice") == 1
    table.apply(encode_subgroup_record(OP_DELETE, SubGroup("a")))  # again: nothing changes
    assert table.held_by("alice") == 1
    # The snapshot keeps the creator; a previous release's row (8 fields) has none.
    rows = table.capture()
    assert rows[0][0] == "b" and rows[0][-1] == "alice"
    old_row = ["c", False, 16, "CUSTOMIZED", [1000], 0, 0, 1000]
    again = SubGroupTable()
    assert again.load([*rows, old_row, ["bad"]]) == ["['bad']"]
    assert again.held_by("alice") == 1 and again.held_by("") == 1
    assert again.get("b") == table.get("b")
