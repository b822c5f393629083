"""Users and ACL rules, RocketMQ 5.3's ACL 2.0 model, and the rule matcher.

A user is an AccessKey (``username``) with a SecretKey (kept sealed,
:mod:`broker.state.auth.secrets`), a type (``Super``: every action on every resource; ``Normal``:
what its rules allow) and a status (``enable`` / ``disable``: a disabled user cannot authenticate).

A rule belongs to a subject ``User:<name>`` and says: on ``resource`` (``Cluster:<name>``,
``Topic:<name>``, ``Group:<name>``; the name may be ``*`` for every one of that type or end
with ``*`` for a prefix, ``Topic:order-*``), the ``actions`` (Pub, Sub, Create, Update, Delete,
Get, List, or All) are allowed or denied (``decision``), optionally only from ``source_ips``
(addresses or CIDR blocks). A call needs every (resource, action) pair it touches to be allowed
by some rule and denied by none: Deny wins, and what no rule allows is denied.

Everything here is a pure function of its inputs: every member validates a replicated record
with these functions and must reach the same answer.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from broker.state.errors import InvalidRequestError

SUPER = "Super"
NORMAL = "Normal"
USER_TYPES = (SUPER, NORMAL)
ENABLE = "enable"
DISABLE = "disable"
USER_STATUSES = (ENABLE, DISABLE)
ALLOW = "Allow"
DENY = "Deny"
DECISIONS = (ALLOW, DENY)

PUB, SUB, CREATE, UPDATE, DELETE, GET, LIST, ALL = (
    "Pub",
    "Sub",
    "Create",
    "Update",
    "Delete",
    "Get",
    "List",
    "All",
)
ACTIONS = (PUB, SUB, CREATE, UPDATE, DELETE, GET, LIST, ALL)
CLUSTER, TOPIC, GROUP = "Cluster", "Topic", "Group"
RESOURCE_TYPES = (CLUSTER, TOPIC, GROUP)
SUBJECT_PREFIX = "User:"

# RocketMQ 5.3 bounds a username to 64 characters (mqsecurity.credentials.MAX_ACCESS_KEY_CHARS
# is the same bound for the AccessKey a signature names).
MAX_USERNAME_CHARS = 64
_USERNAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-")
# Users and rules live in memory on every member and in every snapshot: a group serves a few
# applications, each with a handful of users; 1,000 users and 10,000 rules are far beyond that
# and keep a snapshot's auth part under ~2 MB.
MAX_USERS = 1_000
MAX_RULES = 10_000
# One subject's rules are scanned on each of its calls: 100 keeps that scan short.
MAX_RULES_PER_SUBJECT = 100
# A resource name is a topic (127), a group (255) or a cluster name; 255 covers all three.
MAX_RESOURCE_NAME_CHARS = 255
# Source IPs of one rule: a few addresses or blocks; each is matched on every call.
MAX_SOURCE_IPS = 16
MAX_SOURCE_IP_CHARS = 64  # "ffff:...:ffff/128" is 43
# Resource names: the characters of topic and group names (broker.state.names), and '*' at the end.
_RESOURCE_NAME_CHARS = frozenset(
    "%|abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-."
)


def _shown(text: object) -> str:
    return repr(text)[:80]


def check_username(name: object) -> str:
    """``name`` if it is a valid username (AccessKey), else `InvalidRequestError`."""
    if not isinstance(name, str) or not 0 < len(name) <= MAX_USERNAME_CHARS:
        raise InvalidRequestError(f"username must be 1..{MAX_USERNAME_CHARS} characters")
    if not set(name) <= _USERNAME_CHARS:
        raise InvalidRequestError(
            f"username {_shown(name)} may hold only letters, digits, '_' and '-'"
        )
    return name


def check_choice(value: object, allowed: Sequence[str], what: str) -> str:
    """``value`` if it is one of ``allowed`` (case as RocketMQ spells them, or any case)."""
    if isinstance(value, str):
        for choice in allowed:
            if value.lower() == choice.lower():
                return choice
    raise InvalidRequestError(f"{what} {_shown(value)} is not one of {', '.join(allowed)}")


def subject_of(username: str) -> str:
    return SUBJECT_PREFIX + username


def check_subject(subject: object) -> str:
    """``User:<name>`` with a valid name; the only subject kind (RocketMQ 5.3 has only users)."""
    if not isinstance(subject, str) or not subject.startswith(SUBJECT_PREFIX):
        raise InvalidRequestError(f"subject {_shown(subject)} must be User:<username>")
    check_username(subject[len(SUBJECT_PREFIX) :])
    return subject


@dataclass(frozen=True, slots=True)
class Resource:
    """``Type:name``; ``name`` ``*`` matches every name, ``prefix*`` every name starting so."""

    type: str
    name: str

    def __str__(self) -> str:
        return f"{self.type}:{self.name}"

    def matches(self, other: Resource) -> bool:
        """Whether this pattern covers the concrete resource ``other``."""
        if self.type != other.type:
            return False
        if self.name.endswith("*"):
            return other.name.startswith(self.name[:-1])
        return self.name == other.name


def parse_resource(text: object) -> Resource:
    """A rule's resource pattern, checked; `InvalidRequestError` naming what is wrong."""
    if not isinstance(text, str):
        raise InvalidRequestError(f"resource {_shown(text)} is not Type:name")
    kind, colon, name = text.partition(":")
    if not colon:
        raise InvalidRequestError(f"resource {_shown(text)} is not Type:name")
    kind = check_choice(kind, RESOURCE_TYPES, "resource type")
    if not 0 < len(name) <= MAX_RESOURCE_NAME_CHARS:
        raise InvalidRequestError(f"resource name must be 1..{MAX_RESOURCE_NAME_CHARS} characters")
    if "*" in name[:-1] or not set(name) <= _RESOURCE_NAME_CHARS | {"*"}:
        raise InvalidRequestError(
            f"resource name {_shown(name)} may hold topic/group name characters, "
            "and '*' only at its end"
        )
    return Resource(kind, name)


