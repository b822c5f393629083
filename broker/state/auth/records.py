"""The replicated user and ACL records (entry type ``ENTRY_AUTH``, docs/FORMAT.md).

A record is ``u8 version (1) | u8 op | UTF-8 JSON object``, at most :data:`MAX_RECORD_BYTES`.
The leader encodes one per admin write; every member decodes and validates it on apply
(:meth:`broker.state.auth.table.AuthTable.apply`) and skips a record that breaks any rule, the same
way on every member: decoding uses nothing but the bytes, and validation nothing but the bytes
and the replicated table. Secrets travel only sealed (:mod:`broker.state.auth.secrets`).

Ops and their JSON fields:

- ``USER_INIT`` ``{username, secret, type, status}``: create this user only if the table has
  no user at all (``initAuthenticationUser``; a second leader's proposal changes nothing);
- ``USER_CREATE`` (the same fields; the user must not exist), ``USER_UPDATE`` (``username`` and
  any of ``secret``, ``type``, ``status``; the user must exist), ``USER_DELETE``
  ``{username}`` (its rules go with it);
- ``ACL_CREATE`` / ``ACL_UPDATE`` ``{subject, rules: [{resource, actions, decision,
  sourceIps}]}``: add rules for resources the subject has none for / replace the subject's
  rules for those resources; ``ACL_DELETE`` ``{subject, resources}``: drop the subject's rules
  for those resources (all of them when the list is empty).
"""

from __future__ import annotations

import json
import struct
from collections.abc import Mapping
from typing import Any

from broker.state.errors import InvalidRequestError

RECORD_VERSION = 1
USER_INIT = 1
USER_CREATE = 2
USER_UPDATE = 3
USER_DELETE = 4
ACL_CREATE = 5
ACL_UPDATE = 6
ACL_DELETE = 7
OPS = frozenset(range(USER_INIT, ACL_DELETE + 1))
# One record is one admin command: a user (under 1 KB) or one subject's rules for the resources
# of one createAcl (MAX_RULES_PER_SUBJECT rules of ~600 bytes at most): 64 KiB holds either.
MAX_RECORD_BYTES = 64 * 1024
_HEAD = struct.Struct(">BB")


def encode_auth_record(op: int, doc: Mapping[str, Any]) -> bytes:
    body = _HEAD.pack(RECORD_VERSION, op) + json.dumps(doc, separators=(",", ":")).encode()
    if len(body) > MAX_RECORD_BYTES:
        raise InvalidRequestError(f"the record is over {MAX_RECORD_BYTES} bytes")
    return body


def decode_auth_record(body: bytes) -> tuple[int, dict[str, Any]]:
    """(op, fields); `InvalidRequestError` for any bytes that are not a record."""
    if not _HEAD.size < len(body) <= MAX_RECORD_BYTES:
        raise InvalidRequestError(f"auth record of {len(body)} bytes")
    version, op = _HEAD.unpack_from(body)
    if version != RECORD_VERSION or op not in OPS:
        raise InvalidRequestError(f"auth record version {version} op {op}")
    try:
        doc = json.loads(body[_HEAD.size :].decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        # RecursionError: deeply nested JSON ("[[[[..."); it is a bad record like any other.
        raise InvalidRequestError("auth record is not UTF-8 JSON") from None
    if not isinstance(doc, dict):
        raise InvalidRequestError("auth record is not a JSON object")
    return op, doc
