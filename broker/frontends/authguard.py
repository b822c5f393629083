"""The broker's call guard: who is calling, and may they (``authenticationEnabled``,
``authorizationEnabled``).

``DLedgerNode`` asks :meth:`AuthGuard.check` about every call on its client port
(:mod:`rpckit.callguard`). Authentication reads the RocketMQ 5 signature
(:mod:`mqsecurity.signing`), finds the AccessKey in the replicated user table of this node's
state machine, unseals its secret and checks the HMAC and the clock skew. Authorization maps the
method and request to (resource, action) pairs (:mod:`broker.frontends.rpcmap`) and asks the rule
matcher (:func:`broker.state.auth.model.decide`). Authorization needs to know the caller, so with it
on every call must be signed even when authentication is off. Every refusal is counted in
``mqsecurity.refusals.REFUSALS``; no reason names a secret or the expected signature.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from secrets import token_hex

import grpc
from raftmq.broker.internal.v1 import leaderops_pb2 as ipb

from broker.frontends import rpcmap
from broker.frontends.internal.codec import proof_of
from broker.state.auth.model import SUB, Resource, User, decide, peer_ip, subject_of
from broker.state.auth.secrets import SecretBox
from broker.state.errors import BrokerError
from broker.state.machine import BrokerStateMachine
from mqerrors import codes as E
from mqsecurity import SignatureError, SignatureMismatchError
from mqsecurity.refusals import AUTHENTICATION, AUTHORIZATION, REFUSALS
from mqsecurity.signing import (
    DATE_TIME_FORMAT,
    DEFAULT_MAX_SKEW_MS,
    SignedRequest,
    check_signature,
    read_signed_request,
)
from rpckit.callguard import Refusal, text_metadata
from rpckit.decodeguard import Undecodable

# The answer to a signature no known user's secret produced, whether the access key is
# unknown, disabled, or known with another secret.
NOT_SIGNED_BY = "the signature does not match its secret"

# The answer while the group has no user at all: it has just started and its first leader's
# initial user (initAuthenticationUser) is not applied here yet. Nobody can be told apart from
# anybody then: the call is refused, not counted as an authentication failure (a healthy
# group starting would raise the refusal metric on every member).
NO_USERS_YET = "this group has no users yet (its first leader creates the initial one): retry"

# The one method whose request may carry a remoting caller's proof (a forwarded leader
# operation).
LEADER_CALL = rpcmap.LEADER_OPS + "Call"

# A client signs each call with its clock in seconds, so the calls of one second share one
# signature: a checked one is remembered (with its time, the skew is checked on every call),
# which saves parsing the time and the HMAC on most calls. Decisions are remembered per
# (user, pairs, address) until the table changes. Both bounded: cleared when full.
VERIFIED_CACHE_ENTRIES = 4096
DECISION_CACHE_ENTRIES = 4096


@dataclass(frozen=True, slots=True)
class AuthSettings:
    authentication_enabled: bool = False
    authorization_enabled: bool = False
    max_skew_ms: int = DEFAULT_MAX_SKEW_MS
    cluster_name: str = "DefaultCluster"

    @property
    def active(self) -> bool:
        return self.authentication_enabled or self.authorization_enabled


class AuthGuard:
    """A ``rpckit.callguard.CallGuard`` over a broker state machine's user table."""

    def __init__(
        self,
        sm: BrokerStateMachine,
        settings: AuthSettings,
        box: SecretBox | None,
        topic_at: Callable[[int], str] | None = None,
    ) -> None:
        """``topic_at`` names the topic of the applied message at a commitlog position, for
        the calls that name stored messages (None: such calls are for Super users only)."""
        self.sm = sm
        self.settings = settings
        self.box = box
        # (username, sealed secret) -> secret: unsealed once per secret, not once per call.
        self._secrets: dict[tuple[str, str], str] = {}
        self._verified: dict[tuple[str, str, str, str], datetime] = {}
        self._decisions: dict[tuple[str, tuple[tuple[Resource, str], ...], str], bool] = {}
        self._decided_version = 0
        # What an unknown access key's signature is checked against (never matches).
        self._decoy_secret = token_hex(20)
        self.topic_at = topic_at

    def check(
        self, method: str, metadata: Mapping[str, str], peer: str, request: object
    ) -> Refusal | None:
        if not self.settings.active:
            return None
        proven = self._remoting_forward(method, peer, request)
        if proven is not None:
            return proven if isinstance(proven, Refusal) else None
        user_or_refusal = self._authenticate(method, metadata, peer)
        if isinstance(user_or_refusal, Refusal):
            return user_or_refusal
        if not self.settings.authorization_enabled or isinstance(request, Undecodable):
            # An undecodable request is refused by decodeguard next, before anything runs.
            return None
        return self._authorize(user_or_refusal, method, peer, request)

    def _remoting_forward(
        self, method: str, peer: str, request: object
    ) -> tuple[str, bool] | Refusal | None:
        """A forwarded leader operation of a remoting caller (its call carries the caller's
        :class:`~broker.frontends.internal.codec.RemotingProof`): checked as the direct request
        is (:meth:`check_remoting`), for the rights of the operation inside. None: the call
        carries no remoting proof (its metadata's signature is checked)."""
        if method != LEADER_CALL or not isinstance(request, ipb.LeaderCall):
            return None
        try:
            proof = proof_of(request)
        except BrokerError as exc:
            return self._refuse(AUTHENTICATION, E.UNAUTHENTICATED, str(exc), method, peer)
        if proof is None:
            return None
        needs = rpcmap.RPC_NEEDS[LEADER_CALL]
        assert not isinstance(needs, str)
        wants = needs(request, self.settings.cluster_name)
        return self.check_remoting(
            proof.access_key, proof.signature, proof.signed, wants, peer_ip(peer), method
        )

    def identify(self, metadata: Mapping[str, str], request: object = None) -> tuple[str, bool]:
        """The user who signed a call :meth:`check` admitted (in its metadata, or for a
        forwarded remoting request in ``request``'s proof), and whether it is a Super user
        (("", False) for an unsigned one: the guard is off)."""
        if isinstance(request, ipb.LeaderCall) and request.HasField("remoting"):
            key = request.remoting.access_key
            user = self.sm.auth.users.get(key)
            return key, user is not None and user.is_super
        try:
            signed = read_signed_request(dict(metadata))
        except SignatureError:
            return "", False
        if signed is None:
            return "", False
        user = self.sm.auth.users.get(signed.access_key)
        return signed.access_key, user is not None and user.is_super

    def authorize(self, username: str, method: str, peer: str, request: object) -> Refusal | None:
        """Authorization alone, for an action inside a call already admitted for ``username``
        (a command on a v2 Telemetry stream, a check-back to send on one): ``method`` is a row
        of :mod:`broker.frontends.rpcmap`. A user deleted or disabled since is refused."""
        if not self.settings.authorization_enabled:
            return None
        user = self.sm.auth.users.get(username)
        if user is None or not user.enabled:
            text = f"access key {username!r} is unknown or disabled"
            return self._refuse(AUTHENTICATION, E.UNAUTHENTICATED, text, method, peer)
        return self._authorize(user, method, peer, request)

    def check_remoting(
        self,
        access_key: str,
        signature: str,
        signed: bytes,
        wants: Sequence[tuple[Resource, str]],
        ip: str,
        method: str,
    ) -> tuple[str, bool] | Refusal:
        """A remoting request (RocketMQ 4.x's ACL, docs/REMOTING.md): ``signature`` must be
        the base64 HMAC-SHA1, under ``access_key``'s secret, of ``signed`` (the request's ext
        field values but the signature's, in key order, then its body); then, with
        authorization on, the user must be allowed ``wants`` from ``ip``. The user and whether
        it is a Super user, or the refusal (counted as every other front end's)."""
        if not access_key or not signature:
            text = "this broker requires signed requests (AccessKey and Signature)"
            return self._refuse(AUTHENTICATION, E.UNAUTHENTICATED, text, method, ip)
        if not self.sm.auth.users:
            return Refusal(False, E.UNAUTHENTICATED, NO_USERS_YET)
        user = self.sm.auth.users.get(access_key)
        known = user is not None and user.enabled
        try:
            secret = self._secret(user) if user is not None and known else self._decoy_secret
        except BrokerError as exc:
            text = f"access key {access_key!r}: {exc}"
            return self._refuse(AUTHENTICATION, E.UNAUTHENTICATED, text, method, ip)
        expected = base64.b64encode(hmac.new(secret.encode(), signed, hashlib.sha1).digest())
        if not (hmac.compare_digest(expected, signature.encode()) and known):
            text = f"access key {access_key!r} is unknown or disabled, or {NOT_SIGNED_BY}"
            return self._refuse(AUTHENTICATION, E.UNAUTHENTICATED, text, method, ip)
        assert user is not None
        if self.settings.authorization_enabled:
            refused = self._decide(user, wants, ip)
            if refused is not None:
                resource, action = refused
                text = f"user {user.username!r} may not {action} on {resource}"
                return self._refuse(AUTHORIZATION, E.PERMISSION_DENIED, text, method, ip)
        return user.username, user.is_super

    def _refuse(
        self, reason: str, code: str, text: str, method: str, peer: str, why: str = ""
    ) -> Refusal:
        """Count and log the refusal (with ``why``, the operator's detail the caller is not
        told), and answer ``text``."""
        detail = f" ({why})" if why else ""
        REFUSALS.count(reason, f"{code} {text}{detail} method={method} peer={peer}")
        return Refusal(reason == AUTHORIZATION, code, text)

    def _authenticate(self, method: str, metadata: Mapping[str, str], peer: str) -> User | Refusal:
        try:
            signed = read_signed_request(dict(metadata))
        except SignatureError as exc:
            return self._refuse(AUTHENTICATION, E.UNAUTHENTICATED, str(exc), method, peer)
        if signed is None:
            text = "this broker requires signed requests (AccessKey/SecretKey credentials)"
            return self._refuse(AUTHENTICATION, E.UNAUTHENTICATED, text, method, peer)
        if not self.sm.auth.users:
            return Refusal(False, E.UNAUTHENTICATED, NO_USERS_YET)
        user = self.sm.auth.users.get(signed.access_key)
        try:
            if user is not None and user.enabled:
                self._check(user, signed)
                return user
            # The same work and the same answer as a known user's wrong signature: neither
            # the reason nor the time taken tells a caller which users exist.
            check_signature(signed, self._decoy_secret, None, self.settings.max_skew_ms)
            raise SignatureMismatchError("unknown or disabled access key")  # 2**-160 odds
        except SignatureMismatchError as exc:
            text = f"access key {signed.access_key!r} is unknown or disabled, or {NOT_SIGNED_BY}"
            return self._refuse(AUTHENTICATION, E.UNAUTHENTICATED, text, method, peer, str(exc))
        except (SignatureError, BrokerError) as exc:
            text = f"access key {signed.access_key!r}: {exc}"
            return self._refuse(AUTHENTICATION, E.UNAUTHENTICATED, text, method, peer)

    def _check(self, user: User, signed: SignedRequest) -> None:
        """`check_signature`, through the cache of signatures already checked."""
        key = (user.username, user.sealed_secret, signed.date_time, signed.signature)
        now = datetime.now(UTC)
        signed_at = self._verified.get(key)
        max_skew_s = self.settings.max_skew_ms / 1000
        if signed_at is not None and abs((now - signed_at).total_seconds()) <= max_skew_s:
            return
        check_signature(signed, self._secret(user), now, self.settings.max_skew_ms)
        if len(self._verified) >= VERIFIED_CACHE_ENTRIES:
            self._verified.clear()
        parsed = datetime.strptime(signed.date_time, DATE_TIME_FORMAT).replace(tzinfo=UTC)
        self._verified[key] = parsed

    def _secret(self, user: User) -> str:
        key = (user.username, user.sealed_secret)
        secret = self._secrets.get(key)
        if secret is None:
            if self.box is None:
                raise BrokerError("this node has no aclEncryptionKeyPath key to check signatures")
            secret = self.box.unseal(user.username, user.sealed_secret)
            if len(self._secrets) >= 2 * len(self.sm.auth.users) + 16:
                self._secrets.clear()  # bounded: old secrets of updated or deleted users
            self._secrets[key] = secret
        return secret

    def _authorize(self, user: User, method: str, peer: str, request: object) -> Refusal | None:
        needs = rpcmap.RPC_NEEDS.get(method, rpcmap.SUPER_ONLY)
        if isinstance(needs, str):  # SUPER_ONLY
            if user.is_super:
                return None
            text = f"user {user.username!r} is not a Super user: {method} is for admins only"
            return self._refuse(AUTHORIZATION, E.PERMISSION_DENIED, text, method, peer)
        alternatives = rpcmap.ANY_OF.get(method)
        if alternatives is not None and not user.is_super:
            options = alternatives(request, self.settings.cluster_name)
            if any(self._decide(user, wants, peer_ip(peer)) is None for wants in options):
                return None
        wants = needs(request, self.settings.cluster_name)
        stored = rpcmap.STORED_MESSAGES.get(method)
        if stored is not None and not user.is_super:
            if self.topic_at is None:
                text = f"{method} needs the stored messages' topics: for admins only here"
                return self._refuse(AUTHORIZATION, E.PERMISSION_DENIED, text, method, peer)
            wants = wants + self._stored_topics(stored(request))
        refused = self._decide(user, wants, peer_ip(peer))
        if refused is None:
            return None
        resource, action = refused
        text = f"user {user.username!r} may not {action} on {resource}"
        return self._refuse(AUTHORIZATION, E.PERMISSION_DENIED, text, method, peer)

    def _decide(
        self, user: User, wants: Sequence[tuple[Resource, str]], ip: str
    ) -> tuple[Resource, str] | None:
        """`decide`, through the cache of decisions made from this version of the table."""
        table = self.sm.auth
        if table.version != self._decided_version or len(self._decisions) >= (
            DECISION_CACHE_ENTRIES
        ):
            self._decisions.clear()
            self._decided_version = table.version
        key = (user.username, tuple(wants), ip)
        if self._decisions.get(key):
            return None
        refused = decide(user, table.acls.get(subject_of(user.username), []), wants, ip)
        if refused is None:
            self._decisions[key] = True
        return refused

    def _stored_topics(self, positions: Sequence[int]) -> list[tuple[Resource, str]]:
        """``Sub`` on the topic of each stored message (an unreadable one is left out: the
        servicer refuses the whole call for it before anything changes)."""
        assert self.topic_at is not None
        wants = []
        for position in positions:
            try:
                wants.append(rpcmap.topic(self.topic_at(position), SUB))
            except BrokerError:
                continue
        return list(dict.fromkeys(wants))


def owner_of(
    guard: AuthGuard | None, context: grpc.aio.ServicerContext, request: object = None
) -> tuple[str, bool]:
    """The user ``guard`` admitted the call of ``context`` (carrying ``request``) for, and
    whether it is a Super user (("", False) without users: nobody to hold to a quota)."""
    if guard is None or not guard.settings.active:
        return "", False
    return guard.identify(text_metadata(context.invocation_metadata()), request)