def parse_actions(values: Iterable[object]) -> tuple[str, ...]:
    """Distinct actions in RocketMQ's spelling, in :data:`ACTIONS` order; at least one."""
    chosen = {check_choice(v, ACTIONS, "action") for v in values}
    if not chosen:
        raise InvalidRequestError("a rule needs at least one action")
    return tuple(a for a in ACTIONS if a in chosen)


def parse_source_ips(values: Sequence[object]) -> tuple[str, ...]:
    """Addresses or CIDR blocks, normalized (``10.0.0.0/8``); at most :data:`MAX_SOURCE_IPS`."""
    if len(values) > MAX_SOURCE_IPS:
        raise InvalidRequestError(f"a rule holds at most {MAX_SOURCE_IPS} source IPs")
    out: list[str] = []
    for value in values:
        if not isinstance(value, str) or not 0 < len(value) <= MAX_SOURCE_IP_CHARS:
            raise InvalidRequestError(f"source IP {_shown(value)} is not an address or block")
        try:
            out.append(str(ipaddress.ip_network(value.strip(), strict=False)))
        except ValueError:
            raise InvalidRequestError(
                f"source IP {_shown(value)} is not an address or block"
            ) from None
    return tuple(dict.fromkeys(out))


@dataclass(frozen=True, slots=True)
class Rule:
    """One policy entry of a subject: a resource pattern, actions, decision, source IPs."""

    resource: Resource
    actions: tuple[str, ...]
    decision: str
    source_ips: tuple[str, ...] = ()

    def to_doc(self) -> dict[str, object]:
        return {
            "resource": str(self.resource),
            "actions": list(self.actions),
            "decision": self.decision,
            "sourceIps": list(self.source_ips),
        }

    def covers(self, resource: Resource, action: str, peer_ip: str) -> bool:
        if ALL not in self.actions and action not in self.actions:
            return False
        return self.resource.matches(resource) and _ip_allowed(self.source_ips, peer_ip)


def rule_from_doc(doc: object) -> Rule:
    """A rule from its record or snapshot form, every field checked."""
    if not isinstance(doc, dict):
        raise InvalidRequestError("a rule must be an object")
    actions = doc.get("actions")
    ips = doc.get("sourceIps", [])
    if not isinstance(actions, list) or not isinstance(ips, list):
        raise InvalidRequestError("a rule's actions and sourceIps must be lists")
    if len(actions) > len(ACTIONS):
        raise InvalidRequestError(f"a rule names at most {len(ACTIONS)} actions")
    return Rule(
        parse_resource(doc.get("resource")),
        parse_actions(actions),
        check_choice(doc.get("decision"), DECISIONS, "decision"),
        parse_source_ips(ips),
    )


def peer_ip(peer: str) -> str:
    """The address of a gRPC peer string (``ipv4:1.2.3.4:5``, ``ipv6:[::1]:5``); '' otherwise."""
    kind, _, rest = peer.partition(":")
    if kind == "ipv4":
        return rest.rpartition(":")[0]
    if kind == "ipv6":
        return rest.rpartition(":")[0].strip("[]")
    return ""


def _ip_allowed(source_ips: Sequence[str], ip: str) -> bool:
    if not source_ips:
        return True
    try:
        address = ipaddress.ip_address(ip)
    except ValueError:
        return False
    return any(address in ipaddress.ip_network(block) for block in source_ips)


@dataclass(frozen=True, slots=True)
class User:
    """A user as the replicated table holds it: the secret only sealed."""

    username: str
    sealed_secret: str
    user_type: str = NORMAL
    status: str = ENABLE

    @property
    def is_super(self) -> bool:
        return self.user_type == SUPER

    @property
    def enabled(self) -> bool:
        return self.status == ENABLE


def decide(
    user: User, rules: Sequence[Rule], wants: Iterable[tuple[Resource, str]], ip: str
) -> tuple[Resource, str] | None:
    """None when ``user`` may do everything in ``wants`` from ``ip``, else the first
    (resource, action) pair refused. Super users may do everything; for the others each pair
    needs an Allow rule covering it and no Deny rule covering it."""
    if user.is_super:
        return None
    for resource, action in wants:
        allowed = False
        for rule in rules:
            if rule.covers(resource, action, ip):
                if rule.decision == DENY:
                    return resource, action
                allowed = True
        if not allowed:
            return resource, action
    return None
