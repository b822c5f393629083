"""What the derived-state checks cost (docs/BROKER.md, "Derived state"): a real commitlog store
of N messages (1 KiB bodies, one key each, 8 queues) applied into a broker state machine, then

- the open-time check (every ConsumeQueue and key index record), timed;
- one scrubber pass without a rate (CPU per record, ConsumeQueue and key index apart);
- the scrubber at a rate for ``--seconds``: the process's CPU share and the bytes it read.

``python -m bench.scrubcost --messages 100000 --rate 2000 --seconds 30``
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import tempfile
import time
from pathlib import Path

from broker.components.scrubber import Scrubber
from broker.state import derived
from broker.state.machine import BrokerStateMachine
from broker.state.message import Message, UniqIdGenerator, encode_batch
from broker.state.records import ENTRY_MESSAGES
from dledger.storage.store import FlushDiskType, SegmentedLogStore, StoreConfig

BATCH = 100  # messages per entry, as a loaded producer's batches
QUEUES = 8


class CountingLog:
    """The store, counting the bytes the checks read from it."""

    def __init__(self, store: SegmentedLogStore) -> None:
        self.store = store
        self.bytes_read = 0

    def body_position(self, index: int) -> int:
        return self.store.body_position(index)

    def first_index(self) -> int:
        return self.store.first_index()

    def last_index(self) -> int:
        return self.store.last_index()

    def read(self, index: int):  # type: ignore[no-untyped-def]
        entry = self.store.read(index)
        self.bytes_read += len(entry.body)
        return entry

    def read_at(self, position: int, size: int) -> bytes:
        self.bytes_read += size
        return self.store.read_at(position, size)


def build(root: Path, messages: int) -> tuple[BrokerStateMachine, CountingLog]:
    store = SegmentedLogStore(
        root / "dledger",
        StoreConfig(flush_disk_type=FlushDiskType.ASYNC_FLUSH, preallocate=False),
    )
    log = CountingLog(store)
    sm = BrokerStateMachine(root / "broker", hash_slots=1_000_000, max_index_records=4_000_000)
    sm.attach(log)
    sm.applied_index()
    ids = UniqIdGenerator(ip="10.0.0.1")
    body = b"x" * 1024
    for start in range(0, messages, BATCH):
        batch = [
            Message(
                topic="Bench",
                queue_id=i % QUEUES,
                body=body,
                tags=f"Tag{i % 3}",
                keys=(f"key-{i}",),
                store_timestamp_ms=1_700_000_000_000 + i,
                uniq_id=ids.next_id(),
            )
            for i in range(start, min(start + BATCH, messages))
        ]
        index = store.append_bodies(1, [encode_batch(batch)[0]], ENTRY_MESSAGES)
        sm.apply([store.read(index)])
    store.flush()
    return sm, log


def cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--rate", type=int, default=derived.DEFAULT_SCRUB_RECORDS_PER_SECOND)
    parser.add_argument("--seconds", type=float, default=30.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="scrubcost-") as tmp:
        sm, log = build(Path(tmp), args.messages)
        cq = sm.derived.checked
        started, cpu0 = time.perf_counter(), cpu_s()
        assert derived.check_all_queues(sm) == ""
        print(
            f"open-time check: {cq['consumequeue']} queue + {cq['index']} index records in"
            f" {time.perf_counter() - started:.2f} s wall, {cpu_s() - cpu0:.2f} s CPU"
        )
        for store in ("consumequeue", "index"):
            before, cpu0, read0 = cq[store], cpu_s(), log.bytes_read
            if store == "consumequeue":
                for topic, queue_id in sm.cqs.queue_ids():
                    q = sm.cqs.find(topic, queue_id)
                    assert q is not None
                    derived.check_queue(sm, q, topic, queue_id, 0, q.max_offset, "bench")
            else:
                derived.check_index(sm, "bench", None)
            n = cq[store] - before
            print(
                f"unthrottled {store}: {n} records, {(cpu_s() - cpu0) / n * 1e6:.1f} µs CPU and"
                f" {(log.bytes_read - read0) / n:.0f} bytes read per record"
            )
        io0 = _read_bytes()
        read0, cpu0, wall0 = log.bytes_read, cpu_s(), time.perf_counter()
        scrubber = Scrubber(sm, args.rate)

        async def run() -> None:
            task = asyncio.get_running_loop().create_task(scrubber.run())
            await asyncio.sleep(args.seconds)
            task.cancel()

        asyncio.run(run())
        wall = time.perf_counter() - wall0
        print(
            f"scrubber at {args.rate} records/s for {wall:.0f} s: {(cpu_s() - cpu0) / wall:.2%}"
            f" of a core, {(log.bytes_read - read0) / wall / 1024:.0f} KiB/s read from the"
            f" commitlog (page cache), {(_read_bytes() - io0) / wall / 1024:.0f} KiB/s from disk;"
            f" a full pass of {args.messages} messages takes"
            f" {(args.messages * 3) / args.rate:.0f} s"
        )
        sm.close()
        log.store.close()


def _read_bytes() -> int:
    """Bytes this process made the disk read (/proc/self/io; 0 where unknown)."""
    try:
        for line in Path(f"/proc/{os.getpid()}/io").read_text().splitlines():
            if line.startswith("read_bytes:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


if __name__ == "__main__":
    main()
