"""What a pull costs the broker per message (docs/PERFORMANCE.md, "The read path (issue 36)"):
a real commitlog store of N messages applied into a broker state machine, then every queue
read from offset 0 to its end by the pull path, ``--batch`` messages a pull, each answer
encoded to the bytes the v1 front end sends (``PullMessageResponse``). CPU per message pulled
(``time.process_time``, so other processes' load does not count), the best of ``--rounds``.

Messages are sent as a loaded producer's batches are (``--fill-batch`` messages of one queue
per log entry, queues in turn); ``--interleave`` instead gives every message the next queue
(no two messages of a queue side by side in the commitlog: the read path's worst case).

``python -m bench.pullcost --messages 200000 --size 128``
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from broker.components.applied import AppliedMessages, NodeContext
from broker.components.pulling import PullPath, PullQuery, PullStatus
from broker.components.settings import ServiceConfig
from broker.frontends.v1.pullwire import encode_pull_response
from broker.state.machine import BrokerStateMachine
from broker.state.message import Message, UniqIdGenerator, encode_batch
from broker.state.records import ENTRY_MESSAGES
from dledger.core import Role
from dledger.storage.store import FlushDiskType, SegmentedLogStore, StoreConfig

QUEUES = 8
TOPIC = "Bench"


class _Node:
    """The parts of a RaftNode the pull path reads: the store, the role, a damage report."""

    def __init__(self, store: SegmentedLogStore) -> None:
        self.store = store
        self.role = Role.FOLLOWER
        self.self_id = "n0"

    def suspect_damage(self, position: int, found_by: str = "read") -> None:
        raise AssertionError(f"the bench's log is not damaged (position {position})")


def build(root: Path, a: argparse.Namespace) -> tuple[SegmentedLogStore, BrokerStateMachine]:
    store = SegmentedLogStore(
        root / "dledger",
        StoreConfig(flush_disk_type=FlushDiskType.ASYNC_FLUSH, preallocate=False),
    )
    sm = BrokerStateMachine(root / "broker", hash_slots=1_000_000, max_index_records=4_000_000)
    sm.attach(store)
    sm.applied_index()
    ids = UniqIdGenerator(ip="10.0.0.1")
    body = b"x" * a.size
    for start in range(0, a.messages, a.fill_batch):
        batch = [
            Message(
                topic=TOPIC,
                queue_id=i % QUEUES if a.interleave else (start // a.fill_batch) % QUEUES,
                body=body,
                tags=f"Tag{i % 3}",
                store_timestamp_ms=1_700_000_000_000 + i,
                uniq_id=ids.next_id(),
            )
            for i in range(start, min(start + a.fill_batch, a.messages))
        ]
        index = store.append_bodies(1, [encode_batch(batch)[0]], ENTRY_MESSAGES)
        sm.apply([store.read(index)])
    store.flush()
    return store, sm


def read_all(puller: PullPath, batch: int, subscription: str) -> tuple[int, int, float]:
    """Every queue from 0 to its end: (messages, answer bytes, CPU seconds)."""
    hashes = None
    if subscription:
        from broker.components.pulling import parse_subscription
        from broker.state.message import tags_hash

        tags = parse_subscription(subscription)
        assert tags is not None
        hashes = frozenset(tags_hash(t) for t in tags)
    messages = answer_bytes = 0
    cpu0 = time.process_time()
    for q in range(QUEUES):
        offset = 0
        while True:
            r = puller.pull_once(PullQuery(TOPIC, q, offset, max_msgs=batch), hashes)
            if r.status is not PullStatus.FOUND:
                break
            answer_bytes += len(encode_pull_response(r, "n0", "0A00000100002A9F"))
            messages += len(r.queue_offsets)
            offset = r.next_begin_offset
    return messages, answer_bytes, time.process_time() - cpu0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--messages", type=int, default=200_000)
    p.add_argument("--size", type=int, default=128, help="message body bytes")
    p.add_argument("--batch", type=int, default=1024, help="messages a pull (bench.backlog's)")
    p.add_argument("--fill-batch", type=int, default=256)
    p.add_argument("--interleave", action="store_true")
    p.add_argument("--subscription", default="", help='e.g. "Tag0" (default: every message)')
    p.add_argument("--rounds", type=int, default=3)
    a = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="pullcost-") as tmp:
        store, sm = build(Path(tmp), a)
        ctx = NodeContext(_Node(store), sm, ServiceConfig("127.0.0.1", 10911))  # type: ignore[arg-type]
        puller = PullPath(_Topics(), AppliedMessages(ctx), memory_bytes=1 << 33)  # type: ignore[arg-type]
        best = None
        for _ in range(a.rounds):
            got = read_all(puller, a.batch, a.subscription)
            best = got if best is None or got[2] < best[2] else best
        assert best is not None
        messages, answer_bytes, cpu_s = best
        print(
            f"{messages} messages of {a.size} B body ({answer_bytes / messages:.0f} answer bytes"
            f" each), {a.batch} a pull{', interleaved' if a.interleave else ''}"
            f"{', subscription ' + a.subscription if a.subscription else ''}:"
            f" {cpu_s / messages * 1e6:.2f} us CPU per message,"
            f" {messages / cpu_s:,.0f} messages and {answer_bytes / cpu_s / 1e6:.0f} MB"
            " of answer per CPU second"
        )
        sm.close()
        store.close()


class _Topics:
    """The pull path's topic check is not what is measured: pull_once skips it."""


if __name__ == "__main__":
    main()
