"""The root of ``spark_audit``'s exceptions: every error the audit raises on purpose."""

from __future__ import annotations


class AuditError(Exception):
    """The audit cannot go on (bad input, a file system failure, a failed Spark job)."""
