"""The broker service's settings, shared by its components and its protocol front ends."""

from __future__ import annotations

from dataclasses import dataclass

from broker.state.delayrules import DEFAULT_DELAY_LEVELS, parse_delay_levels
from broker.state.timerrules import DEFAULT_TIMER_MAX_DELAY_S

# RocketMQ's accessMessageInMemoryMaxRatio default: a pull reading further behind the write
# position than this share of RAM is probably not in page cache: suggest a follower.
DEFAULT_MEMORY_RATIO_PERCENT = 40
# Leader: coalesced consumer offsets are proposed this often (one entry for all of them).
DEFAULT_OFFSET_COMMIT_INTERVAL_MS = 100


@dataclass(frozen=True, slots=True)
class ServiceConfig:
    """What the broker's components need from broker.conf. Each field is filled by one key
    (broker.configkeys, its ``to``), and its default here is that key's default: the table
    takes it from this class (INHERITED) instead of writing it again."""

    store_host: str
    store_port: int
    auto_create_topic: bool = False
    default_topic_queue_nums: int = 8
    max_message_size_bytes: int = 4 << 20
    slave_read_enable: bool = False
    memory_ratio_percent: int = DEFAULT_MEMORY_RATIO_PERCENT
    offset_commit_interval_ms: int = DEFAULT_OFFSET_COMMIT_INTERVAL_MS
    delay_levels_ms: tuple[int, ...] = parse_delay_levels(DEFAULT_DELAY_LEVELS)
    # POP consumption (broker.pop): deliveries of a message before it is dead-lettered, and
    # the shortest invisible time a receive may ask for.
    pop_max_attempts: int = 16
    # Subscription groups one user may create (broker.subscriptions, subscriptionGroupsPerUser).
    subgroups_per_user: int = 1000
    # Receives of one user waiting for messages on a node (broker.pop, popWaitersPerUser): a
    # tenth of the node's 10,000, far above one application's consumers.
    pop_waiters_per_user: int = 1000
    # One user's share of the node's other tables its calls fill (docs/SECURITY.md, "Quotas
    # per user"), a tenth of each by default: pulls held waiting (broker.pulling, 10,000),
    # live consumers (broker.locks, 10,000), queue locks (broker.locks, 100,000), offsets the
    # leader buffers (broker.offsets, 100,000).
    long_polls_per_user: int = 1000
    consumers_per_user: int = 1000
    # Live producers one user's heartbeats may register on a node (broker.components.producers,
    # producersPerUser): a tenth of its 10,000.
    producers_per_user: int = 1000
    queue_locks_per_user: int = 10_000
    pending_offsets_per_user: int = 10_000
    # Topics one user may create in the broker group (broker.topics, topicsPerUser): a tenth of
    # the 100,000 a broker group holds.
    topics_per_user: int = 10_000
    # Consumer groups with offsets one user's commits may create in the broker group
    # (broker.components.offsets, offsetGroupsPerUser): a tenth of
    # broker.state.records.MAX_OFFSET_GROUPS.
    offset_groups_per_user: int = 1000
    pop_min_invisible_ms: int = 10_000
    # Transactions (broker.components.transactions): RocketMQ's transactionTimeOut (immunity
    # before the first check-back), transactionCheckInterval and transactionCheckMax.
    txn_timeout_ms: int = 6000
    txn_check_interval_ms: int = 30_000
    txn_check_max: int = 15
    # Timed messages (broker.timer): the furthest delivery time a send may ask, ms ahead.
    timer_max_delay_ms: int = DEFAULT_TIMER_MAX_DELAY_S * 1000
