"""The replicated users and ACL rules of one broker group, built from committed records.

:meth:`AuthTable.apply` is called by ``BrokerStateMachine.apply`` for every ``ENTRY_AUTH``
record; it validates everything before it changes anything and raises `InvalidRequestError`
(a ``BrokerError``: the member skips the record, as every other member does) otherwise. The
outcome of each of the last :data:`OUTCOMES_KEPT` records is kept so the leader's admin call
can say whether its own record took effect. The table is part of the broker's snapshot
(:meth:`to_snapshot`, :meth:`load_snapshot`): secrets only sealed.
"""

from __future__ import annotations

import itertools
import logging
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

from broker.state.auth import records as rec
from broker.state.auth.model import (
    ENABLE,
    MAX_RULES,
    MAX_RULES_PER_SUBJECT,
    MAX_USERS,
    NORMAL,
    USER_STATUSES,
    USER_TYPES,
    Resource,
    Rule,
    User,
    check_choice,
    check_subject,
    check_username,
    parse_resource,
    rule_from_doc,
    subject_of,
)
from broker.state.auth.secrets import check_sealed
from broker.state.errors import InvalidRequestError

logger = logging.getLogger(__name__)

# Every change of any table in the process gets a new number: caches of decisions made from a
# table (broker.frontends.authguard) know they are stale, even across a rebuilt table.
_VERSIONS = itertools.count(1)
# The leader's admin handler reads its record's outcome right after apply; a few hundred
# records back is far more than a handler ever needs.
OUTCOMES_KEPT = 256


