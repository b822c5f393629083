"""spark_audit: cross-replica audit of raftmq's DLedger log stores on PySpark.

Every replica's segments are scanned in parallel (Spark local mode by default, any Spark
master on request), every entry's checksums and index record are checked, and the replicas
are compared index by index up to the audited commit index. See docs/AUDIT.md.
"""

from spark_audit.model import Finding, GroupPlan, ReplicaPlan, Severity, TaskSpec, What

__all__ = ["Finding", "GroupPlan", "ReplicaPlan", "Severity", "TaskSpec", "What"]
