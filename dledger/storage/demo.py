"""Demo of the log store: append, close, reopen, read back, verify (``make demo``).

Usage: ``python -m dledger.storage.demo [DIR]`` (a temp dir, removed afterwards, by default).
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import time
from pathlib import Path

from dledger.log import Entry, EntryType, HardState
from dledger.storage.store import SegmentedLogStore, StoreConfig

ENTRIES = 1000
# Small segments so that the demo shows several files and the blank records between them.
DEMO_CONFIG = StoreConfig(segment_size_bytes=256 * 1024, index_segment_size_bytes=64 * 1024)


def body_of(index: int) -> bytes:
    return f"entry {index} ".encode() * (1 + index % 40)


def run(root: Path) -> int:
    t0 = time.perf_counter()
    store = SegmentedLogStore(root, DEMO_CONFIG)
    start = store.last_index() + 1
    term = max(1, store.last_term())
    batch = [Entry(term, i, body_of(i), EntryType.NORMAL) for i in range(start, start + ENTRIES)]
    store.append(batch)
    durable = store.flush()
    store.save_hard_state(HardState(term=term, voted_for="n0"))
    store.close()

    store = SegmentedLogStore(root, DEMO_CONFIG)
    try:
        ok = store.last_index() == start + ENTRIES - 1 and durable == store.last_index()
        ok = ok and all(store.read(e.index) == e for e in batch)
        ok = ok and store.load_hard_state() == HardState(term=term, voted_for="n0")
        checked = store.verify()
        segments = store.segment_count
        data_bytes = store.write_position
    finally:
        store.close()
    elapsed_ms = (time.perf_counter() - t0) * 1000
    print(
        f"store demo: {'OK' if ok else 'FAILED'} root={root} appended={ENTRIES} "
        f"entries={checked} verified, body_bytes={sum(len(e.body) for e in batch)} "
        f"log_bytes={data_bytes} segments={segments} elapsed_ms={elapsed_ms:.0f}"
    )
    return 0 if ok else 1


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args and args[0] in ("-h", "--help"):
        print(__doc__.strip())
        return 0
    if len(args) > 1:
        print("usage: python -m dledger.storage.demo [DIR]", file=sys.stderr)
        return 2
    if args:
        return run(Path(args[0]))
    tmp = Path(tempfile.mkdtemp(prefix="raftmq-store-demo-"))
    try:
        return run(tmp / "dledger-n0")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
