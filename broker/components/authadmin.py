"""User and ACL admin (``CreateUser`` ... ``ListAcl``) and the first Super user.

Writes are refused with ``NOT_LEADER`` on a follower before anything else (a follower's table
may not have applied the leader's last writes yet: a user created a moment ago would be "not
found" there), then checked against the leader's applied table (a clear error, nothing
proposed), sealed (:class:`broker.state.auth.secrets.SecretBox`), proposed to the Raft log on
the leader as one ``ENTRY_AUTH`` record, and answered after apply with what the table then
holds; a record that was skipped on apply (a concurrent write got there first) is answered
with the reason. Reads answer from this node's applied table. Nothing returned holds a secret
in clear; only ``ExportUsers`` returns secrets, sealed as stored, for ``ImportUsers`` on
another group of the same cluster (same ``acl.key``) to propose as they are
(:meth:`AuthAdmin.import_users`).

``initAuthenticationUser``: whenever this node becomes leader and the table has no user, it
proposes a ``USER_INIT`` record for that user as Super; the record changes nothing when the
table has a user by the time it applies, so two leaders in a row (a failover mid-way) create it
once.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from broker.components.applied import NodeContext, require_leader
from broker.state.auth import records as rec
from broker.state.auth.model import (
    DECISIONS,
    ENABLE,
    MAX_USERS,
    NORMAL,
    SUPER,
    USER_STATUSES,
    USER_TYPES,
    Rule,
    User,
    check_choice,
    check_subject,
    check_username,
    parse_actions,
    parse_resource,
    parse_source_ips,
)
from broker.state.auth.secrets import SecretBox, check_sealed
from broker.state.auth.table import AuthTable
from broker.state.errors import BrokerError, InvalidRequestError
from broker.state.records import ENTRY_AUTH
from dledger.core import Role
from dledger.log import DLedgerError
from mqerrors import codes as E
from mqsecurity import SecurityError
from mqsecurity.credentials import Credentials, check_secret_key
from prockit.fatal import supervise

logger = logging.getLogger(__name__)

# One ImportUsers holds at most as many users as a group can (model.MAX_USERS): a whole group's.
MAX_IMPORT_USERS = MAX_USERS
# Imported users are proposed this many records per log batch (~500 bytes each): one batch
# stays far under the core's proposal bounds and one admin call's apply time stays short.
IMPORT_BATCH_RECORDS = 100

# While leading with an empty table, how often the initial user is proposed again after a
# failed proposal (no quorum yet, leadership lost): the group elects within a second.
INIT_RETRY_S = 1.0


class UserNotFoundError(BrokerError):
    code = E.USER_NOT_FOUND


class AclNotFoundError(BrokerError):
    code = E.ACL_NOT_FOUND


class AlreadyExistsError(BrokerError):
    code = E.ALREADY_EXISTS


@dataclass(frozen=True, slots=True)
class UserView:
    """A user as answers show it: never the secret."""

    username: str
    user_type: str
    status: str


@dataclass(frozen=True, slots=True)
class ImportOutcome:
    """What ``import_users`` did, usernames sorted."""

    created: list[str]
    updated: list[str]
    unchanged: list[str]


def _view(user: User) -> UserView:
    return UserView(user.username, user.user_type, user.status)


def _secret(password: str) -> str:
    try:
        return check_secret_key(password)
    except SecurityError as exc:
        raise InvalidRequestError(f"password: {exc}") from None


class AuthAdmin:
    """The users and ACL rules of one node's group."""

    def __init__(
        self, ctx: NodeContext, box: SecretBox | None, init_user: Credentials | None = None
    ) -> None:
        self.ctx = ctx
        self.box = box
        self.init_user = init_user
        self._init_task: asyncio.Task[None] | None = None
        if init_user is not None:
            ctx.sm.add_change_listener(self.maybe_init)

    @property
    def table(self) -> AuthTable:
        return self.ctx.sm.auth

    def _seal(self, username: str, password: str) -> str:
        if self.box is None:
            raise InvalidRequestError(
                "this broker has no aclEncryptionKeyPath: users cannot be stored"
            )
        return self.box.seal(username, _secret(password))

    async def _propose(self, op: int, doc: Mapping[str, object]) -> None:
        require_leader(self.ctx.node)
        first, _, _ = await self.ctx.node.propose([rec.encode_auth_record(op, doc)], ENTRY_AUTH)
        outcome = self.table.outcome(first)
        if outcome:
            raise InvalidRequestError(f"not applied: {outcome}")

    # ------------------------------------------------------------------ users

    async def create_user(
        self, username: str, password: str, user_type: str, status: str
    ) -> UserView:
        require_leader(self.ctx.node)  # checked against the leader's table, not a stale one
        name = check_username(username)
        doc = {
            "username": name,
            "type": check_choice(user_type or NORMAL, USER_TYPES, "user type"),
            "status": check_choice(status or ENABLE, USER_STATUSES, "user status"),
        }
        if name in self.table.users:
            raise AlreadyExistsError(f"user {name!r} already exists")
        doc["secret"] = self._seal(name, password)
        await self._propose(rec.USER_CREATE, doc)
        return self.get_user(name)

    async def update_user(
        self, username: str, password: str, user_type: str, status: str
    ) -> UserView:
        """Change the fields given (empty: keep)."""
        require_leader(self.ctx.node)
        name = check_username(username)
        self.get_user(name)
        doc: dict[str, object] = {"username": name}
        if user_type:
            doc["type"] = check_choice(user_type, USER_TYPES, "user type")
        if status:
            doc["status"] = check_choice(status, USER_STATUSES, "user status")
        if password:
            doc["secret"] = self._seal(name, password)
        await self._propose(rec.USER_UPDATE, doc)
        return self.get_user(name)

    async def delete_user(self, username: str) -> None:
        require_leader(self.ctx.node)
        name = check_username(username)
        self.get_user(name)
        await self._propose(rec.USER_DELETE, {"username": name})

    def get_user(self, username: str) -> UserView:
        user = self.table.users.get(check_username(username))
        if user is None:
            raise UserNotFoundError(f"user {username!r} does not exist")
        return _view(user)

    def list_users(self, name_filter: str = "") -> list[UserView]:
        """Users whose name contains ``name_filter``, by name."""
        users = sorted(self.table.users.values(), key=lambda u: u.username)
        return [_view(u) for u in users if name_filter in u.username]

    # ------------------------------------------------------------------ copying users

    def export_users(self, username: str = "") -> list[User]:
        """The users as stored (secrets sealed), by name: ``username`` only when given."""
        if username:
            user = self.table.users.get(check_username(username))
            if user is None:
                raise UserNotFoundError(f"user {username!r} does not exist")
            return [user]
        return sorted(self.table.users.values(), key=lambda u: u.username)

    def _check_import(self, users: Sequence[User]) -> list[User]:
        """Every field of every user checked, and every secret opened with this node's key
        (a user sealed under another cluster's key is refused here, not skipped on apply)."""
        if self.box is None:
            raise InvalidRequestError(
                "this broker has no aclEncryptionKeyPath: users cannot be stored"
            )
        if not users or len(users) > MAX_IMPORT_USERS:
            raise InvalidRequestError(f"import 1..{MAX_IMPORT_USERS} users")
        names = [check_username(u.username) for u in users]
        if len(set(names)) != len(names):
            raise InvalidRequestError("a username is given twice")
        for u in users:
            check_choice(u.user_type, USER_TYPES, f"user {u.username!r}: type")
            check_choice(u.status, USER_STATUSES, f"user {u.username!r}: status")
            check_sealed(u.sealed_secret)
            try:
                _secret(self.box.unseal(u.username, u.sealed_secret))
            except InvalidRequestError:
                raise InvalidRequestError(
                    f"the secret of user {u.username!r} does not open with this group's "
                    "aclEncryptionKeyPath key: the source group uses another acl.key (users "
                    "can be copied only between groups of one cluster)"
                ) from None
        return sorted(users, key=lambda u: u.username)

    def _same(self, have: User, given: User) -> bool:
        assert self.box is not None
        return (
            have.user_type == given.user_type
            and have.status == given.status
            and self.box.unseal(have.username, have.sealed_secret)
            == self.box.unseal(given.username, given.sealed_secret)
        )

    async def import_users(self, users: Sequence[User]) -> ImportOutcome:
        """Create or update ``users`` with their sealed secrets as given (checked first: a
        clear error and nothing proposed when any is bad); one already the same is left."""
        checked = self._check_import(users)
        require_leader(self.ctx.node)
        out = ImportOutcome([], [], [])
        plan: list[tuple[int, dict[str, object]]] = []
        for u in checked:
            have = self.table.users.get(u.username)
            if have is not None and self._same(have, u):
                out.unchanged.append(u.username)
                continue
            (out.created if have is None else out.updated).append(u.username)
            doc: dict[str, object] = {"username": u.username, "secret": u.sealed_secret}
            doc |= {"type": u.user_type, "status": u.status}
            plan.append((rec.USER_CREATE if have is None else rec.USER_UPDATE, doc))
        if len(self.table.users) + len(out.created) > MAX_USERS:
            raise InvalidRequestError(
                f"{len(out.created)} new users would take the group over {MAX_USERS} users"
            )
        for start in range(0, len(plan), IMPORT_BATCH_RECORDS):
            await self._propose_batch(plan[start : start + IMPORT_BATCH_RECORDS])
        return out

    async def _propose_batch(self, plan: Sequence[tuple[int, Mapping[str, object]]]) -> None:
        """Records proposed as one log batch; the first skipped one's reason raised."""
        bodies = [rec.encode_auth_record(op, doc) for op, doc in plan]
        first, last, _ = await self.ctx.node.propose(bodies, ENTRY_AUTH)
        for index in range(first, last + 1):
            outcome = self.table.outcome(index)
            if outcome:
                raise InvalidRequestError(f"not applied: {outcome}")

    # ------------------------------------------------------------------ rules

    def _rules(
        self, resources: Sequence[str], actions: Sequence[str], decision: str, ips: Sequence[str]
    ) -> list[Rule]:
        if not resources:
            raise InvalidRequestError("give at least one resource (-r Topic:t,Group:g)")
        acts = parse_actions(actions)
        chosen = check_choice(decision or "Allow", DECISIONS, "decision")
        source_ips = parse_source_ips(list(ips))
        return [Rule(parse_resource(r), acts, chosen, source_ips) for r in resources]

    async def put_acl(
        self,
        subject: str,
        resources: Sequence[str],
        actions: Sequence[str],
        decision: str,
        source_ips: Sequence[str],
        *,
        update: bool,
    ) -> list[Rule]:
        """createAcl (``update`` False) or updateAcl: the subject's rules after apply."""
        require_leader(self.ctx.node)  # a follower may not have applied the user yet
        subject = check_subject(subject)
        if subject[len("User:") :] not in self.table.users:
            raise UserNotFoundError(f"{subject}: no such user")
        rules = self._rules(resources, actions, decision, source_ips)
        have = {r.resource for r in self.table.acls.get(subject, [])}
        given = {r.resource for r in rules}
        if not update and have & given:
            shown = ", ".join(sorted(map(str, have & given)))
            raise AlreadyExistsError(f"{subject} already has rules for {shown} (use updateAcl)")
        if update and not given <= have:
            shown = ", ".join(sorted(map(str, given - have)))
            raise AclNotFoundError(f"{subject} has no rules for {shown} (use createAcl)")
        op = rec.ACL_UPDATE if update else rec.ACL_CREATE
        await self._propose(op, {"subject": subject, "rules": [r.to_doc() for r in rules]})
        return self.get_acl(subject)

    async def delete_acl(self, subject: str, resources: Sequence[str]) -> None:
        """Drop the subject's rules for ``resources`` (all of its rules when empty)."""
        require_leader(self.ctx.node)
        subject = check_subject(subject)
        self.get_acl(subject)
        names = [str(parse_resource(r)) for r in resources]
        await self._propose(rec.ACL_DELETE, {"subject": subject, "resources": names})

    def get_acl(self, subject: str) -> list[Rule]:
        rules = self.table.acls.get(check_subject(subject))
        if not rules:
            raise AclNotFoundError(f"{subject} has no rules")
        return list(rules)

    def list_acls(
        self, subject_filter: str = "", resource_filter: str = ""
    ) -> list[tuple[str, list[Rule]]]:
        """(subject, rules) whose subject contains ``subject_filter`` and, of those, the rules
        whose resource contains ``resource_filter``."""
        out = []
        for subject, rules in sorted(self.table.acls.items()):
            if subject_filter not in subject:
                continue
            kept = [r for r in rules if resource_filter in str(r.resource)]
            if kept:
                out.append((subject, kept))
        return out

    # ------------------------------------------------------------------ the first user

    def maybe_init(self) -> None:
        """A change listener: a new leader with an empty table proposes the initial user."""
        if self.ctx.sm.role is not Role.LEADER or self.table.users:
            return
        if self._init_task is not None and not self._init_task.done():
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # applied outside the event loop (tests)
            return
        self._init_task = supervise(loop.create_task(self._init_loop(), name="acl-init"), "acl")

    async def _init_loop(self) -> None:
        assert self.init_user is not None
        node = self.ctx.node
        term = node.term
        while not self.table.users and node.role is Role.LEADER and node.term == term:
            name = self.init_user.access_key
            doc = {
                "username": name,
                "type": SUPER,
                "status": ENABLE,
                "secret": self._seal(name, self.init_user.secret_key),
            }
            try:
                await self._propose(rec.USER_INIT, doc)
            except (DLedgerError, BrokerError, TimeoutError) as exc:
                logger.info("initial user not created yet: %s", exc)
                await asyncio.sleep(INIT_RETRY_S)
                continue
            logger.info("initial Super user created username=%s", name)
            # Proposed once per term: an accepted proposal is applied (or, only under the
            # test-only unsafeAckBeforeReplication, possibly lost: the next leader's
            # maybe_init proposes again). Looping on `self.table.users` instead spun the
            # event loop re-proposing while the entry was acknowledged but not yet applied,
            # and starved the leader's heartbeats (mqjepsen --unsafe-ack: no leader).
            return
