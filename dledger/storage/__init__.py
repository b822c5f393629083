"""The DLedger log store: segmented, memory-mapped, CRC-checked, crash-recovering.

See docs/STORAGE.md (guarantees, layout) and docs/FORMAT.md (every byte).
"""

from dledger.storage.retention import SegmentInfo, parse_delete_when, segments_to_delete
from dledger.storage.store import (
    FlushDiskType,
    SegmentedLogStore,
    StoreClosedError,
    StoreConfig,
    StoreLockedError,
)

__all__ = [
    "FlushDiskType",
    "SegmentInfo",
    "SegmentedLogStore",
    "StoreClosedError",
    "StoreConfig",
    "StoreLockedError",
    "parse_delete_when",
    "segments_to_delete",
]
