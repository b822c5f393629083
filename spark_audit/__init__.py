"""spark_audit: cross-replica audit of raftmq's DLedger log stores on PySpark.

Every replica's segments are scanned in parallel (Spark local mode by default, any Spark
master on request), every entry's checksums and index record are checked, and the replicas
are compared index by index up to the audited commit index. See docs/AUDIT.md.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from spark_audit.model import Finding, GroupPlan, ReplicaPlan, Severity, TaskSpec, What

__all__ = ["Finding", "GroupPlan", "ReplicaPlan", "Severity", "TaskSpec", "What"]


def __getattr__(name: str) -> Any:
    """The model's names, imported when first asked for: the model needs numpy (the [audit]
    extra), and ``mqaudit``'s console script (spark_audit.launch) must import this package
    without it to say what is missing."""
    if name in __all__:
        from spark_audit import model

        return getattr(model, name)
    raise AttributeError(f"module 'spark_audit' has no attribute {name!r}")
