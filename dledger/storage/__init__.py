"""The DLedger log store: segmented, memory-mapped, CRC-checked, crash-recovering.

See docs/STORAGE.md (guarantees, layout) and docs/FORMAT.md (every byte).
"""

from dledger.storage.files import is_disk_full
from dledger.storage.retention import SegmentInfo, parse_delete_when, segments_to_delete
from dledger.storage.store import (
    DiskFullError,
    FlushDiskType,
    SegmentedLogStore,
    StoreClosedError,
    StoreConfig,
    StoreLockedError,
)

__all__ = [
    "DiskFullError",
    "FlushDiskType",
    "SegmentInfo",
    "SegmentedLogStore",
    "StoreClosedError",
    "StoreConfig",
    "StoreLockedError",
    "is_disk_full",
    "parse_delete_when",
    "segments_to_delete",
]
