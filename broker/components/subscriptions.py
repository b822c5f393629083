"""Subscription group admin on the leader: create or replace a group's config (``mqadmin
updateSubGroup``), create one with the defaults when a RocketMQ 5 consumer names an unknown
group, delete one (``mqadmin deleteSubGroup``), and list them. Each change is one
:data:`broker.state.records.ENTRY_SUBGROUP` record; the answer is read from what was applied.
Protocol-neutral, like :mod:`broker.components.pop`.

The table is shared by every user (10,000 groups): one user creates at most
``subscriptionGroupsPerUser`` of them (:attr:`ServiceConfig.subgroups_per_user`), checked here
on the leader before the record is proposed, one creation at a time. Super users and the
anonymous user of a group without users are bounded by the table's size only.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace

from broker.components.applied import NodeContext, require_leader
from broker.state.errors import BrokerError, InvalidRequestError, ResourceExhaustedError
from broker.state.names import validate_group_name
from broker.state.records import ENTRY_SUBGROUP
from broker.state.subgroups import (
    OP_CREATE_IF_ABSENT,
    OP_DELETE,
    OP_UPSERT,
    InvalidSubGroupRecordError,
    SubGroup,
    TooManySubGroupsError,
    check_group,
    default_group,
    encode_subgroup_record,
)
from mqerrors import codes as E


class SubGroupQuotaError(ResourceExhaustedError):
    """The user created ``subscriptionGroupsPerUser`` groups that still exist."""

    code = E.RESOURCE_EXHAUSTED


class SubGroupNotFoundError(BrokerError):
    """A delete of a group that has no config (gRPC NOT_FOUND, broker.frontends.v1.rpcerrors)."""

    code = E.SUBGROUP_NOT_FOUND


class SubscriptionGroups:
    """The replicated subscription group table, as the leader changes it."""

    def __init__(self, ctx: NodeContext, default_attempts: int) -> None:
        self.ctx = ctx
        self.default_attempts = default_attempts
        # One creation at a time here, so that a quota is not passed by creations in flight.
        self._creating = asyncio.Lock()

    @property
    def per_user(self) -> int:
        """subscriptionGroupsPerUser."""
        return int(self.ctx.cfg.subgroups_per_user)

    def get(self, name: str) -> SubGroup:
        """The group's config, or the defaults of a group without one."""
        return self.ctx.sm.subgroups.get(name) or default_group(name, self.default_attempts)

    def known(self, name: str) -> bool:
        return self.ctx.sm.subgroups.get(name) is not None

    def list(self) -> list[SubGroup]:
        return sorted(self.ctx.sm.subgroups.groups.values(), key=lambda g: g.name)

    async def update(
        self,
        group: SubGroup,
        create_only: bool = False,
        owner: str = "",
        unbounded: bool = False,
    ) -> SubGroup:
        """Create or replace ``group`` (``create_only``: create it with the defaults unless it
        exists), for user ``owner`` (``unbounded``: a Super user, no quota); the config as
        applied."""
        require_leader(self.ctx.node)
        validate_group_name(group.name)
        if create_only:
            group = default_group(group.name, self.default_attempts)
        group = replace(group, owner=owner)
        try:
            check_group(group)
        except InvalidSubGroupRecordError as exc:
            raise InvalidRequestError(str(exc)) from None
        op = OP_CREATE_IF_ABSENT if create_only else OP_UPSERT
        async with self._creating:
            self._check_room(group.name, owner, unbounded)
            await self.ctx.node.propose([encode_subgroup_record(op, group)], ENTRY_SUBGROUP)
        return self.get(group.name)

    def _check_room(self, name: str, owner: str, unbounded: bool) -> None:
        table = self.ctx.sm.subgroups
        if table.get(name) is not None:
            return  # a change of an existing group takes no room
        if not table.room_for(name):
            raise TooManySubGroupsError(
                f"the broker holds {len(table.groups)} subscription groups, the most it may"
            )
        if owner and not unbounded and table.held_by(owner) >= self.per_user:
            raise SubGroupQuotaError(
                f"quota subscriptionGroupsPerUser: user {owner!r} created {self.per_user} "
                "subscription groups here; delete some (mqadmin deleteSubGroup)"
            )

    async def delete(self, name: str) -> None:
        """Drop group ``name``'s config (``mqadmin deleteSubGroup``): it behaves as a group
        without one (:func:`default_group`) until it is created again. Its offsets and POP
        state stay (a consumer of it goes on where it was)."""
        require_leader(self.ctx.node)
        validate_group_name(name)
        if self.ctx.sm.subgroups.get(name) is None:
            raise SubGroupNotFoundError(f"subscription group {name!r} has no config here")
        record = encode_subgroup_record(OP_DELETE, SubGroup(name))
        await self.ctx.node.propose([record], ENTRY_SUBGROUP)
