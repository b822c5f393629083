"""User secrets sealed at rest: AES-256-GCM under the group's key (``aclEncryptionKeyPath``).

A RocketMQ signature is an HMAC of the request time keyed by the SecretKey, so a server checking
it needs the secret itself: a one-way hash of it would be useless. The secret is therefore kept
encrypted in every log entry and snapshot (a copied store file or backup gives nothing without
the key file) and decrypted only in memory, on the node checking a signature.

The key file holds 32 random bytes as 64 hex digits (whitespace around them is ignored), is
readable by its owner only (mode 0600, like an ssh key), and is the same on every member of a
group: the leader seals, every member unseals. :func:`generate_key_file` writes one.

A sealed secret is ``base64(nonce || ciphertext || tag)`` with a fresh 96-bit nonce; the
username is the associated data, so a sealed secret copied onto another user does not open.
"""

from __future__ import annotations

import base64
import binascii
import os

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from broker.state.errors import ConfigError, InvalidRequestError
from mqsecurity import SecurityError
from mqsecurity.credentials import read_private_file, write_private_file

KEY_BYTES = 32  # AES-256
NONCE_BYTES = 12  # GCM's standard nonce
TAG_BYTES = 16
# A secret is at most mqsecurity.credentials.MAX_SECRET_KEY_CHARS (256) characters: sealed and
# base64-encoded that is (12 + 256 + 16) * 4 / 3 = 380 characters; bound with room.
MAX_SEALED_CHARS = 512
# The key file is 64 hex digits and a newline; anything much larger is not one.
MAX_KEY_FILE_BYTES = 1024
_AAD_PREFIX = b"raftmq-user-secret\x00"


class SecretBox:
    """Seals and unseals user secrets under one key."""

    def __init__(self, key: bytes) -> None:
        if len(key) != KEY_BYTES:
            raise ConfigError(f"the ACL encryption key must be {KEY_BYTES} bytes")
        self._aead = AESGCM(key)

    def seal(self, username: str, secret: str) -> str:
        nonce = os.urandom(NONCE_BYTES)
        sealed = self._aead.encrypt(nonce, secret.encode(), _AAD_PREFIX + username.encode())
        return base64.b64encode(nonce + sealed).decode("ascii")

    def unseal(self, username: str, sealed: str) -> str:
        """The secret; `InvalidRequestError` when it was sealed under another key or user."""
        try:
            raw = base64.b64decode(sealed, validate=True)
            plain = self._aead.decrypt(
                raw[:NONCE_BYTES], raw[NONCE_BYTES:], _AAD_PREFIX + username.encode()
            )
        except (binascii.Error, ValueError, InvalidTag):
            raise InvalidRequestError(
                f"the secret of user {username!r} does not open with this node's "
                "aclEncryptionKeyPath key (a different key than the leader's?)"
            ) from None
        return plain.decode("utf-8", "replace")


def check_sealed(sealed: object) -> str:
    """The shape of a sealed secret (checked on apply, where the key is not needed)."""
    if not isinstance(sealed, str) or not 0 < len(sealed) <= MAX_SEALED_CHARS:
        raise InvalidRequestError(f"a sealed secret must be 1..{MAX_SEALED_CHARS} characters")
    try:
        raw = base64.b64decode(sealed, validate=True)
    except binascii.Error:
        raise InvalidRequestError("a sealed secret must be base64") from None
    if len(raw) <= NONCE_BYTES + TAG_BYTES:
        raise InvalidRequestError("a sealed secret is too short to hold a secret")
    return sealed


def load_key_file(path: str) -> SecretBox:
    """The key of ``path``; `ConfigError` with one clear line when it is missing, readable by
    group or others, or not 64 hex digits."""
    try:
        data = read_private_file(path, MAX_KEY_FILE_BYTES, "aclEncryptionKeyPath")
    except SecurityError as exc:
        raise ConfigError(str(exc)) from None
    try:
        key = bytes.fromhex(data.decode("ascii").strip())
    except (UnicodeDecodeError, ValueError):
        key = b""
    if len(key) != KEY_BYTES:
        raise ConfigError(
            f"aclEncryptionKeyPath {path} must hold {KEY_BYTES} bytes as {2 * KEY_BYTES} hex digits"
        )
    return SecretBox(key)


def generate_key_file(path: str) -> None:
    """Write a new random key to ``path`` (mode 0600), replacing any file there."""
    write_private_file(path, os.urandom(KEY_BYTES).hex().encode() + b"\n")
