"""What the replicated-state checks cost (docs/BROKER.md, "Derived state"): a real commitlog
store with 8,000 messages in 8 queues and ``--halves`` pending transaction halves (one prepare
entry each), and POP state with ``--inflight`` in-flight records (25 groups x 8 queues, up to
10,000 a queue) pointing at the queues' records, as a loaded snapshot holds them; then

- the open-time check of every row (``broker.state.statecheck.check_at_open``), timed;
- the CPU per row, POP records and halves apart.

``python -m bench.statecheckcost --inflight 200000 --halves 100000`` (the tables' limits)
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from bench.scrubcost import build, cpu_s
from broker.state import statecheck
from broker.state.derived import STORE_POP, STORE_TXN
from broker.state.message import Message, UniqIdGenerator, encode_batch
from broker.state.popstate import InFlight, QueuePop
from broker.state.records import ENTRY_TXN
from broker.state.transactions import HALF_TOPIC, encode_prepare

GROUPS = 25
QUEUES = 8
CHUNK = 1000  # entries appended and applied at once


def add_halves(sm, log, halves: int) -> None:  # type: ignore[no-untyped-def]
    ids = UniqIdGenerator(ip="10.0.0.2")
    store = log.store
    for start in range(0, halves, CHUNK):
        bodies = []
        for i in range(start, min(start + CHUNK, halves)):
            half = Message(
                topic=HALF_TOPIC,
                queue_id=0,
                body=b"h" * 100,
                store_timestamp_ms=1_700_000_000_000 + i,
                uniq_id=ids.next_id(),
            )
            bodies.append(encode_prepare("Bench", i % QUEUES, encode_batch([half])[0]))
        last = store.append_bodies(1, bodies, ENTRY_TXN)
        sm.apply([store.read(n) for n in range(last - len(bodies) + 1, last + 1)])


def add_inflight(sm, inflight: int) -> None:  # type: ignore[no-untyped-def]
    per_queue = -(-inflight // (GROUPS * QUEUES))
    left = inflight
    for g in range(GROUPS):
        for q in range(QUEUES):
            cq = sm.cqs.find("Bench", q)
            n = min(per_queue, left, cq.max_offset)
            rows = cq.read(0, n)
            state = QueuePop(n)
            for offset, (position, _size, _tag) in enumerate(rows):
                state.inflight[offset] = InFlight(position, 1, 1, 1)
            sm.pop.queues[(f"G{g}", "Bench", q)] = state
            sm.pop.inflight_total += n
            left -= n


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--inflight", type=int, default=200_000)
    parser.add_argument("--halves", type=int, default=100_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="statecheckcost-") as tmp:
        sm, log = build(Path(tmp), 8000)
        add_halves(sm, log, args.halves)
        add_inflight(sm, args.inflight)
        checked = sm.derived.checked
        started, cpu0, read0 = time.perf_counter(), cpu_s(), log.bytes_read
        assert statecheck.check_at_open(sm) == ""
        wall, cpu = time.perf_counter() - started, cpu_s() - cpu0
        print(
            f"open-time check: {checked['pop']} POP rows + {checked['transaction']} halves +"
            f" {checked['level']} levels in {wall:.2f} s wall, {cpu:.2f} s CPU,"
            f" {log.bytes_read - read0} bytes read"
        )
        rows = statecheck.rows_of(sm)
        for kind in (STORE_POP, STORE_TXN):
            part = [r for r in rows if r[0] == kind]
            cpu0 = cpu_s()
            statecheck.check_rows(sm, part, "bench")
            print(f"{kind}: {(cpu_s() - cpu0) / max(1, len(part)) * 1e6:.1f} µs CPU a row")
        sm.close()
        log.store.close()


if __name__ == "__main__":
    main()
