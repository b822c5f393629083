"""A pull reads messages side by side in the commitlog as one run (broker.components.pulling):
differential tests against the read of one message at a time it replaced, on random queues
(topics interleaved, tag filters, retention gaps, damaged messages and wrong records), which
must give the same answer, the same refusal and the same damage reports."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
from broker_world import MemoryLog, world

from broker.components.applied import MAX_ANSWER_BYTES
from broker.components.pulling import (
    DEFAULT_PULL_MAX_MSGS,
    MAX_PULL_MSGS,
    PULL_MAX_SCAN_RECORDS,
    PULL_PER_MESSAGE_BYTES,
    PullPath,
    PullQuery,
    PullResult,
    PullStatus,
    parse_subscription,
)
from broker.state import derived
from broker.state.message import Message, UniqIdGenerator, encode_batch, tags_hash
from broker.state.records import ENTRY_MESSAGES
from dledger.log import IndexOutOfRangeError
from msgcodec import crc32c

IDS = UniqIdGenerator(ip="10.0.0.1", pid=7, instance_hash=1)
TOPICS = ("T", "U", "%RETRY%g")
TAGS = ("A", "B", "C", "")
SEEDS = 60


class RetainedLog(MemoryLog):
    """The in-memory log with its head deleted by retention up to ``deleted_below`` (the
    ConsumeQueue still names messages there, as before its own files are deleted)."""

    def __init__(self) -> None:
        super().__init__()
        self.deleted_below = 0

    def read_at(self, position: int, size: int) -> bytes:
        if position < self.deleted_below:
            raise IndexOutOfRangeError(f"position {position} was deleted")
        return super().read_at(position, size)


def reference_pull_once(puller: PullPath, query: PullQuery, hashes: Any) -> PullResult:
    """The pull as it was before runs: each message read and checked on its own."""
    cq = puller.ctx.sm.cqs.find(query.topic, query.queue_id)
    low, high = (0, 0) if cq is None else (cq.min_offset, cq.max_offset)
    offset = query.queue_offset
    if offset < low or offset > high:
        return PullResult(PullStatus.OFFSET_ILLEGAL, low if offset < low else high, low, high)
    if offset == high or cq is None:
        return PullResult(PullStatus.NO_NEW_MSG, offset, low, high)
    max_msgs = min(query.max_msgs or DEFAULT_PULL_MAX_MSGS, MAX_PULL_MSGS)
    scan = max(max_msgs, PULL_MAX_SCAN_RECORDS) if hashes is not None else max_msgs
    result = PullResult(PullStatus.NO_MATCHED_MSG, offset, low, high)
    parts: list[bytes] = []
    budget = MAX_ANSWER_BYTES
    sm, read = puller.ctx.sm, puller.applied.raw
    matcher = derived.RowMatcher(query.topic, query.queue_id)
    for i, (position, size, tag_hash) in enumerate(cq.read(offset, scan)):
        if hashes is not None and tag_hash not in hashes:
            result.next_begin_offset = offset + i + 1
            continue
        cost = size + PULL_PER_MESSAGE_BYTES
        if parts and cost > budget:
            break
        result.next_begin_offset = offset + i + 1
        row = (position, size, tag_hash)
        parts.append(derived.checked_raw(sm, read, matcher, offset + i, row))
        result.queue_offsets.append(offset + i)
        result.positions.append(position)
        budget -= cost
        if len(parts) >= max_msgs:
            break
    if parts:
        result.status = PullStatus.FOUND
        result.raw = b"".join(parts)
        result.suggest_pull_from_follower = puller.suggest_follower(result.positions[-1])
    return result


def outcome(pull: Any, args: tuple[Any, ...], damage_reports: list[int]) -> tuple[Any, ...]:
    """A pull's answer, or its refusal (type, text, offset), with the damage it reported."""
    damage_reports.clear()
    try:
        r = pull(*args)
    except Exception as exc:  # the refusal itself is what is compared
        return (
            "refused",
            type(exc).__name__,
            str(exc),
            getattr(exc, "offset", None),
            [*damage_reports],
        )
    fields = (r.status, r.next_begin_offset, r.min_offset, r.max_offset, r.raw)
    return (
        "answer",
        fields,
        r.queue_offsets,
        r.positions,
        r.suggest_pull_from_follower,
        [*damage_reports],
    )


def fill(rng: random.Random, log: RetainedLog, sm: Any) -> None:
    """Batches of one queue and of many (topics interleaved), as producers send them."""
    for _ in range(rng.randrange(4, 12)):
        mixed = rng.random() < 0.4
        topic, queue_id = rng.choice(TOPICS), rng.randrange(2)
        msgs = []
        for _ in range(rng.randrange(1, 40)):
            if mixed:
                topic, queue_id = rng.choice(TOPICS), rng.randrange(2)
            body = rng.randbytes(rng.choice((1, 17, 128, 1024)))
            msgs.append(
                Message(topic, queue_id, body, tags=rng.choice(TAGS), uniq_id=IDS.next_id())
            )
        sm.apply([log.add(encode_batch(msgs)[0], ENTRY_MESSAGES)])


