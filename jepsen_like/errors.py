"""The root of ``jepsen_like``'s exceptions: every error the harness raises on purpose."""

from __future__ import annotations


class JepsenError(Exception):
    """A harness step that cannot be done (network namespaces, disk faults, ...)."""
