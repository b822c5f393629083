"""An AccessKey / SecretKey pair (RocketMQ's ACL credentials) and the JSON file holding one.

The file has RocketMQ 5.3's shape for ``innerClientAuthenticationCredentials``:
``{"accessKey": "...", "secretKey": "..."}``. It must not be readable by group or others
(mode 0600 or stricter), like an ssh key: a looser file is refused with the reason.
"""

from __future__ import annotations

import json
import os
import stat
from dataclasses import dataclass, field

from mqsecurity.errors import SecurityError

# RocketMQ 5.3 limits a username to 64 characters (letters, digits, '_', '-'); a secret is
# bounded so a hostile header or file cannot make the server hash megabytes.
MAX_ACCESS_KEY_CHARS = 64
MAX_SECRET_KEY_CHARS = 256
MIN_SECRET_KEY_CHARS = 8
# A credentials file is a few dozen bytes; anything larger is not one.
MAX_CREDENTIALS_FILE_BYTES = 4096
_ACCESS_KEY_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-")


def check_access_key(access_key: str) -> str:
    """``access_key`` if it is a valid AccessKey (user name), else `SecurityError`."""
    if not 0 < len(access_key) <= MAX_ACCESS_KEY_CHARS:
        raise SecurityError(f"access key must be 1..{MAX_ACCESS_KEY_CHARS} characters")
    if not set(access_key) <= _ACCESS_KEY_CHARS:
        raise SecurityError("access key may hold only letters, digits, '_' and '-'")
    return access_key


def check_secret_key(secret_key: str) -> str:
    """``secret_key`` if its length is within bounds, else `SecurityError` (never echoing it)."""
    if not MIN_SECRET_KEY_CHARS <= len(secret_key) <= MAX_SECRET_KEY_CHARS:
        raise SecurityError(
            f"secret key must be {MIN_SECRET_KEY_CHARS}..{MAX_SECRET_KEY_CHARS} characters"
        )
    if not secret_key.isprintable():
        raise SecurityError("secret key must be printable characters")
    return secret_key


@dataclass(frozen=True)
class Credentials:
    """Who a client says it is. ``secret_key`` never appears in ``repr`` or logs."""

    access_key: str
    secret_key: str = field(repr=False)

    def __post_init__(self) -> None:
        check_access_key(self.access_key)
        check_secret_key(self.secret_key)

    def to_json(self) -> str:
        return json.dumps({"accessKey": self.access_key, "secretKey": self.secret_key})


def parse_credentials(text: str) -> Credentials:
    """Credentials from RocketMQ's JSON shape; `SecurityError` saying what is wrong."""
    try:
        doc = json.loads(text)
    except ValueError:
        raise SecurityError("credentials are not JSON") from None
    if not isinstance(doc, dict):
        raise SecurityError('credentials must be a JSON object {"accessKey": .., "secretKey": ..}')
    access_key, secret_key = doc.get("accessKey"), doc.get("secretKey")
    if not isinstance(access_key, str) or not isinstance(secret_key, str):
        raise SecurityError("credentials need string fields accessKey and secretKey")
    return Credentials(access_key, secret_key)


def read_private_file(path: str, max_bytes: int, what: str) -> bytes:
    """The bytes of a small secret file (``what`` names it in errors), refusing one that group
    or others may access, one that is a symlink, and one over ``max_bytes``."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError as exc:
        raise SecurityError(f"cannot open {what} {path}: {exc.strerror}") from None
    try:
        mode = os.fstat(fd).st_mode
        if mode & (stat.S_IRWXG | stat.S_IRWXO):
            raise SecurityError(
                f"{what} {path} is accessible by group or others "
                f"(mode {stat.S_IMODE(mode):o}); chmod 600 it"
            )
        data = os.read(fd, max_bytes + 1)
    finally:
        os.close(fd)
    if len(data) > max_bytes:
        raise SecurityError(f"{what} {path} is over {max_bytes} bytes")
    return data


def load_credentials(path: str) -> Credentials:
    """Read a credentials file, refusing one that group or others may read."""
    data = read_private_file(path, MAX_CREDENTIALS_FILE_BYTES, "credentials file")
    return parse_credentials(data.decode("utf-8", "replace"))


def write_private_file(path: str, data: bytes) -> None:
    """Write ``data`` to a new file readable only by its owner (0600), replacing atomically."""
    tmp = f"{path}.tmp{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)


def save_credentials(path: str, credentials: Credentials) -> None:
    """Write ``credentials`` to ``path`` with mode 0600."""
    write_private_file(path, credentials.to_json().encode())
