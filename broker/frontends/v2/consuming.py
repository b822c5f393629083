"""What the v2 front end tells push consumers and FIFO producers, from a subscription group's
replicated config (:mod:`broker.state.subgroups`): the retry policy each client language reads,
the assignments of ``QueryAssignment``, and the queue of a FIFO message's group.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from typing import Any

from google.protobuf.duration_pb2 import Duration

from broker.frontends.v2 import stubs
from broker.state.subgroups import (
    BACKOFF_CUSTOMIZED,
    MAX_BACKOFF_STEPS,
    MAX_MULTIPLIER_MILLI,
    MIN_MULTIPLIER_MILLI,
    SubGroup,
)

v2, v2_service, _v2_grpc = stubs.load()

# Where a FIFO message's group is stored: RocketMQ's own property for it (MessageConst
# PROPERTY_SHARDING_KEY), reserved so that a user property cannot fake one.
PROPERTY_MESSAGE_GROUP = "__SHARDINGKEY"
# The ``x-mq-language`` header of the official Python client (its signature's entries).
PYTHON_LANGUAGE_HEADER = "PYTHON"
# Characters of a message group: a business key (an order id, a user id); stored in every
# message of the group, so kept short.
MAX_MESSAGE_GROUP_CHARS = 128


def _duration(ms: int) -> Duration:
    return Duration(seconds=ms // 1000, nanos=(ms % 1000) * 1_000_000)


def fifo_queue(message_group: str, write_queue_nums: int) -> int:
    """The queue of every message of ``message_group``: a stable hash (the same on every node
    and after restarts, unlike Python's ``hash``) over the topic's write queues."""
    return zlib.crc32(message_group.encode("utf-8")) % max(1, write_queue_nums)


def message_group_problem(message_group: str) -> str:
    """Why ``message_group`` cannot be stored ("" when it can)."""
    if not message_group:
        return "a FIFO message needs a message group"
    if len(message_group) > MAX_MESSAGE_GROUP_CHARS:
        return f"message group of {len(message_group)} characters (max {MAX_MESSAGE_GROUP_CHARS})"
    if not message_group.isprintable():
        return "message group with control characters"
    return ""


def consumer_backoff(language: int, group: SubGroup) -> Any:
    """The group's retry policy as the client's language reads it: the Python client reads only
    a customized backoff (whole seconds), the Node.js client only an exponential one, the
    others either (the group's own kind). ``max_attempts`` is the group's."""
    b = group.backoff
    if language == v2.PYTHON or (language != v2.NODE_JS and b.kind == BACKOFF_CUSTOMIZED):
        steps = b.steps_ms if b.kind == BACKOFF_CUSTOMIZED else _expanded(group)
        return v2.RetryPolicy(
            max_attempts=group.max_attempts,
            customized_backoff=v2.CustomizedBackoff(next=[_duration(ms) for ms in steps]),
        )
    if b.kind == BACKOFF_CUSTOMIZED:
        initial, most, multiplier = _as_exponential(b.steps_ms)
    else:
        initial, most, multiplier = b.initial_ms, b.max_ms, b.multiplier_milli / 1000
    return v2.RetryPolicy(
        max_attempts=group.max_attempts,
        exponential_backoff=v2.ExponentialBackoff(
            initial=_duration(initial), max=_duration(most), multiplier=multiplier
        ),
    )


def _expanded(group: SubGroup) -> list[int]:
    """An exponential backoff's delays, one per retry, as customized steps."""
    retries = max(1, min(group.max_attempts - 1, MAX_BACKOFF_STEPS))
    return [group.backoff.delay_ms(n) for n in range(1, retries + 1)]


def _as_exponential(steps: tuple[int, ...]) -> tuple[int, int, float]:
    """The exponential backoff nearest a customized one: its first step, its longest, and the
    first step's growth (1 to 10)."""
    first = steps[0]
    growth = steps[1] / first if len(steps) > 1 and first > 0 else 1.0
    low, high = MIN_MULTIPLIER_MILLI / 1000, MAX_MULTIPLIER_MILLI / 1000
    return first, max(steps), min(max(growth, low), high)


def assignments(
    topic: Any, group: SubGroup, group_name: str, endpoints: Sequence[Any], readable: list[int]
) -> list[Any]:
    """``QueryAssignment``'s answer, as the proxy's: a normal group gets one assignment for the
    broker group (queue -1: a receive takes from every queue, no client rebalancing); a FIFO
    group every readable queue (each receive may hold one batch of a queue). Each once per
    member ``endpoints`` (queue-major), under a broker name of its own per member
    (:func:`member_broker_name`): a push consumer receives through every member, so one
    member's death stops only the receives that went through it (docs/RMQ5.md, "Routes and a
    dying node"). ``endpoints`` may also be one Endpoints of every member
    (:func:`pooled_endpoints`), assigned once under the group's own name."""
    assert endpoints, "a group is assigned with at least one endpoint"
    ids = readable if group.fifo else [-1]
    brokers = [
        v2.Broker(name=member_broker_name(group_name, e, len(endpoints)), id=0, endpoints=e)
        for e in endpoints
    ]
    return [
        v2.Assignment(
            message_queue=v2.MessageQueue(
                topic=topic,
                id=qid,
                permission=v2.READ,
                broker=broker,
                accept_message_types=[v2.FIFO] if group.fifo else [v2.NORMAL],
            )
        )
        for qid in ids
        for broker in brokers
    ]


def pooled_endpoints(endpoints: Sequence[Any]) -> list[Any]:
    """Every member's address in one ``Endpoints``, for a Python client in plaintext
    (:func:`pools_members`); ``endpoints`` as they are when there is one, or when the members
    do not all share one IP scheme (a client refuses several addresses under a domain name).

    Why: the Python push consumer 5.1.2 acks a message through the ``Endpoints`` it was
    received by, and retries a failed ack every second, forever, inside one of its 20
    consumption threads; while the member it received through is down, each message received
    there and not yet acked holds a thread, and 20 of them stop the consumer (its loops through
    the living members still receive, but nothing is consumed). Over one ``Endpoints`` of
    every member (gRPC's pick-first over the list) the retried ack reaches a member that
    lives (any member serves every call), and so does the next receive."""
    if len(endpoints) <= 1:
        return list(endpoints)
    schemes = {e.scheme for e in endpoints}
    if len(schemes) != 1 or schemes.pop() not in (v2.IPv4, v2.IPv6):
        return list(endpoints)
    addresses = [a for e in endpoints for a in e.addresses]
    return [v2.Endpoints(scheme=endpoints[0].scheme, addresses=addresses)]


def pools_members(language: str, secure: bool) -> bool:
    """Whether a client's assignments go through one ``Endpoints`` of every member
    (:func:`pooled_endpoints`): a Python client (its ``x-mq-language`` header) on a plaintext
    connection. Not the Node.js client (its resolver refuses the comma-joined target it makes
    of several addresses), and not over TLS (the target of several addresses is an authority
    no member's certificate names)."""
    return language == PYTHON_LANGUAGE_HEADER and not secure


def member_broker_name(group_name: str, endpoints: Any, members: int) -> str:
    """The broker name of an assignment through one member: the group's own when the group is
    assigned through one endpoint, else ``group@host:port``. The official push consumers key
    their receive loops by (topic, broker name, queue id), not by endpoints: under one name
    they would keep one loop of the several and receive through one member only. ``@`` is
    no character of a group name, so the name never meets a real group's."""
    if members == 1:
        return group_name
    address = endpoints.addresses[0]
    return f"{group_name}@{address.host}:{address.port}"