def damage(rng: random.Random, log: RetainedLog, sm: Any) -> tuple[str, PullQuery]:
    """One of: nothing, a flipped byte in a message, a wrong record, a message of another
    queue, a retention gap; and a
    pull that reads up to the damaged message."""
    keys = [k for k in sm.cqs.queue_ids() if sm.cqs.find(*k).max_offset > 0]
    topic, queue_id = rng.choice(keys)
    cq = sm.cqs.find(topic, queue_id)
    at = rng.randrange(cq.max_offset)
    position, size, tag = cq.get(at)
    kind = rng.choice(("none", "byte", "byte", "tag", "size", "requeue", "retention"))
    if kind == "byte":
        log.data[position + rng.randrange(size)] ^= 1 << rng.randrange(8)
    elif kind == "tag":
        cq.rewrite(at, [(position, size, tag + 1)])
    elif (
        kind == "size"
        and size > 1
        and (at + 1 == cq.max_offset or cq.get(at + 1)[0] > position + size - 1)
    ):
        cq.rewrite(at, [(position, size - 1, tag)])
    elif kind == "requeue":  # a sound message of another queue or topic (its CRC made right)
        if (
            topic in ("T", "U") and rng.random() < 0.5
        ):  # names of one length: the other's field fits in its place
            log.data[position + 73] = ord("U" if topic == "T" else "T")
        else:
            log.data[position + 16 : position + 20] = (queue_id + 2).to_bytes(4, "big")
        crc = crc32c(bytes(log.data[position + 12 : position + size]))
        log.data[position + 8 : position + 12] = crc.to_bytes(4, "big")
    elif kind == "retention":
        log.deleted_below = position + rng.randrange(size + 1)
    return kind, PullQuery(topic, queue_id, max(0, at - rng.randrange(4)), 8)


def queries(rng: random.Random, sm: Any) -> list[PullQuery]:
    out = []
    for topic, queue_id in sm.cqs.queue_ids():
        cq = sm.cqs.find(topic, queue_id)
        assert cq is not None
        for _ in range(6):
            offset = rng.randrange(-1, cq.max_offset + 2)
            subscription = rng.choice(("", "*", "A", "A || C", "B || Z", ""))
            max_msgs = rng.choice((0, 1, 3, 32, 1024))
            out.append(PullQuery(topic, queue_id, offset, max_msgs, subscription))
    return out


@pytest.mark.parametrize("seed", range(SEEDS))
def test_a_pull_of_runs_answers_as_a_pull_of_single_messages(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    node, sm, topics, applied = world(tmp_path)
    log = RetainedLog()
    node.store = log
    sm.attach(log)
    reports: list[int] = []
    node.suspect_damage = lambda position, found_by="read": reports.append(position)  # type: ignore[method-assign]
    puller = PullPath(topics, applied)
    fill(rng, log, sm)
    kind, at_damage = damage(rng, log, sm)
    for query in [at_damage, *queries(rng, sm)]:
        tags = parse_subscription(query.subscription)
        hashes = None if tags is None else frozenset(tags_hash(t) for t in tags)
        new = outcome(puller._pull_once, (query, hashes), reports)
        old = outcome(reference_pull_once, (puller, query, hashes), reports)
        assert new == old, (kind, query)


def test_a_run_is_read_with_one_read_and_a_damaged_one_message_by_message(tmp_path: Path) -> None:
    node, sm, topics, applied = world(tmp_path)
    log = RetainedLog()
    node.store = log
    sm.attach(log)
    msgs = [Message("T", 0, b"x" * 128, tags="A", uniq_id=IDS.next_id()) for _ in range(50)]
    sm.apply([log.add(encode_batch(msgs)[0], ENTRY_MESSAGES)])
    reads: list[tuple[int, int]] = []
    plain_read = log.read_at

    def counted(position: int, size: int) -> bytes:
        reads.append((position, size))
        return plain_read(position, size)

    log.read_at = counted  # type: ignore[method-assign]
    puller = PullPath(topics, applied)
    got = puller.pull_once(PullQuery("T", 0, 0, max_msgs=50), None)
    assert got.status is PullStatus.FOUND and len(got.queue_offsets) == 50
    assert len(reads) == 1 and reads[0][1] == len(got.raw)
    # A damaged message in the middle: the run is read again one by one up to it, whose
    # record is then read for the refusal's reason.
    cq = sm.cqs.find("T", 0)
    assert cq is not None
    position, size, _tag = cq.get(25)
    log.data[position + size - 1] ^= 0xFF
    reads.clear()
    with pytest.raises(Exception, match="CRC") as refused:
        puller.pull_once(PullQuery("T", 0, 0, max_msgs=50), None)
    assert type(refused.value).__name__ == "CorruptMessageError"
    assert len(reads) == 1 + 26 + 1


def test_a_run_past_what_is_applied_or_stored_is_not_read_as_one(tmp_path: Path) -> None:
    node, sm, _topics, applied = world(tmp_path)
    log = RetainedLog()
    node.store = log
    sm.attach(log)
    msgs = [Message("T", 0, b"x" * 16, tags="A", uniq_id=IDS.next_id()) for _ in range(3)]
    sm.apply([log.add(encode_batch(msgs)[0], ENTRY_MESSAGES)])
    cq = sm.cqs.find("T", 0)
    assert cq is not None
    first, _size, _tag = cq.get(0)
    end = sm.dispatch_end
    assert applied.read_run(first, end - first) == bytes(log.data[first:end])
    assert applied.read_run(first, end - first + 1) is None  # past the applied end
    assert applied.read_run(-1, 10) is None and applied.read_run(first, 0) is None
    log.deleted_below = first + 1  # the store cannot read it: the caller reads one by one
    assert applied.read_run(first, end - first) is None
