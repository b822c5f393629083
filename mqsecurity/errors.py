"""The one exception root of `mqsecurity`."""

from __future__ import annotations


class SecurityError(Exception):
    """Root of every error this package raises."""


class SignatureError(SecurityError):
    """A request signature is missing, malformed, too old or wrong. The message is safe to
    return to the caller: it never contains a secret or the expected signature."""


class SignatureMismatchError(SignatureError):
    """A well-formed signature that the access key's secret did not produce. A server answers
    it exactly as it answers an unknown access key, so callers cannot probe which users exist."""


class CertificateError(SecurityError):
    """A certificate, key or CA file is missing, unreadable or does not carry what it must."""
