"""RocketMQ 5's request signature, as its official clients send it on every gRPC call.

A signed call carries two metadata entries:

- ``x-mq-date-time``: the client's clock, ``YYYYMMDDTHHMMSSZ`` (e.g. ``20261124T201500Z``);
- ``authorization``: ``MQv2-HMAC-SHA1 Credential=<AccessKey>, SignedHeaders=x-mq-date-time,
  Signature=<hex HMAC-SHA1(key=SecretKey, message=the x-mq-date-time value)>``.

The Credential value may carry more after a ``/`` (an older client form ``ak/region/...``);
the AccessKey is what comes before the first ``/``.

What the scheme proves and what it does not (docs/SECURITY.md says it to users): the caller
knew the SecretKey within ``max_skew_ms`` of now. It does not bind the request's body, so a
captured header can be replayed within that window: it must travel over TLS. Servers compare
in constant time and never say which part of a bad signature was wrong.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from dataclasses import dataclass
from datetime import UTC, datetime

from mqsecurity.credentials import MAX_ACCESS_KEY_CHARS, Credentials
from mqsecurity.errors import SignatureError, SignatureMismatchError

ALGORITHM = "MQv2-HMAC-SHA1"
DATE_TIME_HEADER = "x-mq-date-time"
AUTHORIZATION_HEADER = "authorization"
DATE_TIME_FORMAT = "%Y%m%dT%H%M%SZ"
# RocketMQ's clients sign with their wall clock; 15 minutes is the usual tolerance of signed
# request schemes (AWS SigV4 uses the same) and absorbs unsynchronised laptops.
DEFAULT_MAX_SKEW_MS = 15 * 60 * 1000
# An honest header is about 120 bytes; a bound keeps parsing cheap on hostile input.
MAX_AUTHORIZATION_CHARS = 512
_HEX_SHA1_CHARS = 40
_AUTHORIZATION = re.compile(
    r"MQv2-HMAC-SHA1 Credential=(?P<credential>[^,\s]+), ?"
    r"SignedHeaders=(?P<signed>[^,\s]+), ?Signature=(?P<signature>[0-9A-Fa-f]+)"
)


def signature(secret_key: str, date_time: str) -> str:
    """Lower-case hex HMAC-SHA1 of ``date_time`` under ``secret_key``."""
    return hmac.new(secret_key.encode(), date_time.encode(), hashlib.sha1).hexdigest()


def format_date_time(now: datetime | None = None) -> str:
    """``now`` (default: the current UTC time) in the signed header's format."""
    return (now or datetime.now(UTC)).astimezone(UTC).strftime(DATE_TIME_FORMAT)


def signed_metadata(
    credentials: Credentials, now: datetime | None = None
) -> tuple[tuple[str, str], ...]:
    """The two metadata entries that sign one call."""
    date_time = format_date_time(now)
    sig = signature(credentials.secret_key, date_time)
    header = (
        f"{ALGORITHM} Credential={credentials.access_key}, "
        f"SignedHeaders={DATE_TIME_HEADER}, Signature={sig}"
    )
    return ((DATE_TIME_HEADER, date_time), (AUTHORIZATION_HEADER, header))


@dataclass(frozen=True)
class SignedRequest:
    """What a server read from a call's metadata, before it knows the secret."""

    access_key: str
    date_time: str
    signature: str


def read_signed_request(metadata: dict[str, str]) -> SignedRequest | None:
    """The signature a call carries: None when it carries no ``authorization`` at all (an
    anonymous call), `SignatureError` when what it carries is malformed."""
    header = metadata.get(AUTHORIZATION_HEADER)
    if header is None:
        return None
    if len(header) > MAX_AUTHORIZATION_CHARS:
        raise SignatureError(f"authorization header over {MAX_AUTHORIZATION_CHARS} characters")
    match = _AUTHORIZATION.fullmatch(header.strip())
    if match is None:
        raise SignatureError(
            f"authorization header is not {ALGORITHM} Credential=.., SignedHeaders=.., Signature=.."
        )
    if DATE_TIME_HEADER not in match["signed"].lower().split(";"):
        raise SignatureError(f"SignedHeaders must include {DATE_TIME_HEADER}")
    access_key = match["credential"].split("/", 1)[0]
    if not 0 < len(access_key) <= MAX_ACCESS_KEY_CHARS:
        raise SignatureError(
            f"Credential must name an access key of 1..{MAX_ACCESS_KEY_CHARS} characters"
        )
    if len(match["signature"]) != _HEX_SHA1_CHARS:
        raise SignatureError("Signature must be 40 hex digits (HMAC-SHA1)")
    date_time = metadata.get(DATE_TIME_HEADER)
    if date_time is None:
        raise SignatureError(f"signed call without the {DATE_TIME_HEADER} header")
    return SignedRequest(access_key, date_time[:32], match["signature"].lower())


def check_signature(
    request: SignedRequest,
    secret_key: str,
    now: datetime | None = None,
    max_skew_ms: int = DEFAULT_MAX_SKEW_MS,
) -> None:
    """Raise `SignatureError` unless ``request`` was signed with ``secret_key`` at a time within
    ``max_skew_ms`` of ``now``. The comparison takes constant time."""
    try:
        signed_at = datetime.strptime(request.date_time, DATE_TIME_FORMAT).replace(tzinfo=UTC)
    except ValueError:
        raise SignatureError(f"{DATE_TIME_HEADER} is not {DATE_TIME_FORMAT}") from None
    skew_ms = abs(((now or datetime.now(UTC)) - signed_at).total_seconds()) * 1000
    expected = signature(secret_key, request.date_time)
    if not hmac.compare_digest(expected, request.signature):
        raise SignatureMismatchError("signature does not match the access key's secret")
    if skew_ms > max_skew_ms:
        raise SignatureError(
            f"{DATE_TIME_HEADER} is {skew_ms / 1000:.0f} s away from the server's clock "
            f"(at most {max_skew_ms // 1000} s allowed)"
        )
