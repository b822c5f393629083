"""Subscription group admin on the leader: create or replace a group's config (``mqadmin
updateSubGroup``), create one with the defaults when a RocketMQ 5 consumer names an unknown
group, and list them. Each change is one :data:`broker.subgroups.ENTRY_SUBGROUP` record; the
answer is read from what was applied. Protocol-neutral, like :mod:`broker.pop`.
"""

from __future__ import annotations

from broker.applied import NodeContext, require_leader
from broker.errors import InvalidRequestError
from broker.names import validate_group_name
from broker.subgroups import (
    ENTRY_SUBGROUP,
    OP_CREATE_IF_ABSENT,
    OP_UPSERT,
    InvalidSubGroupRecordError,
    SubGroup,
    TooManySubGroupsError,
    check_group,
    default_group,
    encode_subgroup_record,
)


class SubscriptionGroups:
    """The replicated subscription group table, as the leader changes it."""

    def __init__(self, ctx: NodeContext, default_attempts: int) -> None:
        self.ctx = ctx
        self.default_attempts = default_attempts

    def get(self, name: str) -> SubGroup:
        """The group's config, or the defaults of a group without one."""
        return self.ctx.sm.subgroups.get(name) or default_group(name, self.default_attempts)

    def known(self, name: str) -> bool:
        return self.ctx.sm.subgroups.get(name) is not None

    def list(self) -> list[SubGroup]:
        return sorted(self.ctx.sm.subgroups.groups.values(), key=lambda g: g.name)

    async def update(self, group: SubGroup, create_only: bool = False) -> SubGroup:
        """Create or replace ``group`` (``create_only``: create it with the defaults unless it
        exists); the config as applied."""
        require_leader(self.ctx.node)
        validate_group_name(group.name)
        if create_only:
            group = default_group(group.name, self.default_attempts)
        try:
            check_group(group)
        except InvalidSubGroupRecordError as exc:
            raise InvalidRequestError(str(exc)) from None
        if not self.ctx.sm.subgroups.room_for(group.name):
            raise TooManySubGroupsError(
                f"the broker holds {len(self.ctx.sm.subgroups.groups)} subscription groups,"
                " the most it may"
            )
        op = OP_CREATE_IF_ABSENT if create_only else OP_UPSERT
        await self.ctx.node.propose([encode_subgroup_record(op, group)], ENTRY_SUBGROUP)
        return self.get(group.name)