class AuthTable:
    """Users by name and rules by subject (``User:<name>``)."""

    def __init__(self) -> None:
        self.users: dict[str, User] = {}
        self.acls: dict[str, list[Rule]] = {}
        self._outcomes: OrderedDict[int, str] = OrderedDict()
        # The snapshot form, kept until the next change (snapshots are taken every second).
        self._doc: dict[str, Any] | None = None
        self.version = next(_VERSIONS)

    @property
    def rule_count(self) -> int:
        return sum(len(rules) for rules in self.acls.values())

    def outcome(self, index: int) -> str | None:
        """'' when record ``index`` was applied, the reason when it was skipped, None when
        unknown (not an auth record, or too long ago)."""
        return self._outcomes.get(index)

    def _note(self, index: int, outcome: str) -> None:
        self._outcomes[index] = outcome
        while len(self._outcomes) > OUTCOMES_KEPT:
            self._outcomes.popitem(last=False)

    def apply(self, index: int, body: bytes) -> None:
        """Apply the record of log entry ``index``; `InvalidRequestError` when it is skipped."""
        try:
            op, doc = rec.decode_auth_record(body)
            if op in (rec.USER_INIT, rec.USER_CREATE, rec.USER_UPDATE, rec.USER_DELETE):
                self._apply_user(op, doc)
            else:
                self._apply_acl(op, doc)
        except InvalidRequestError as exc:
            self._note(index, str(exc) or "invalid record")
            raise
        self._note(index, "")
        self._doc = None
        self.version = next(_VERSIONS)

    # ------------------------------------------------------------------ users

    def _apply_user(self, op: int, doc: Mapping[str, Any]) -> None:
        name = check_username(doc.get("username"))
        existing = self.users.get(name)
        if op == rec.USER_DELETE:
            if existing is None:
                raise InvalidRequestError(f"user {name!r} does not exist")
            del self.users[name]
            self.acls.pop(subject_of(name), None)
            logger.info("user deleted username=%s", name)
            return
        if op == rec.USER_UPDATE:
            if existing is None:
                raise InvalidRequestError(f"user {name!r} does not exist")
            user = _user_from_doc(name, doc, existing)
        else:
            if op == rec.USER_INIT and self.users:
                raise InvalidRequestError("initial user: the table already has users")
            if existing is not None:
                raise InvalidRequestError(f"user {name!r} already exists")
            if len(self.users) >= MAX_USERS:
                raise InvalidRequestError(f"the group already has {MAX_USERS} users")
            user = _user_from_doc(name, doc, None)
        self.users[name] = user
        logger.info("user set username=%s type=%s status=%s", name, user.user_type, user.status)

    # ------------------------------------------------------------------ rules

    def _apply_acl(self, op: int, doc: Mapping[str, Any]) -> None:
        subject = check_subject(doc.get("subject"))
        current = self.acls.get(subject, [])
        if op == rec.ACL_DELETE:
            resources = _resources(doc.get("resources", []))
            if not current:
                raise InvalidRequestError(f"{subject} has no rules")
            if resources and not any(r.resource in resources for r in current):
                shown = ", ".join(sorted(str(r) for r in resources))
                raise InvalidRequestError(f"{subject} has no rules for {shown}")
            kept = [r for r in current if resources and r.resource not in resources]
            self._set_rules(subject, kept)
            return
        if subject[len("User:") :] not in self.users:
            raise InvalidRequestError(f"{subject}: no such user")
        rules = _rules(doc.get("rules"))
        have = {r.resource for r in current}
        given = [r.resource for r in rules]
        if op == rec.ACL_CREATE and have & set(given):
            shown = ", ".join(sorted(str(r) for r in have & set(given)))
            raise InvalidRequestError(f"{subject} already has rules for {shown} (updateAcl)")
        if op == rec.ACL_UPDATE and not set(given) <= have:
            shown = ", ".join(sorted(str(r) for r in set(given) - have))
            raise InvalidRequestError(f"{subject} has no rules for {shown} (createAcl)")
        merged = [r for r in current if r.resource not in set(given)] + rules
        if len(merged) > MAX_RULES_PER_SUBJECT:
            raise InvalidRequestError(f"a subject holds at most {MAX_RULES_PER_SUBJECT} rules")
        if self.rule_count - len(current) + len(merged) > MAX_RULES:
            raise InvalidRequestError(f"the group holds at most {MAX_RULES} rules")
        self._set_rules(subject, merged)

    def _set_rules(self, subject: str, rules: list[Rule]) -> None:
        if rules:
            self.acls[subject] = rules
        else:
            self.acls.pop(subject, None)
        logger.info("acl set subject=%s rules=%d", subject, len(rules))

    # ------------------------------------------------------------------ snapshot

    def to_snapshot(self) -> dict[str, Any]:
        """The snapshot form (shared until the next change: do not modify it)."""
        if self._doc is None:
            self._doc = self._snapshot_doc()
        return self._doc

    def _snapshot_doc(self) -> dict[str, Any]:
        return {
            "users": {
                u.username: [u.sealed_secret, u.user_type, u.status]
                for u in sorted(self.users.values(), key=lambda u: u.username)
            },
            "acls": {s: [r.to_doc() for r in rules] for s, rules in sorted(self.acls.items())},
        }

    def load_snapshot(self, data: Mapping[str, Any]) -> list[str]:
        """Replace the table with a snapshot's; the names of the entries left out as invalid
        (a snapshot file is as hostile as a record)."""
        self.users, self.acls, self._doc, bad = {}, {}, None, []
        self.version = next(_VERSIONS)
        for name, fields in dict(data.get("users", {})).items():
            try:
                sealed, user_type, status = fields
                doc = {"secret": sealed, "type": user_type, "status": status}
                if len(self.users) >= MAX_USERS:
                    raise InvalidRequestError("too many users")
                self.users[check_username(name)] = _user_from_doc(name, doc, None)
            except (InvalidRequestError, TypeError, ValueError):
                bad.append(f"user {str(name)[:64]}")
        for subject, docs in dict(data.get("acls", {})).items():
            try:
                check_subject(subject)
                rules = _rules(docs)
                if self.rule_count + len(rules) > MAX_RULES or subject[5:] not in self.users:
                    raise InvalidRequestError("over the limit or no such user")
                self.acls[subject] = rules
            except InvalidRequestError:
                bad.append(f"acl {str(subject)[:70]}")
        return bad


def _user_from_doc(name: str, doc: Mapping[str, Any], base: User | None) -> User:
    """A user from a record's fields; on update, fields left out keep ``base``'s values."""
    sealed = doc.get("secret") if base is None or "secret" in doc else base.sealed_secret
    user_type = doc.get("type", base.user_type if base else NORMAL)
    status = doc.get("status", base.status if base else ENABLE)
    return User(
        name,
        check_sealed(sealed),
        check_choice(user_type, USER_TYPES, "user type"),
        check_choice(status, USER_STATUSES, "user status"),
    )


def _rules(docs: object) -> list[Rule]:
    if not isinstance(docs, list) or not 0 < len(docs) <= MAX_RULES_PER_SUBJECT:
        raise InvalidRequestError(f"rules must be a list of 1..{MAX_RULES_PER_SUBJECT}")
    rules = [rule_from_doc(d) for d in docs]
    if len({r.resource for r in rules}) != len(rules):
        raise InvalidRequestError("rules name a resource twice")
    return rules


def _resources(values: object) -> set[Resource]:
    if not isinstance(values, list) or len(values) > MAX_RULES_PER_SUBJECT:
        raise InvalidRequestError(f"resources must be a list of at most {MAX_RULES_PER_SUBJECT}")
    return {parse_resource(v) for v in values}
