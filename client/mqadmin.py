"""``mqadmin``: raftmq's admin command line, in RocketMQ's vocabulary (docs/CLIENT.md#mqadmin).

    mqadmin [-n host:port;host:port] [--json] [security options] COMMAND [flags]

Security options (docs/SECURITY.md): ``--tls-ca FILE`` (env ``RAFTMQ_TLS_CA``) speaks TLS,
``--credentials FILE`` (env ``RAFTMQ_CREDENTIALS``; JSON, mode 0600) or ``--access-key`` /
``--secret-key`` sign every call; ``--tls-cert`` / ``--tls-key`` present a client
certificate. A local secure group (``mqcluster up``) prints the two exports to use.

Exit codes: 0 ok; 1 a failed operation (one line on stderr with the broker's or NameServer's
stable code); 2 bad usage (unknown command, missing or malformed flag: argparse's usage), or a
RocketMQ command or option value raftmq refuses (the reason and what to use instead);
3 the command ran and found something an operator must look at (``replicaStatus``: a member
repairing, chains that differ, damage counters, a member not answering).
"""

from __future__ import annotations

import argparse
import codecs
import datetime
import difflib
import functools
import json
import logging
import os
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from raftmq.broker.v1 import broker_pb2 as pb
from raftmq.nameserver.v1 import nameserver_pb2 as ns_pb

from client.admin import MQAdmin
from client.consumer import PullConsumer
from client.errors import MQClientError
from client.members import (
    MEMBER_CHANGE_TIMEOUT_S,
    MemberRow,
    change_member,
    list_members,
    set_feature_level,
)
from client.message import Message, MessageExt, MessageQueue
from client.producer import Producer
from client.replicas import ReplicaReport, group_replica_status
from client.route import ChannelPool
from mqcli import CommandLine, GlobalOption
from mqcli.addrs import broker_addr
from mqerrors import codes as E
from mqrelease import FEATURE_LEVEL
from mqsecurity.errors import SecurityError
from mqsecurity.options import OPTION_SPECS, security_from_args
from prockit.livekeys import LIVE_BROKER_KEYS, RESTART_HINT

DEFAULT_PRODUCER_GROUP = "mqadmin_producer"
DEFAULT_CONSUMER_GROUP = "mqadmin_consumer"
ROLE_NAMES = {
    ns_pb.LEADER: "LEADER",
    ns_pb.FOLLOWER: "FOLLOWER",
    ns_pb.CANDIDATE: "CANDIDATE",
    ns_pb.PRE_CANDIDATE: "PRE_CANDIDATE",
}

Row = dict[str, Any]


def format_table(rows: Sequence[Row], columns: Sequence[str] | None = None) -> str:
    """Rows as an aligned text table: a header, then one line per row. Numbers are
    right-aligned, everything else left-aligned; no trailing spaces."""
    if not rows:
        return "(none)"
    cols = list(columns) if columns is not None else list(rows[0])
    cells = [[_cell(r.get(c, "")) for c in cols] for r in rows]
    numeric = [all(isinstance(r.get(c), int | float) for r in rows) for c in cols]
    widths = [max(len(c), *(len(line[i]) for line in cells)) for i, c in enumerate(cols)]

    def line(values: Sequence[str]) -> str:
        parts = [
            v.rjust(w) if num else v.ljust(w)
            for v, w, num in zip(values, widths, numeric, strict=True)
        ]
        return "  ".join(parts).rstrip()

    return "\n".join([line(cols), *(line(c) for c in cells)])


def _cell(value: object) -> str:
    if isinstance(value, list | tuple):
        return ",".join(str(v) for v in value)
    return str(value)


class Output:
    def __init__(self, as_json: bool) -> None:
        self.as_json = as_json

    def table(self, rows: Sequence[Row], extra: Row | None = None) -> None:
        if self.as_json:
            doc: Any = {"rows": list(rows), **extra} if extra else list(rows)
            print(json.dumps(doc, indent=2, sort_keys=False))
            return
        print(format_table(rows))
        for k, v in (extra or {}).items():
            print(f"{k}: {v}")

    def obj(self, doc: Row) -> None:
        if self.as_json:
            print(json.dumps(doc, indent=2))
            return
        width = max(len(k) for k in doc)
        for k, v in doc.items():
            print(f"{k.ljust(width)}  {_cell(v)}")


def message_row(m: MessageExt) -> Row:
    return {
        "msg_id": m.msg_id,
        "offset_msg_id": m.offset_msg_id,
        "broker": m.broker_name,
        "queue": m.queue_id,
        "offset": m.queue_offset,
        "tags": m.tags,
        "keys": list(m.keys),
        "store_time_ms": m.store_timestamp_ms,
        "body": m.body.decode("utf-8", errors="replace"),
    }


# RocketMQ's UtilAll.YYYY_MM_DD_HH_MM_SS_SSS (yyyy-MM-dd#HH:mm:ss:SSS), read in the local time
# zone as RocketMQ's tools read it.
ROCKETMQ_DATE_FORMAT = "%Y-%m-%d#%H:%M:%S:%f"
ROCKETMQ_DATE_HINT = "yyyy-MM-dd#HH:mm:ss:SSS"
# Longest time argument read (a date is 23 characters, millis 13): longer is not a time.
MAX_TIME_ARG_CHARS = 40


def parse_timestamp(value: str) -> int:
    """A time as RocketMQ's tools take it: ``now``, milliseconds since the epoch, or
    ``yyyy-MM-dd#HH:mm:ss:SSS`` in the local time zone. Anything else: a usage error."""
    text = value.strip()
    if text == "now":
        return int(time.time() * 1000)
    if len(text) > MAX_TIME_ARG_CHARS:
        raise argparse.ArgumentTypeError(f"not a time: {text[:MAX_TIME_ARG_CHARS]!r}...")
    try:
        ts = int(text)
    except ValueError:
        try:
            parsed = datetime.datetime.strptime(text, ROCKETMQ_DATE_FORMAT)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"not a time: {text!r} (now, ms since the epoch or {ROCKETMQ_DATE_HINT})"
            ) from None
        ts = int(parsed.timestamp() * 1000)
    if ts < 0:
        raise argparse.ArgumentTypeError(f"negative timestamp: {text}")
    return ts


def parse_bool(text: str) -> bool:
    """``true`` / ``false`` as RocketMQ's tools take them (any case)."""
    if text.strip().lower() not in ("true", "false"):
        raise argparse.ArgumentTypeError(f"expected true or false, got {text[:20]!r}")
    return text.strip().lower() == "true"


def only_value(accepted: str, refusal: str) -> Callable[[str], str]:
    """An argparse ``type`` for a RocketMQ option raftmq honours with one value only (what
    raftmq always does): that value passes, any other is refused with ``refusal`` (what to
    use instead), a usage error (exit 2). Never reinterpreted."""

    def check(text: str) -> str:
        if text.strip().lower() != accepted:
            raise argparse.ArgumentTypeError(
                f"raftmq takes only {accepted} here, not {text[:40]!r}: {refusal}"
            )
        return accepted

    return check


class Refused(MQClientError):
    """A RocketMQ command or option raftmq does not honour: the message says why and what to
    use (exit 2, as a usage error; code BAD_USAGE). Caught before MQClientError."""

    def __init__(self, message: str) -> None:
        row = MQClientError.local(E.BAD_USAGE, message)
        super().__init__(row.code, row.status, message)


class QueueFilter:
    """A ``MessageQueueSelector`` for ``sendMessage -b BROKER -i QUEUE``: the first writable
    queue of that broker group and/or with that id (RocketMQ's tool sends to exactly that
    queue); none: ``QUEUE_NOT_FOUND``, nothing is sent."""

    def __init__(self, broker: str, queue_id: int | None) -> None:
        self.broker = broker
        self.queue_id = queue_id

    def select(self, queues: Sequence[MessageQueue], msg: Message, arg: Any) -> MessageQueue:
        for q in queues:
            if self.broker and q.broker_name != self.broker:
                continue
            if self.queue_id is not None and q.queue_id != self.queue_id:
                continue
            return q
        wanted = (
            f"broker {self.broker or '*'} queue {'*' if self.queue_id is None else self.queue_id}"
        )
        raise MQClientError(
            E.QUEUE_NOT_FOUND, "NOT_FOUND", f"{msg.topic} has no writable queue on {wanted}"
        )


# -- commands ------------------------------------------------------------------------------


# RocketMQ 5's values of the topic attribute message.type (the broker checks them too).
MESSAGE_TYPES = ("NORMAL", "FIFO", "DELAY", "TRANSACTION", "MIXED")


def _message_type_attribute(text: str) -> str:
    """``+message.type=FIFO`` (RocketMQ 5's updateTopic -a syntax) -> ``FIFO``."""
    key, sep, value = text.strip().partition("=")
    if key != "+message.type" or not sep or value not in MESSAGE_TYPES:
        raise argparse.ArgumentTypeError(
            f"expected +message.type=<{'|'.join(MESSAGE_TYPES)}>, got {text[:80]!r}"
        )
    return value


def _check_cluster(admin: MQAdmin, cluster: str) -> None:
    if cluster:
        names = [c.name for c in admin.cluster_info().clusters]
        if cluster not in names:
            raise MQClientError(
                E.CLUSTER_NOT_FOUND, "NOT_FOUND", f"no cluster {cluster!r:.80}; known: {names}"
            )


def group_of_node(admin: MQAdmin, addr: str) -> str:
    """The broker group of the node whose client address is ``addr`` (RocketMQ's ``-b
    brokerAddr``: in raftmq a node stands for its whole Raft group)."""
    for c in admin.cluster_info().clusters:
        for g in c.groups:
            if any(m.client_addr == addr for m in g.members):
                return str(g.broker_name)
    raise MQClientError.local(E.NO_BROKER, f"no registered node has the address {addr!r:.80}")


def _targets(admin: MQAdmin, args: argparse.Namespace) -> list[str]:
    """The broker groups ``-b BROKER_ADDR`` (wins, as in RocketMQ) or ``-c CLUSTER`` name;
    empty: every group."""
    addr = getattr(args, "broker_addr", "")
    if addr:
        return [group_of_node(admin, addr)]
    cluster = getattr(args, "cluster", "")
    if not cluster:
        return []
    _check_cluster(admin, cluster)
    return [
        str(g.broker_name)
        for c in admin.cluster_info().clusters
        if c.name == cluster
        for g in c.groups
    ]


def cmd_update_topic(admin: MQAdmin, args: argparse.Namespace, out: Output) -> None:
    _check_cluster(admin, args.cluster)
    only = [group_of_node(admin, args.broker_addr)] if args.broker_addr else []
    groups = admin.create_topic(
        args.topic,
        cluster=args.cluster if not only else "",
        read_queues=args.read_queues,
        write_queues=args.write_queues,
        perm=args.perm,
        message_type=args.message_type or "",
        broker_names=only,
    )
    out.table(
        [
            {
                "broker": g,
                "topic": args.topic,
                "read_queues": args.read_queues,
                "write_queues": args.write_queues,
                "perm": args.perm,
                "message_type": args.message_type or "MIXED",
            }
            for g in groups
        ]
    )


def cmd_delete_topic(admin: MQAdmin, args: argparse.Namespace, out: Output) -> None:
    only = _targets(admin, args)
    if args.cluster and not only:  # a cluster without groups: nothing of it to delete
        out.table([])
        return
    groups = admin.delete_topic(args.topic, only)
    out.table([{"broker": g, "topic": args.topic, "deleted": True} for g in groups])


def cmd_topic_list(admin: MQAdmin, args: argparse.Namespace, out: Output) -> None:
    if args.cluster_model:
        out.table(_topic_cluster_rows(admin))
        return
    topics = admin.topic_list()
    if out.as_json:
        print(json.dumps(topics))
    else:
        print("\n".join(topics) if topics else "(none)")


def _topic_cluster_rows(admin: MQAdmin) -> list[Row]:
    """``topicList -c``: per topic its cluster and every consumer group with offsets on it
    (RocketMQ's clusterName, topic, consumerGroup)."""
    cluster_of = {
        str(g.broker_name): str(c.name) for c in admin.cluster_info().clusters for g in c.groups
    }
    consumers: dict[str, set[str]] = {}
    for infos in admin.consumer_groups().values():
        for info in infos:
            for t in info.topics:
                consumers.setdefault(t, set()).add(info.consumer_group)
    pairs = {
        (cluster_of.get(broker, "-"), t)
        for broker, topics in admin.group_topics().items()
        for t in topics
    }
    rows: list[Row] = []
    for cluster, t in sorted(pairs):
        groups = sorted(consumers.get(t, ())) or [""]
        rows.extend({"cluster": cluster, "topic": t, "consumer_group": g} for g in groups)
    return rows


def cmd_topic_route(admin: MQAdmin, args: argparse.Namespace, out: Output) -> None:
    route = admin.topic_route_info(args.topic)
    out.table(
        [
            {
                "cluster": g.cluster,
                "broker": g.broker_name,
                "read_queues": g.read_queue_nums,
                "write_queues": g.write_queue_nums,
                "perm": g.perm,
                "leader": g.leader_id,
                "leader_addr": g.leader_addr,
                "term": g.leader_term,
                "followers": [f"{f.node_id}={f.addr}" for f in g.followers],
            }
            for g in route.groups
        ]
    )


def cmd_topic_status(admin: MQAdmin, args: argparse.Namespace, out: Output) -> None:
    only = _targets(admin, args)
    if args.cluster and not only:
        out.table([])
        return
    rows = [
        {
            "broker": s.broker_name,
            "queue": s.queue_id,
            "min_offset": s.min_offset,
            "max_offset": s.max_offset,
        }
        for s in admin.topic_status(args.topic, only)
    ]
    out.table(rows)


def cmd_cluster_list(admin: MQAdmin, args: argparse.Namespace, out: Output) -> None:
    _check_cluster(admin, args.cluster)
    rows = []
    for c in admin.cluster_info().clusters:
        if args.cluster and c.name != args.cluster:
            continue
        for g in c.groups:
            leader = next((m for m in g.members if m.node_id == g.leader_id), None)
            rows.append(
                {
                    "cluster": c.name,
                    "broker": g.broker_name,
                    "nodes": len(g.members),
                    "leader": g.leader_id or "-",
                    "leader_addr": leader.client_addr if leader else "-",
                    "term": leader.term if leader else 0,
                    "topics": leader.topic_count if leader else 0,
                }
            )
    out.table(rows)


def cmd_node_status(admin: MQAdmin, args: argparse.Namespace, out: Output) -> None:
    rows = []
    for c in admin.cluster_info().clusters:
        if args.cluster and c.name != args.cluster:
            continue
        for g in c.groups:
            for m in g.members:
                if args.broker_addr and m.client_addr != args.broker_addr:
                    continue
                rows.append(
                    {
                        "cluster": c.name,
                        "broker": g.broker_name,
                        "node": m.node_id,
                        "role": ROLE_NAMES.get(m.role, "UNKNOWN"),
                        "term": m.term,
                        "addr": m.client_addr,
                        "heartbeat_age_ms": m.last_heartbeat_age_ms,
                        "heartbeat_period_ms": m.heartbeat_period_ms,
                        "topics": m.topic_count,
                        "release": m.release or "<=0.2.0",
                        "supported_feature_level": m.supported_feature_level or 1,
                        "feature_level": m.feature_level or 1,
                    }
                )
    out.table(rows)


def cmd_consumer_progress(admin: MQAdmin, args: argparse.Namespace, out: Output) -> None:
    only = _targets(admin, args)
    if not args.group:
        out.table(_group_summary_rows(admin, args.cluster, args.topic))
        return
    topics = [args.topic] if args.topic else _group_topic_names(admin, args.group, args.cluster)
    progress = [(t, p) for t in topics for p in admin.consumer_progress(args.group, t, only)]
    rows = [
        {
            "topic": t,
            "broker": p.broker_name,
            "queue": p.queue_id,
            "broker_offset": p.broker_offset,
            "consumer_offset": p.consumer_offset,
            "lag": p.lag,
        }
        for t, p in progress
    ]
    out.table(rows, {"total_lag": sum(p.lag for _, p in progress)})


def _group_topic_names(admin: MQAdmin, group: str, cluster: str = "") -> list[str]:
    """The topics ``group`` has committed offsets for, over every broker group."""
    return sorted(
        {
            t
            for infos in admin.consumer_groups(cluster).values()
            for info in infos
            if info.consumer_group == group
            for t in info.topics
        }
    )


def _group_summary_rows(admin: MQAdmin, cluster: str, topic: str) -> list[Row]:
    """``consumerProgress`` without ``-g``: every consumer group with its online consumers
    and total lag over its topics (RocketMQ's group list)."""
    merged: dict[str, tuple[set[str], int]] = {}
    for infos in admin.consumer_groups(cluster).values():
        for info in infos:
            topics, online = merged.get(info.consumer_group, (set(), 0))
            merged[info.consumer_group] = (topics | set(info.topics), online + info.online_clients)
    rows: list[Row] = []
    for group, (topics, online) in sorted(merged.items()):
        if topic and topic not in topics:
            continue
        lag = sum(p.lag for t in sorted(topics) for p in admin.consumer_progress(group, t))
        rows.append(
            {"group": group, "topics": sorted(topics), "online_clients": online, "total_lag": lag}
        )
    return rows


def cmd_query_msg_by_key(admin: MQAdmin, args: argparse.Namespace, out: Output) -> None:
    only = _targets(admin, args)
    msgs = admin.query_msg_by_key(
        args.topic, args.key, args.max, args.begin or 0, args.end or 0, only
    )
    out.table([message_row(m) for m in msgs])


def cmd_query_msg_by_id(admin: MQAdmin, args: argparse.Namespace, out: Output) -> None:
    m = admin.query_msg_by_id(args.topic, args.id)
    row = message_row(m)
    row["properties"] = dict(m.properties)
    row["born_time_ms"] = m.born_timestamp_ms
    row["commitlog_position"] = m.commitlog_position
    row["reconsume_times"] = m.reconsume_times
    if out.as_json:
        out.obj(row)
    else:
        out.obj({k: (json.dumps(v) if isinstance(v, dict) else v) for k, v in row.items()})


def cmd_reset_offset_by_time(admin: MQAdmin, args: argparse.Namespace, out: Output) -> None:
    if args.offset is not None and not (args.broker_addr and args.queue is not None):
        raise Refused("-o OFFSET resets one queue: give -b BROKER_ADDR and -q QUEUE_ID with it")
    only = _targets(admin, args)
    resets = admin.reset_offset_by_time(
        args.group,
        args.topic,
        args.timestamp,
        only,
        -1 if args.queue is None else args.queue,
        args.offset,
    )
    extra: Row = {"timestamp_ms": args.timestamp} if args.offset is None else {}
    out.table(
        [{"broker": r.broker_name, "queue": r.queue_id, "offset": r.offset} for r in resets],
        extra,
    )


def cmd_send_message(admin: MQAdmin, args: argparse.Namespace, out: Output) -> None:
    keys = tuple(k for k in (args.keys or "").split(",") if k) if args.keys else ()
    msg = Message(args.topic, args.body.encode(), tags=args.tags, keys=keys)
    with Producer(
        args.producer_group, admin.namesrv_addr, security=admin.security, heartbeat_interval_s=0
    ) as producer:  # one-shot: no heartbeats (producerConnection lists applications)
        if args.broker or args.queue is not None:
            target = QueueFilter(args.broker, args.queue)
            r = producer.send(msg, target)
        else:
            r = producer.send(msg)
    out.obj(
        {
            "msg_id": r.msg_id,
            "offset_msg_id": r.offset_msg_id,
            "broker": r.message_queue.broker_name,
            "queue": r.message_queue.queue_id,
            "queue_offset": r.queue_offset,
            "duplicate": r.duplicate,
        }
    )


def _check_window(begin_ms: int | None, end_ms: int | None) -> None:
    """RocketMQ's checks of ``-s``/``-e`` (``-b``/``-e`` for printMsg): both before now,
    begin <= end."""
    now_ms = int(time.time() * 1000)
    for name, value in (("begin", begin_ms), ("end", end_ms)):
        if value is not None and value > now_ms:
            raise Refused(f"the {name} time {value} is after now ({now_ms}): set one before now")
    if begin_ms is not None and end_ms is not None and begin_ms > end_ms:
        raise Refused(f"the begin time {begin_ms} is after the end time {end_ms}")


def pull_window(
    consumer: PullConsumer,
    queues: Sequence[MessageQueue],
    window: tuple[int | None, int | None, int | None],
    count: int,
    expression: str = "*",
) -> list[MessageExt]:
    """Up to ``count`` messages, queue by queue, from ``offset`` (each queue's min when None)
    and the first message stored at or after ``begin_ms``, none stored after ``end_ms``.
    Commits nothing."""
    offset0, begin_ms, end_ms = window
    found: list[MessageExt] = []
    for mq in queues:
        offset = 0 if offset0 is None else offset0
        if begin_ms is not None:
            offset = max(offset, consumer.search_offset(mq, begin_ms))
        while len(found) < count:
            res = consumer.pull(mq, offset, min(count - len(found), PULL_BATCH), expression)
            if res.status == "OFFSET_ILLEGAL" and res.next_begin_offset > offset:
                offset = res.next_begin_offset
                continue
            if res.status not in ("FOUND", "NO_MATCHED_MSG"):
                break
            in_window = [
                m for m in res.messages if end_ms is None or m.store_timestamp_ms <= end_ms
            ]
            found.extend(in_window)
            if len(in_window) < len(res.messages) or res.next_begin_offset <= offset:
                break
            offset = res.next_begin_offset
        if len(found) >= count:
            break
    return found[:count]


def cmd_consume_message(admin: MQAdmin, args: argparse.Namespace, out: Output) -> None:
    _check_window(args.begin, args.end)
    with PullConsumer(args.group, admin.namesrv_addr, admin.security) as consumer:
        queues: list[MessageQueue] = consumer.fetch_queues(args.topic)
        if args.broker:
            queues = [q for q in queues if q.broker_name == args.broker]
        if args.queue is not None:
            queues = [q for q in queues if q.queue_id == args.queue]
            if not queues:
                raise MQClientError(
                    E.QUEUE_ID_OUT_OF_RANGE, "INVALID_ARGUMENT", f"no queue {args.queue}"
                )
        msgs = pull_window(
            consumer, queues, (args.offset, args.begin, args.end), args.count, args.subexpr
        )
    out.table([message_row(m) for m in msgs])


def cmd_query_msg_by_offset(admin: MQAdmin, args: argparse.Namespace, out: Output) -> None:
    mq = MessageQueue(args.topic, args.broker, args.queue)
    with PullConsumer(DEFAULT_CONSUMER_GROUP, admin.namesrv_addr, admin.security) as consumer:
        if mq not in consumer.fetch_queues(args.topic):
            raise MQClientError(
                E.QUEUE_NOT_FOUND, "NOT_FOUND", f"{args.topic} has no queue {mq.key()}"
            )
        res = consumer.pull(mq, args.offset, 1)
    if res.status != "FOUND" or res.messages[0].queue_offset != args.offset:
        raise MQClientError(
            E.MESSAGE_NOT_FOUND,
            "NOT_FOUND",
            f"no message at offset {args.offset} of {mq.key()} ({res.status}; the queue holds "
            f"{res.min_offset}..{res.max_offset - 1})",
        )
    m = res.messages[0]
    row = message_row(m)
    row["properties"] = dict(m.properties)
    row["born_time_ms"] = m.born_timestamp_ms
    if out.as_json:
        out.obj(row)
    else:
        out.obj({k: (json.dumps(v) if isinstance(v, dict) else v) for k, v in row.items()})


def cmd_print_msg(admin: MQAdmin, args: argparse.Namespace, out: Output) -> None:
    _check_window(args.begin, args.end)
    try:
        codecs.lookup(args.charset)
    except LookupError:
        raise Refused(f"unknown charset {args.charset[:40]!r} (e.g. UTF-8, GBK)") from None
    with PullConsumer(DEFAULT_CONSUMER_GROUP, admin.namesrv_addr, admin.security) as consumer:
        queues = consumer.fetch_queues(args.topic)
        msgs = pull_window(
            consumer, queues, (None, args.begin, args.end), PRINT_MSG_MAX, args.subexpr
        )
    rows = []
    for m in msgs:
        row = message_row(m)
        row["body"] = (
            m.body.decode(args.charset, errors="replace") if args.print_body else "NOT PRINT BODY"
        )
        rows.append(row)
    out.table(rows)


def cmd_update_topic_perm(admin: MQAdmin, args: argparse.Namespace, out: Output) -> None:
    only = _targets(admin, args)
    if args.cluster and not only:
        out.table([])
        return
    groups = admin.update_topic_perm(args.topic, args.perm, only)
    out.table([{"broker": g, "topic": args.topic, "perm": args.perm} for g in groups])


def cmd_get_user(admin: MQAdmin, args: argparse.Namespace, out: Output) -> None:
    out.table(_user_rows(admin.get_user(args.username, args.cluster, args.broker_addr)))


def cmd_get_acl(admin: MQAdmin, args: argparse.Namespace, out: Output) -> None:
    out.table(_acl_rows(admin.get_acl(args.subject, args.cluster, args.broker_addr)))


def connection_row(c: pb.ClientConnection) -> Row:
    """A live client as consumerConnection, consumerStatus and producerConnection show it
    (RocketMQ's #ClientId #ClientAddr #Language #Version; "" when the client did not say)."""
    return {
        "client_id": c.client_id,
        "address": c.address,
        "language": c.language or "UNKNOWN",
        "version": c.version or "UNKNOWN",
        "protocol": c.protocol,
        "heartbeat_age_ms": c.last_heartbeat_age_ms,
    }


def _subscriptions(c: pb.ClientConnection) -> list[str]:
    subs = [f"{s.topic}:{s.expression or '*'}" for s in c.subscriptions]
    return [*subs, "..."] if c.subscriptions_truncated else subs


def cmd_consumer_connection(admin: MQAdmin, args: argparse.Namespace, out: Output) -> None:
    by_group = admin.consumer_connections(args.group, broker_addr=args.broker_addr)
    rows: list[Row] = [
        {
            "broker": broker,
            "group": args.group,
            **connection_row(c),
            "subscriptions": _subscriptions(c),
        }
        for broker, clients in by_group.items()
        for c in clients
    ]
    out.table(rows)


def cmd_producer_connection(admin: MQAdmin, args: argparse.Namespace, out: Output) -> None:
    by_group = admin.producer_connections(args.group, args.topic, args.broker_addr)
    rows: list[Row] = [
        {"broker": broker, "group": p.producer_group, **connection_row(p.connection)}
        for broker, producers in by_group.items()
        for p in producers
    ]
    out.table(rows)


class _LiveConsumer(NamedTuple):
    """One live consumer of a group as consumerStatus shows it: its connection as the broker
    group that heard from it last knows it, and the queues it holds locked on every broker
    group (an orderly consumer locks its queues on each group it reads)."""

    connection: pb.ClientConnection
    locked: list[tuple[str, str, int]]  # (broker group, topic, queue id), sorted


def _live_consumers(
    admin: MQAdmin, group: str, client_id: str, broker_addr: str
) -> dict[tuple[str, str], _LiveConsumer]:
    """The group's live consumers by (protocol, client id) (``client_id``: only it). The
    protocol is part of the key: a raftmq (v1) consumer and a RocketMQ 5 (v2) one may carry
    the same id (ids are made from the host and the process, and a process may run both), and
    they are two clients."""
    freshest: dict[tuple[str, str], pb.ClientConnection] = {}
    locked: dict[tuple[str, str], set[tuple[str, str, int]]] = {}
    for broker, clients in admin.consumer_connections(group, broker_addr=broker_addr).items():
        for c in clients:
            if client_id and c.client_id != client_id:
                continue
            key = (c.protocol, c.client_id)
            seen = freshest.get(key)
            if seen is None or c.last_heartbeat_age_ms < seen.last_heartbeat_age_ms:
                freshest[key] = c
            held = locked.setdefault(key, set())
            held.update((broker, q.topic, q.queue_id) for q in c.locked_queues)
    return {key: _LiveConsumer(c, sorted(locked[key])) for key, c in freshest.items()}


# clusterRT (RocketMQ's ClusterRTSubCommand): test messages timed per broker group.
# The topic they go to: RocketMQ's benchmark topic, created with one queue on each group of the
# cluster that does not route it yet (an existing topic is left as it is).
CLUSTER_RT_TOPIC = "BenchmarkTest"
CLUSTER_RT_GROUP = "CLUSTER_RT_PRODUCER"
# -a: messages per group per round. RocketMQ's default is 100; a probe of the send path, not a
# load test (make bench is), and every message is stored: at most 1,000.
CLUSTER_RT_AMOUNT = 100
MAX_CLUSTER_RT_AMOUNT = 1000
# -s: bytes per message (RocketMQ's default 128). At most 64 KiB, so that a round stores at
# most 64 MB per group.
CLUSTER_RT_SIZE = 128
MAX_CLUSTER_RT_SIZE = 64 * 1024
# -i: seconds between rounds; --rounds: how many (RocketMQ's tool loops until killed; raftmq
# runs a bounded count so a script ends).
CLUSTER_RT_INTERVAL_S = 10
MAX_CLUSTER_RT_INTERVAL_S = 3600
MAX_CLUSTER_RT_ROUNDS = 100


def _bounded_int(low: int, high: int, why: str) -> Callable[[str], int]:
    """An argparse ``type``: an integer in [low, high], else a usage error saying ``why``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not an integer: {text[:20]!r}") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{value} is outside {low}..{high} ({why})")
        return value

    return parse


def _rt_groups(admin: MQAdmin, cluster: str) -> list[tuple[str, str]]:
    """(cluster, broker group) of every group of ``cluster`` (every cluster when empty), with
    CLUSTER_RT_TOPIC created where it is not routed yet."""
    groups = [
        (c.name, g.broker_name)
        for c in admin.cluster_info().clusters
        if not cluster or c.name == cluster
        for g in c.groups
    ]
    if not groups:
        raise MQClientError.local(E.CLUSTER_NOT_FOUND, f"no broker group in cluster {cluster!r}")
    try:
        routed = {g.broker_name for g in admin.topic_route_info(CLUSTER_RT_TOPIC).groups}
    except MQClientError:
        routed = set()
    missing = sorted({name for _, name in groups} - routed)
    if missing:
        admin.create_topic(CLUSTER_RT_TOPIC, queues=1, broker_names=missing)
    return groups


def _time_sends(producer: Producer, broker: str, amount: int, body: bytes) -> tuple[float, int]:
    """``amount`` sends to queue 0 of ``broker``, one at a time, each with the producer's
    retries on that queue: (mean RT in ms of those that succeeded, 0 when none did;
    failures)."""
    total_s, failed = 0.0, 0
    pick = QueueFilter(broker, 0)
    for _ in range(amount):
        start = time.monotonic()
        try:
            producer.send(Message(CLUSTER_RT_TOPIC, body), pick)
        except MQClientError as exc:
            logging.getLogger(__name__).info("clusterRT %s: %s", broker, exc)
            failed += 1
            continue
        total_s += time.monotonic() - start
    ok = amount - failed
    return (total_s * 1000 / ok if ok else 0.0), failed


def cmd_cluster_rt(admin: MQAdmin, args: argparse.Namespace, out: Output) -> int:
    """RocketMQ's clusterRT: per round and broker group, ``-a`` sends of ``-s`` bytes, their
    mean RT and failures; ``-p true``: RocketMQ's log lines (time|machine room|cluster|broker|
    RT). Exit 1 when any send failed."""
    groups = _rt_groups(admin, args.cluster)
    body = b"a" * args.size
    rows: list[Row] = []
    # RocketMQ's tool times its producer's sends, retries included (2 by default).
    with Producer(CLUSTER_RT_GROUP, admin.namesrv_addr, security=admin.security,
                  heartbeat_interval_s=0) as producer:  # fmt: skip
        for round_no in range(1, args.rounds + 1):
            if round_no > 1:
                time.sleep(args.interval)  # the operator's pause between rounds (-i)
            for cluster, broker in groups:
                rt_ms, failed = _time_sends(producer, broker, args.amount, body)
                row: Row = {"round": round_no, "cluster": cluster, "broker": broker}
                row.update(rt_ms=round(rt_ms, 2), success=args.amount - failed, fail=failed)
                rows.append(row)
                if args.print_log and not out.as_json:
                    stamp = datetime.datetime.now().strftime("%Y-%m-%d %H:%M:%S")
                    print(f"{stamp}|{args.machine_room}|{cluster}|{broker}|{round(rt_ms)}")
    if not args.print_log or out.as_json:
        out.table([{**r, "machine_room": args.machine_room} for r in rows])
    return 1 if any(r["fail"] for r in rows) else 0


def cmd_consumer_status(admin: MQAdmin, args: argparse.Namespace, out: Output) -> int:
    """What the brokers know of each live consumer of ``-g`` (``-i``: one client): its
    self-description, subscriptions, last heartbeat and locked queues; then, per queue of
    the topics it subscribes to, the group's committed offset and lag."""
    live = _live_consumers(admin, args.group, args.client_id, args.broker_addr)
    if not live:
        who = f"consumer {args.client_id!r}" if args.client_id else "consumer"
        print(f"mqadmin consumerStatus: no live {who} in group {args.group!r}", file=sys.stderr)
        return 1
    holders: dict[tuple[str, str, int], str] = {}
    clients: list[Row] = []
    for (_, client_id), (c, locked) in sorted(live.items()):
        holders.update((queue, client_id) for queue in locked)
        row = {**connection_row(c), "subscriptions": _subscriptions(c)}
        row["locked_queues"] = [
            f"{broker}/{topic}/{queue_id}" for broker, topic, queue_id in locked
        ]
        clients.append(row)
    topics = sorted({s.topic for c, _ in live.values() for s in c.subscriptions})
    queues: list[Row] = []
    for topic in topics:
        try:
            progress = admin.consumer_progress(args.group, topic)
        except MQClientError as exc:  # a retry topic before its first retry: no queue yet
            logging.getLogger(__name__).info("consumerStatus: topic %s: %s", topic, exc)
            continue
        queues += [
            {
                "topic": topic,
                "broker": p.broker_name,
                "queue": p.queue_id,
                "max_offset": p.broker_offset,
                "committed_offset": p.consumer_offset,
                "lag": p.lag,
                "locked_by": holders.get((p.broker_name, topic, p.queue_id), ""),
            }
            for p in progress
        ]
    if out.as_json:
        print(json.dumps({"clients": clients, "queues": queues}, indent=2))
    else:
        print(format_table(clients))
        print()
        print(format_table(queues))
    return 0


def cmd_stats_all(admin: MQAdmin, args: argparse.Namespace, out: Output) -> None:
    """Per topic and consumer group: the messages the topic holds and the group's lag
    (RocketMQ's accumulation); rates are Prometheus metrics, not kept here."""
    by_topic: dict[str, set[str]] = {}
    for infos in admin.consumer_groups().values():
        for info in infos:
            for t in info.topics:
                by_topic.setdefault(t, set()).add(info.consumer_group)
    topics = [args.topic] if args.topic else admin.topic_list()
    rows: list[Row] = []
    for t in topics:
        status = admin.topic_status(t)
        stored = sum(q.max_offset - q.min_offset for q in status)
        for group in sorted(by_topic.get(t, ())) or [""]:
            lag = sum(p.lag for p in admin.consumer_progress(group, t)) if group else 0
            rows.append(
                {"topic": t, "consumer_group": group, "stored": stored, "accumulation": lag}
            )
    out.table(rows)


def cmd_get_broker_config(admin: MQAdmin, args: argparse.Namespace, out: Output) -> None:
    _check_cluster(admin, args.cluster)
    rows: list[Row] = [
        {
            "node": addr,
            "node_id": answer.node_id,
            "key": key,
            "value": answer.config[key],
            "source": answer.source.get(key, ""),
        }
        for addr, answer in admin.broker_configs(args.cluster, args.broker_addr).items()
        for key in sorted(answer.config)
    ]
    out.table(rows)


def cmd_update_broker_config(admin: MQAdmin, args: argparse.Namespace, out: Output) -> None:
    if not args.broker_addr and not args.cluster:
        raise Refused("give -b (the broker group of that node) or -c (every group of a cluster)")
    if args.clear == (args.value is not None):
        raise Refused("give -v VALUE to set the key, or --clear to drop its live override")
    if args.key not in LIVE_BROKER_KEYS:
        near = difflib.get_close_matches(args.key, sorted(LIVE_BROKER_KEYS), n=3)
        raise Refused(
            f"key {args.key!r:.80} does not change live: it {RESTART_HINT} and restart the "
            "nodes one at a time (docs/CONFIG.md), or it is no broker.conf key"
            + (f"; did you mean {', '.join(near)}?" if near else "")
            + f"; the keys that change live: {', '.join(sorted(LIVE_BROKER_KEYS))}"
        )
    _check_cluster(admin, args.cluster)
    try:
        answers = admin.update_broker_config(
            args.key,
            args.value or "",
            clear=args.clear,
            cluster=args.cluster,
            broker_addr=args.broker_addr,
        )
    except MQClientError as exc:
        if exc.code != E.INVALID_REQUEST:
            raise
        # The broker refused the key or value (nothing changed): a usage error, exit 2.
        detail = " ".join(exc.message.split())
        raise Refused(detail.removeprefix(exc.code + " ")) from None
    rows: list[Row] = [
        {"group": name, "key": a.key, "value": a.value, "index": a.index}
        for name, a in answers.items()
    ]
    out.table(rows)


def cmd_broker_status(admin: MQAdmin, args: argparse.Namespace, out: Output) -> None:
    _check_cluster(admin, args.cluster)
    rows: list[Row] = [
        {"node": addr, "node_id": answer.node_id, "key": key, "value": answer.info[key]}
        for addr, answer in admin.broker_runtime_info(args.cluster, args.broker_addr).items()
        for key in sorted(answer.info)
    ]
    out.table(rows)


def refused_command(says: str) -> Handler:
    """The handler of a RocketMQ command raftmq does not have: refuses, saying what to use."""

    def refuse(admin: MQAdmin, args: argparse.Namespace, out: Output) -> None:
        raise Refused(says)

    return refuse


def cmd_dlq_list(admin: MQAdmin, args: argparse.Namespace, out: Output) -> None:
    rows = []
    for m in admin.dlq_messages(args.group, args.count):
        row = message_row(m)
        row["origin_topic"] = m.properties.get("DLQ_ORIGIN_TOPIC", "")
        row["dlq_msg_id"] = m.store_msg_id
        row["reconsume_times"] = m.reconsume_times
        rows.append(row)
    out.table(rows)


def cmd_dlq_resend(admin: MQAdmin, args: argparse.Namespace, out: Output) -> None:
    rows: list[Row] = [
        {
            "msg_id": m.msg_id,
            "topic": r.message_queue.topic,
            "broker": r.message_queue.broker_name,
            "queue": r.message_queue.queue_id,
            "queue_offset": r.queue_offset,
            "new_msg_id": r.msg_id,
            "duplicate": r.duplicate,
        }
        for m, r in admin.resend_dlq(args.group, args.id)
    ]
    out.table(rows)


# -- argument parsing ----------------------------------------------------------------------

# Messages per pull of consumeMessage and printMsg.
PULL_BATCH = 32
# printMsg prints at most this many messages (RocketMQ's prints a whole topic; a bound keeps
# one command's memory and output finite: narrow the time window for more).
PRINT_MSG_MAX = 10_000
# consumeMessage's default count (RocketMQ's messageCount).
CONSUME_DEFAULT_COUNT = 128


# A handler returns None (exit 0) or its own exit code (EXIT_FLAGGED).
Handler = Callable[[MQAdmin, argparse.Namespace, Output], int | None]
# The command ran but found something an operator must look at (replicaStatus).
EXIT_FLAGGED = 3
# Bad usage, as argparse exits: also a RocketMQ command or option raftmq refuses.
EXIT_USAGE = 2


def _group_addr(admin: MQAdmin, args: argparse.Namespace) -> str:
    """The node to ask about a group: ``-a`` itself, or (``-b``) the leader of that broker
    group as the NameServer lists it (any registered member while there is none)."""
    if args.broker_addr:
        return str(args.broker_addr)
    for c in admin.cluster_info().clusters:
        for g in c.groups:
            if g.broker_name != args.broker:
                continue
            leader = next((m for m in g.members if m.node_id == g.leader_id), None)
            if leader is not None:
                return str(leader.client_addr)
            if g.members:
                return str(g.members[0].client_addr)
    raise MQClientError.local(E.NO_BROKER, f"no broker group {args.broker!r:.80} is registered")


def _member_rows(rows: Sequence[MemberRow], leader_id: str = "") -> list[Row]:
    return [
        {
            "node": m.node_id,
            "role": m.role + ("*" if m.node_id == leader_id else ""),
            "peer_addr": m.peer_addr,
            "client_addr": m.client_addr or "-",
            "match_index": m.match_index,
            "active": "yes" if m.recent_active else "no",
            "supported_feature_level": m.supported_feature_level or "-",
        }
        for m in rows
    ]


def cmd_list_member(admin: MQAdmin, args: argparse.Namespace, out: Output) -> None:
    with _MemberChannels(admin) as channels:
        m = list_members(channels, _group_addr(admin, args))
    extra = {
        "leader": m.leader_id or "-",
        "term": m.term,
        "config_index": m.config_index,
        "committed": m.config_committed,
        "feature_level": m.feature_level,
    }
    out.table(_member_rows(m.members, m.leader_id), extra)


def _change(admin: MQAdmin, args: argparse.Namespace, out: Output, kind: str) -> None:
    with _MemberChannels(admin) as channels:
        index, rows = change_member(
            channels,
            _group_addr(admin, args),
            kind,
            args.node_id,
            getattr(args, "peer_addr", ""),
            getattr(args, "client_addr", ""),
            timeout_s=args.timeout,
        )
    out.table(_member_rows(rows), {"change": kind, "node": args.node_id, "index": index})


def cmd_add_member(admin: MQAdmin, args: argparse.Namespace, out: Output) -> None:
    _change(admin, args, out, "ADD_VOTER" if args.voter else "ADD_LEARNER")


def cmd_promote_member(admin: MQAdmin, args: argparse.Namespace, out: Output) -> None:
    _change(admin, args, out, "PROMOTE")


def cmd_remove_member(admin: MQAdmin, args: argparse.Namespace, out: Output) -> None:
    _change(admin, args, out, "REMOVE")


def cmd_set_feature_level(admin: MQAdmin, args: argparse.Namespace, out: Output) -> None:
    with _MemberChannels(admin) as channels:
        level, index = set_feature_level(
            channels, _group_addr(admin, args), args.level, timeout_s=args.timeout
        )
    out.obj({"feature_level": level, "index": index})


def _unix_ms_text(ms: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ms / 1000)) if ms else "-"


def replica_rows(report: ReplicaReport) -> list[Row]:
    """One row per member of a replicaStatus report (``-`` where it did not answer)."""
    rows: list[Row] = []
    for r in report.rows:
        m = r.answer
        if m is None:
            rows.append({"node": r.node_id, "addr": r.client_addr, "role": "-", "flags": r.error})
            continue
        chain = f"{m.chain:016x}" if m.chain_known else "-"
        rows.append(
            {
                "node": r.node_id,
                "addr": r.client_addr,
                "role": m.role,
                "release": m.release or "<=0.2.0",
                "feature_level": m.feature_level or 1,
                "supported_feature_level": m.supported_feature_level or 1,
                "term": m.term,
                "last": m.last_index,
                "commit": m.commit_index,
                "applied": m.applied_index,
                "repairing": "YES" if m.repairing else "no",
                "promised": m.promised_index,
                "repairs": m.repairs_completed,
                f"chain@{report.chain_index}": chain,
                "damage": sum(m.corruption_found.values()),
                "chain_mm": m.chain_mismatches + m.chain_check_mismatches,
                "repaired": m.committed_repairs,
                "derived_mm": sum(m.derived_mismatches.values()),
                "scrub_end": _unix_ms_text(m.scrub_last_pass_end_ms),
                "scrub_bytes": m.scrub_bytes_verified,
                "flags": "; ".join(r.flags) or "-",
            }
        )
    return rows


def cmd_replica_status(admin: MQAdmin, args: argparse.Namespace, out: Output) -> int | None:
    with _MemberChannels(admin) as channels:
        report = group_replica_status(channels, _group_addr(admin, args))
    problems = list(report.flags)
    extra: Row = {"chain_index": report.chain_index, "flagged": report.flagged}
    if problems:
        extra["group_flags"] = "; ".join(problems)
    out.table(replica_rows(report), extra)
    return EXIT_FLAGGED if report.flagged else None


class _MemberChannels:
    """Channels for one member command, closed at the end (as the admin's own are)."""

    def __init__(self, admin: MQAdmin) -> None:
        self.channels = ChannelPool(admin.security)

    def __enter__(self) -> ChannelPool:
        return self.channels

    def __exit__(self, *exc: object) -> None:
        self.channels.close()


def _user_rows(by_group: dict[str, Any]) -> list[Row]:
    rows: list[Row] = []
    for group, users in by_group.items():
        for u in users if isinstance(users, list) else [users]:
            rows.append(
                {
                    "broker": group,
                    "username": u.username,
                    "type": u.user_type,
                    "status": u.user_status,
                }
            )
    return rows


def _acl_rows(by_group: dict[str, Any]) -> list[Row]:
    rows: list[Row] = []
    for group, acls in by_group.items():
        for acl in acls if isinstance(acls, list) else [acls]:
            for r in acl.rules:
                rows.append(
                    {
                        "broker": group,
                        "subject": acl.subject,
                        "resource": r.resource,
                        "actions": list(r.actions),
                        "decision": r.decision,
                        "sourceIps": list(r.source_ips),
                    }
                )
    return rows


def _split(value: str) -> list[str]:
    return [v.strip() for v in value.split(",") if v.strip()]


def cmd_create_user(admin: MQAdmin, args: argparse.Namespace, out: Output) -> None:
    users = admin.create_user(
        args.username, args.password, args.user_type, args.cluster, args.broker_addr
    )
    out.table(_user_rows(users))


def cmd_update_user(admin: MQAdmin, args: argparse.Namespace, out: Output) -> None:
    users = admin.update_user(
        args.username,
        args.password,
        args.user_type,
        args.user_status,
        args.cluster,
        args.broker_addr,
    )
    out.table(_user_rows(users))


def cmd_delete_user(admin: MQAdmin, args: argparse.Namespace, out: Output) -> None:
    groups = admin.delete_user(args.username, args.cluster, args.broker_addr)
    out.table([{"broker": g, "username": args.username, "deleted": True} for g in groups])


def cmd_list_user(admin: MQAdmin, args: argparse.Namespace, out: Output) -> None:
    out.table(_user_rows(admin.list_users(args.filter, args.cluster, args.broker_addr)))


def _put_acl(admin: MQAdmin, args: argparse.Namespace, out: Output, update: bool) -> None:
    acls = admin.put_acl(
        args.subject,
        _split(args.resources),
        _split(args.actions),
        args.decision,
        _split(args.source_ip),
        update=update,
        cluster=args.cluster,
        broker_addr=args.broker_addr,
    )
    out.table(_acl_rows(acls))


def cmd_create_acl(admin: MQAdmin, args: argparse.Namespace, out: Output) -> None:
    _put_acl(admin, args, out, update=False)


def cmd_update_acl(admin: MQAdmin, args: argparse.Namespace, out: Output) -> None:
    _put_acl(admin, args, out, update=True)


def cmd_copy_user(admin: MQAdmin, args: argparse.Namespace, out: Output) -> None:
    done = admin.copy_users(args.from_addr, args.to_addr, _split(args.username))
    rows: list[Row] = []
    for outcome, names in (
        ("created", done.created),
        ("updated", done.updated),
        ("unchanged", done.unchanged),
    ):
        rows.extend({"broker": args.to_addr, "username": n, "outcome": outcome} for n in names)
    out.table(sorted(rows, key=lambda r: r["username"]))


def cmd_copy_acl(admin: MQAdmin, args: argparse.Namespace, out: Output) -> None:
    acls = admin.copy_acls(args.from_addr, args.to_addr, _split(args.subjects))
    out.table(_acl_rows({args.to_addr: acls}))


def cmd_delete_acl(admin: MQAdmin, args: argparse.Namespace, out: Output) -> None:
    resources = _split(args.resources)
    groups = admin.delete_acl(args.subject, resources, args.cluster, args.broker_addr)
    shown = ",".join(resources) or "*"
    out.table([{"broker": g, "subject": args.subject, "resources": shown} for g in groups])


def cmd_list_acl(admin: MQAdmin, args: argparse.Namespace, out: Output) -> None:
    acls = admin.list_acls(args.subject, args.resources, args.cluster, args.broker_addr)
    out.table(_acl_rows(acls))


def _retry_policy(text: str) -> dict[str, Any]:
    """RocketMQ's groupRetryPolicy JSON: {"type": "CUSTOMIZED", "customizedRetryPolicy":
    {"next": [ms, ...]}} or {"type": "EXPONENTIAL", "exponentialRetryPolicy": {"initial": ms,
    "max": ms, "multiplier": x}} (the broker checks the ranges)."""
    try:
        policy = json.loads(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"retry policy is not JSON: {exc}") from None
    if not isinstance(policy, dict) or policy.get("type") not in ("CUSTOMIZED", "EXPONENTIAL"):
        raise argparse.ArgumentTypeError('retry policy: {"type": "CUSTOMIZED" | "EXPONENTIAL"}')
    return policy


def _orderly(text: str) -> bool:
    if text.lower() not in ("true", "false"):
        raise argparse.ArgumentTypeError(f"expected true or false, got {text[:20]!r}")
    return text.lower() == "true"


def _sub_group_config(args: argparse.Namespace) -> pb.SubscriptionGroup:
    config = pb.SubscriptionGroup(group=args.group, consume_message_orderly=args.orderly)
    if args.retry_max_times is not None:
        config.max_delivery_attempts = args.retry_max_times + 1  # the first delivery + retries
    policy = args.retry_policy
    try:
        if policy is not None and policy["type"] == "CUSTOMIZED":
            config.backoff_type = "CUSTOMIZED"
            config.customized_backoff_ms.extend(policy["customizedRetryPolicy"]["next"])
        elif policy is not None:
            exp = policy["exponentialRetryPolicy"]
            config.backoff_type = "EXPONENTIAL"
            config.exponential_initial_ms = exp["initial"]
            config.exponential_max_ms = exp["max"]
            config.exponential_multiplier = exp["multiplier"]
    except (KeyError, TypeError, ValueError) as exc:
        raise MQClientError(
            E.BAD_USAGE, "INVALID_ARGUMENT", f"retry policy field missing or wrong: {exc}"
        ) from None
    return config


def _sub_group_rows(by_group: dict[str, Any]) -> list[Row]:
    rows: list[Row] = []
    for broker, configs in by_group.items():
        for c in configs if isinstance(configs, list) else [configs]:
            if c.backoff_type == "EXPONENTIAL":
                backoff = (
                    f"EXPONENTIAL {c.exponential_initial_ms}ms*{c.exponential_multiplier:g}"
                    f"^n <= {c.exponential_max_ms}ms"
                )
            else:
                backoff = "CUSTOMIZED " + ",".join(f"{ms}ms" for ms in c.customized_backoff_ms)
            rows.append(
                {
                    "broker": broker,
                    "group": c.group,
                    "consumeMessageOrderly": c.consume_message_orderly,
                    "retryMaxTimes": c.max_delivery_attempts - 1,
                    "maxDeliveryAttempts": c.max_delivery_attempts,
                    "retryPolicy": backoff,
                }
            )
    return rows


def cmd_update_sub_group(admin: MQAdmin, args: argparse.Namespace, out: Output) -> None:
    config = _sub_group_config(args)
    out.table(_sub_group_rows(admin.update_sub_group(config, args.cluster, args.broker_addr)))


def cmd_delete_sub_group(admin: MQAdmin, args: argparse.Namespace, out: Output) -> None:
    groups = admin.delete_sub_group(args.group, args.cluster, args.broker_addr)
    out.table([{"broker": g, "group": args.group, "deleted": True} for g in groups])


def cmd_get_consumer_config(admin: MQAdmin, args: argparse.Namespace, out: Output) -> None:
    by_group = admin.sub_groups(args.cluster, args.broker_addr)
    if args.group:
        by_group = {b: [c for c in cs if c.group == args.group] for b, cs in by_group.items()}
    out.table(_sub_group_rows(by_group))


def build_parser() -> argparse.ArgumentParser:
    cli = CommandLine(
        argparse.ArgumentParser(
            prog="mqadmin",
            description="raftmq admin tool (RocketMQ's mqadmin vocabulary).",
            epilog="Exit codes: 0 ok, 1 failed operation, 2 bad usage.",
        ),
        [
            GlobalOption.of(
                "-n",
                "--namesrv",
                default=os.environ.get("NAMESRV_ADDR", ""),
                help="NameServer addresses host:port;host:port (default: $NAMESRV_ADDR)",
            ),
            GlobalOption.of("--json", action="store_true", help="machine-readable JSON output"),
            GlobalOption.of(
                "-v", "--verbose", action="store_true", help="log the client's retries to stderr"
            ),
            *(GlobalOption.of(*flags, **kwargs) for flags, kwargs in OPTION_SPECS),
        ],
        dest="command",
        metavar="COMMAND",
        required=True,
    )
    _topic_commands(cli)
    _query_commands(cli)
    _message_commands(cli)
    _acl_commands(cli)
    _sub_group_commands(cli)
    _member_commands(cli)
    return cli.parser


def _command(cli: CommandLine, name: str, handler: Handler, help_: str) -> argparse.ArgumentParser:
    if name == "updateBrokerConfig":  # RocketMQ's -v is the value here, not --verbose
        help_ = UPDATE_BROKER_CONFIG_HELP
        p = cli.add(name, help=help_, description=help_, conflict_handler="resolve")
        p.set_defaults(handler=handler)
        return p
    p = cli.add(name, help=help_, description=help_)
    p.set_defaults(handler=handler)
    return p


def _topic_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("-t", "--topic", required=True, help="topic name")


def _cluster_flag(p: argparse.ArgumentParser, help_: str = "only this cluster's groups") -> None:
    p.add_argument("-c", "--cluster", "--clusterName", default="", help=help_)


def _broker_addr_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "-b",
        "--broker-addr",
        "--brokerAddr",
        dest="broker_addr",
        default="",
        type=_node_addr,
        help="only the broker group of the node at host:port (wins over -c, as in RocketMQ)",
    )


NO_ORDER_CONF = (
    "RocketMQ's order conf has no use here: every queue keeps its order; for FIFO topics "
    "use -a +message.type=FIFO, for orderly consumers updateSubGroup -o true"
)
NO_UNIT = "raftmq has no unit (multi-region) topics"


def _topic_commands(cli: CommandLine) -> None:
    """Topics and the cluster: RocketMQ's -t, -c, -r, -w, -p, -b (a node's address)."""

    add = functools.partial(_command, cli)
    _update_topic_parser(add("updateTopic", cmd_update_topic, "create or update a topic"))
    _more_topic_commands(add)


def _update_topic_parser(p: argparse.ArgumentParser) -> None:
    """updateTopic: RocketMQ's -t -c -b -r -w -p -a, and -o -u -s taken as false only."""
    _topic_flag(p)
    _cluster_flag(p, "cluster name (default: every cluster)")
    _broker_addr_flag(p)
    p.add_argument(
        "-r", "--read-queues", "--readQueueNums", dest="read_queues", type=int, default=8
    )
    p.add_argument(
        "-w", "--write-queues", "--writeQueueNums", dest="write_queues", type=int, default=8
    )
    p.add_argument("-p", "--perm", type=int, default=6, choices=(2, 4, 6), help="2 W, 4 R, 6 RW")
    p.add_argument(
        "-a",
        "--attributes",
        dest="message_type",
        type=_message_type_attribute,
        default=None,
        help="RocketMQ 5's attribute +message.type=NORMAL|FIFO|DELAY|TRANSACTION|MIXED "
        "(default MIXED: every type; docs/RMQ5.md)",
    )
    p.add_argument("-o", "--order", type=only_value("false", NO_ORDER_CONF), default="false")
    p.add_argument("-u", "--unit", type=only_value("false", NO_UNIT), default="false")
    p.add_argument("-s", "--hasUnitSub", type=only_value("false", NO_UNIT), default="false")


def _more_topic_commands(add: Callable[[str, Handler, str], argparse.ArgumentParser]) -> None:
    topic = _topic_flag
    p = add("deleteTopic", cmd_delete_topic, "delete a topic on every broker group serving it")
    topic(p)
    _cluster_flag(p, "only from this cluster's groups (default: every group routing it)")
    p = add("topicList", cmd_topic_list, "list every topic the NameServer routes")
    p.add_argument(
        "-c",
        "--clusterModel",
        dest="cluster_model",
        action="store_true",
        help="per topic: its cluster and the consumer groups with offsets on it",
    )
    p = add("topicRoute", cmd_topic_route, "a topic's route: groups, queues, leader, followers")
    topic(p)
    p.add_argument("-l", "--list", action="store_true", help="list format (always a list here)")
    p = add("topicStatus", cmd_topic_status, "min and max offset of every queue of a topic")
    topic(p)
    _cluster_flag(p)
    p = add("updateTopicPerm", cmd_update_topic_perm, "change a topic's perm, queues kept")
    topic(p)
    p.add_argument("-p", "--perm", type=int, required=True, choices=(2, 4, 6), help="2 W 4 R 6 RW")
    _cluster_flag(p)
    _broker_addr_flag(p)
    p = add("clusterList", cmd_cluster_list, "clusters and their broker groups")
    _cluster_flag(p)
    p.add_argument(
        "-m",
        "--moreStats",
        action=_RefuseFlag,
        says="per-node rates are Prometheus metrics (docs/METRICS.md)",
    )
    p.add_argument(
        "-i",
        "--interval",
        type=_refuse_value("repeat it with watch -n SECONDS mqadmin clusterList"),
    )
    p = add(
        "getBrokerConfig",
        cmd_get_broker_config,
        "each node's broker.conf as it runs (one node with -b; credentials only as set)",
    )
    _cluster_flag(p, "every node of this cluster (default: every node)")
    _broker_addr_flag(p)
    _update_broker_config_parser(add("updateBrokerConfig", cmd_update_broker_config, ""))
    p = add(
        "brokerStatus",
        cmd_broker_status,
        "each node's runtime figures: release, uptime, Raft role and term, log extent",
    )
    _cluster_flag(p, "every node of this cluster (default: every node)")
    _broker_addr_flag(p)
    p = add(
        "nodeStatus",
        cmd_node_status,
        "every node: role, term, address, heartbeat age, release and feature levels",
    )
    _cluster_flag(p)
    _broker_addr_flag(p)
    _refused_commands(add)


class _RefuseFlag(argparse.Action):
    """A RocketMQ flag without a value that raftmq does not honour: a usage error naming
    what to use (``says``)."""

    def __init__(self, option_strings: Sequence[str], dest: str, says: str = "", **kw: Any):
        super().__init__(option_strings, dest, nargs=0, default=None, **kw)
        self.says = says

    def __call__(self, parser: argparse.ArgumentParser, *args: object) -> None:
        parser.error(f"{'/'.join(self.option_strings)} is not taken by raftmq: {self.says}")


def _refuse_value(says: str) -> Callable[[str], str]:
    def refuse(text: str) -> str:
        raise argparse.ArgumentTypeError(f"not taken by raftmq: {says}")

    return refuse


# RocketMQ commands raftmq refuses, with what to use instead (docs/CLIENT.md's table).
# None at present: every shared command is served (its letters refused one by one where
# raftmq must differ).
REFUSED_COMMANDS: dict[str, str] = {}


UPDATE_BROKER_CONFIG_HELP = (
    "change a key that can change live on every member of a broker group, through its log "
    '(docs/CONFIG.md, "Live keys"; the other keys need a restart)'
)


def _update_broker_config_parser(p: argparse.ArgumentParser) -> None:
    """RocketMQ's -b (that node's group), -c (every group of the cluster), -k and -v; -v
    stands for the value here (--verbose keeps its long name)."""
    _cluster_flag(p, "every broker group of this cluster")
    _broker_addr_flag(p)
    p.add_argument(
        "-k",
        "--key",
        required=True,
        help=f"the broker.conf key: one of {', '.join(sorted(LIVE_BROKER_KEYS))}; every other "
        f"key {RESTART_HINT} (docs/CONFIG.md)",
    )
    p.add_argument("-v", "--value", default=None, help="its new value, as broker.conf spells it")
    p.add_argument(
        "--clear",
        action="store_true",
        help="raftmq: drop the key's live override (each node's broker.conf value again)",
    )


def _refused_commands(add: Callable[[str, Handler, str], argparse.ArgumentParser]) -> None:
    # Their RocketMQ options are not declared: main() lets them through, so the refusal (not
    # a usage error about a letter) is what the user sees.
    for name, says in REFUSED_COMMANDS.items():
        add(name, refused_command(says), f"not in raftmq: {says}")


def _query_commands(cli: CommandLine) -> None:
    """Offsets and lookups: RocketMQ's -g, -t, -k, -i, -s, -b, -e, -c."""

    add = functools.partial(_command, cli)
    topic = _topic_flag
    _consumer_progress_parser(add("consumerProgress", cmd_consumer_progress, "offsets and lag"))
    _lookup_commands(add)

    p = add("resetOffsetByTime", cmd_reset_offset_by_time, "reset a group's offsets to a time")
    p.add_argument("-g", "--group", required=True, help="consumer group")
    topic(p)
    p.add_argument(
        "-s", "--timestamp", type=parse_timestamp, required=True,
        help="now, ms since the epoch or " + ROCKETMQ_DATE_HINT + " (local time; -o wins)",
    )  # fmt: skip
    p.add_argument(
        "-f", "--force", type=only_value("true", "raftmq always resets, backwards too"),
        default="true",
    )  # fmt: skip
    _cluster_flag(p)
    _broker_addr_flag(p)
    p.add_argument("-q", "--queue", type=int, default=None, help="only this queue (with -b)")
    p.add_argument("-o", "--offset", type=int, default=None, help="this offset (with -b, -q)")


def _consumer_progress_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "-g", "--group", "--groupName", default="", help="consumer group (default: every group)"
    )
    p.add_argument(
        "-t", "--topic", "--topicName", default="", help="topic (default: every topic of -g)"
    )
    p.add_argument(
        "-s",
        "--showClientIP",
        type=only_value(
            "false",
            "raftmq does not map queues to client addresses; "
            "consumerConnection lists the group's live clients",
        ),
        default="false",
    )
    _cluster_flag(p)


def _lookup_commands(add: Callable[[str, Handler, str], argparse.ArgumentParser]) -> None:
    """queryMsgByKey, queryMsgById, queryMsgByOffset."""
    topic = _topic_flag
    p = add("queryMsgByKey", cmd_query_msg_by_key, "messages of a topic with a key")
    topic(p)
    p.add_argument("-k", "--key", "--msgKey", dest="key", required=True)
    p.add_argument(
        "-m", "--max", "--maxNum", type=int, default=64, help="at most this many (default 64)"
    )
    p.add_argument(
        "-b", "--begin", "--beginTimestamp", type=parse_timestamp, default=None,
        help="stored at or after this time (ms, now or " + ROCKETMQ_DATE_HINT + ")",
    )  # fmt: skip
    p.add_argument(
        "-e", "--end", "--endTimestamp", type=parse_timestamp, default=None,
        help="stored at or before this time",
    )  # fmt: skip
    _cluster_flag(p)

    p = add("queryMsgById", cmd_query_msg_by_id, "a message by uniq id or offsetMsgId")
    topic(p)
    p.add_argument(
        "-i", "--id", "--msgId", dest="id", required=True, help="msg id (uniq) or offset msg id"
    )
    p.add_argument("-c", "--cluster", default="", help="accepted; the topic's route is used")
    direct = "a broker cannot push a message to one raftmq client; use dlqResend or sendMessage"
    p.add_argument("-g", "--consumerGroup", type=_refuse_value(direct))
    p.add_argument("-d", "--clientId", type=_refuse_value(direct))
    p.add_argument("-s", "--sendMessage", type=only_value("false", direct), default="false")
    p.add_argument("-u", "--unitName", type=_refuse_value(NO_UNIT))
    p.add_argument(
        "-f", "--bodyFormat", type=_refuse_value("bodies print as UTF-8 (printMsg -c CHARSET)")
    )

    p = add("queryMsgByOffset", cmd_query_msg_by_offset, "the message at a queue's offset")
    topic(p)
    p.add_argument("-b", "--broker", "--brokerName", dest="broker", required=True)
    p.add_argument("-i", "--queue", "--queueId", dest="queue", type=int, required=True)
    p.add_argument("-o", "--offset", type=int, required=True)
    p.add_argument(
        "-f", "--bodyFormat", type=_refuse_value("bodies print as UTF-8 (printMsg -c CHARSET)")
    )


def _message_commands(cli: CommandLine) -> None:
    """Sending, consuming, dead letters: RocketMQ's -t, -p, -k, -c, -b, -i, -o, -g, -s, -e."""

    add = functools.partial(_command, cli)
    topic = _topic_flag
    p = add("sendMessage", cmd_send_message, "send one message")
    topic(p)
    p.add_argument("-p", "--body", required=True, help="message body (UTF-8)")
    p.add_argument("-c", "--tags", default="", help="tag")
    p.add_argument("-k", "--keys", "--key", dest="keys", default="", help="keys, comma-separated")
    p.add_argument(
        "-b", "--broker", "--brokerName", dest="broker", default="", help="only this broker group"
    )
    p.add_argument(
        "-i",
        "--queue",
        "--qid",
        dest="queue",
        type=int,
        default=None,
        help="only this queue id (with -b: that group's queue)",
    )
    p.add_argument(
        "-m",
        "--msgTraceEnable",
        type=only_value("false", "raftmq has no message trace; the audit log and queryMsgById"),
        default="false",
    )
    p.add_argument("--producer-group", default=DEFAULT_PRODUCER_GROUP)

    _consume_message_parser(
        add("consumeMessage", cmd_consume_message, "pull messages and print them (no commit)")
    )
    _print_and_stats_commands(add)


def _consume_message_parser(p: argparse.ArgumentParser) -> None:
    """consumeMessage: RocketMQ's -t -b -i -o -g -c, and -s / -e as begin and end times."""
    _topic_flag(p)
    p.add_argument(
        "-g",
        "--group",
        "--consumerGroup",
        dest="group",
        default=DEFAULT_CONSUMER_GROUP,
        help="consumer group",
    )
    p.add_argument(
        "-b", "--broker", "--brokerName", dest="broker", default="", help="only this broker group"
    )
    p.add_argument(
        "-i",
        "-q",
        "--queue",
        "--queueId",
        dest="queue",
        type=int,
        default=None,
        help="only this queue id",
    )
    p.add_argument("-o", "--offset", type=int, default=None, help="start offset (default: min)")
    p.add_argument(
        "-c",
        "--count",
        "--MessageNumber",
        dest="count",
        type=int,
        default=CONSUME_DEFAULT_COUNT,
        help=f"at most this many (default {CONSUME_DEFAULT_COUNT})",
    )
    p.add_argument(
        "-s", "--begin", "--beginTimestamp", type=parse_timestamp, default=None,
        help="from the first message stored at or after this time (ms, " + ROCKETMQ_DATE_HINT + ")",
    )  # fmt: skip
    p.add_argument(
        "-e", "--end", "--endTimestamp", type=parse_timestamp, default=None,
        help="none stored after this time",
    )  # fmt: skip
    p.add_argument("--subexpr", default="*", help="tag expression (default *; no letter)")


def _print_and_stats_commands(
    add: Callable[[str, Handler, str], argparse.ArgumentParser],
) -> None:
    """printMsg, dlqList, dlqResend, consumerConnection, statsAll."""
    topic = _topic_flag
    p = add("printMsg", cmd_print_msg, "print a topic's messages, optionally in a time window")
    topic(p)
    p.add_argument("-c", "--charset", "--charsetName", default="UTF-8", help="body charset")
    p.add_argument("-s", "--subexpr", "--subExpression", default="*", help="tag expression")
    p.add_argument("-b", "--begin", "--beginTimestamp", type=parse_timestamp, default=None)
    p.add_argument("-e", "--end", "--endTimestamp", type=parse_timestamp, default=None)
    p.add_argument(
        "-d", "--printBody", dest="print_body", type=parse_bool, default=True, help="true|false"
    )
    p.add_argument(
        "-l", "--lmqParentTopic", type=_refuse_value("raftmq has no light message queues")
    )

    p = add("dlqList", cmd_dlq_list, "a consumer group's dead letters (%%DLQ%%{group})")
    p.add_argument("-g", "--group", required=True, help="consumer group")
    p.add_argument("-c", "--count", type=int, default=1000, help="at most this many (1000)")
    p = add("dlqResend", cmd_dlq_resend, "resend dead letters to their original topics")
    p.add_argument("-g", "--group", required=True, help="consumer group")
    p.add_argument("-i", "--id", default="", help="only this msg id (default: all)")
    _client_commands(add)
    p = add("statsAll", cmd_stats_all, "per topic and group: messages stored, accumulation")
    p.add_argument("-t", "--topic", default="", help="only this topic")
    p.add_argument(
        "-a",
        "--activeTopic",
        action=_RefuseFlag,
        says="raftmq keeps no per-topic rates; they are Prometheus metrics (docs/METRICS.md)",
    )


def _client_commands(add: Callable[[str, Handler, str], argparse.ArgumentParser]) -> None:
    """consumerConnection, consumerStatus, producerConnection and clusterRT."""
    p = add("consumerConnection", cmd_consumer_connection, "a consumer group's live clients")
    p.add_argument("-g", "--group", "--consumerGroup", required=True, help="consumer group")
    _broker_addr_flag(p)
    p = add(
        "consumerStatus",
        cmd_consumer_status,
        "a consumer group's live clients: subscriptions, release, last heartbeat, locked "
        "queues, and the lag of every queue they subscribe to",
    )
    p.add_argument("-g", "--group", "--consumerGroup", required=True, help="consumer group")
    p.add_argument("-i", "--clientId", dest="client_id", default="", help="only this client")
    _broker_addr_flag(p)
    p.add_argument(
        "-s",
        "--jstack",
        action=_RefuseFlag,
        says="a broker cannot take a client's thread dump; run py-spy dump (or jstack) on the "
        "client's host",
    )
    p = add("producerConnection", cmd_producer_connection, "a producer group's live clients")
    p.add_argument("-g", "--producerGroup", dest="group", required=True, help="producer group")
    p.add_argument("-t", "--topic", required=True, help="a topic the group sends to")
    _broker_addr_flag(p)
    _cluster_rt_parser(add("clusterRT", cmd_cluster_rt, "time test sends to every broker group"))


def _cluster_rt_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "-a", "--amount", type=_bounded_int(1, MAX_CLUSTER_RT_AMOUNT, "messages per group"),
        default=CLUSTER_RT_AMOUNT, help=f"messages per group and round ({CLUSTER_RT_AMOUNT})",
    )  # fmt: skip
    p.add_argument(
        "-s", "--size", type=_bounded_int(1, MAX_CLUSTER_RT_SIZE, "bytes per message"),
        default=CLUSTER_RT_SIZE, help=f"bytes per message ({CLUSTER_RT_SIZE})",
    )  # fmt: skip
    _cluster_flag(p, "only this cluster's groups (default: every cluster)")
    p.add_argument(
        "-p", "--printLog", dest="print_log", type=parse_bool, default=False,
        help="true: one line per group and round, time|machine room|cluster|broker|RT",
    )  # fmt: skip
    p.add_argument(
        "-m", "--machineRoom", dest="machine_room", default="noname", help="for -p's lines"
    )
    p.add_argument(
        "-i", "--interval",
        type=_bounded_int(0, MAX_CLUSTER_RT_INTERVAL_S, "seconds between rounds"),
        default=CLUSTER_RT_INTERVAL_S,
        help=f"seconds between rounds ({CLUSTER_RT_INTERVAL_S})",
    )  # fmt: skip
    p.add_argument(
        "--rounds", type=_bounded_int(1, MAX_CLUSTER_RT_ROUNDS, "rounds"), default=1,
        help="raftmq: how many rounds (1; RocketMQ's tool loops until killed)",
    )  # fmt: skip


def _node_addr(text: str) -> str:
    """A node's host:port option (a port required: no broker port is implied); "" stays."""
    if not text:
        return text
    try:
        return broker_addr(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _member_target(p: argparse.ArgumentParser) -> None:
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument(
        "-b", "--broker", "--brokerName", dest="broker", default="", help="broker group name"
    )
    where.add_argument(
        "-a",
        "--broker-addr",
        "--brokerAddr",
        type=_node_addr,
        dest="broker_addr",
        default="",
        help="client host:port of any node of the group",
    )


def _member_commands(cli: CommandLine) -> None:
    """A group's members (docs/CLUSTER.md): -b or -a picks the group, -i the member."""
    add = functools.partial(_command, cli)
    _member_target(add("listMember", cmd_list_member, "a broker group's voters and learners"))

    def change(name: str, handler: Handler, help_: str) -> argparse.ArgumentParser:
        p = add(name, handler, help_)
        _member_target(p)
        p.add_argument("-i", "--node-id", "--nodeId", dest="node_id", required=True)
        p.add_argument(
            "--timeout",
            type=float,
            default=MEMBER_CHANGE_TIMEOUT_S,
            help=f"seconds to wait for the change (default {MEMBER_CHANGE_TIMEOUT_S:.0f})",
        )
        return p

    p = change("addMember", cmd_add_member, "add a member (a learner unless --voter)")
    p.add_argument(
        "-p",
        "--peer-addr",
        "--peerAddr",
        type=_node_addr,
        dest="peer_addr",
        required=True,
        help="its Raft host:port",
    )
    p.add_argument(
        "-c",
        "--client-addr",
        "--clientAddr",
        type=_node_addr,
        dest="client_addr",
        default="",
        help="its client host:port (named in redirects)",
    )
    p.add_argument("--voter", action="store_true", help="a voter straight away (no catching up)")
    change("promoteMember", cmd_promote_member, "make a caught-up learner a voter")
    change("removeMember", cmd_remove_member, "remove a member (the leader hands over first)")
    _member_target(
        add(
            "replicaStatus",
            cmd_replica_status,
            "every member's release, feature level, repair state, chain and damage "
            "counters; exit 3 when flagged",
        )
    )
    p = add(
        "setFeatureLevel",
        cmd_set_feature_level,
        "raise a broker group's feature level once every member supports it (never lowered)",
    )
    _member_target(p)
    p.add_argument(
        "--level",
        type=int,
        default=0,
        help=f"the level to raise to (default: this release's highest, {FEATURE_LEVEL})",
    )
    p.add_argument(
        "--timeout",
        type=float,
        default=MEMBER_CHANGE_TIMEOUT_S,
        help=f"seconds to wait for the raise (default {MEMBER_CHANGE_TIMEOUT_S:.0f})",
    )


def _where(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "-c", "--cluster", "--clusterName", default="", help="every group of this cluster"
    )
    p.add_argument(
        "-b",
        "--broker-addr",
        "--brokerAddr",
        type=_node_addr,
        default="",
        help="only the group of the node at host:port (default: every group)",
    )


def _acl_flags(p: argparse.ArgumentParser, rule: bool) -> None:
    p.add_argument("-s", "--subject", required=True, help="User:<username>")
    p.add_argument(
        "-r",
        "--resources",
        required=rule,
        default="",
        help="Cluster:c, Topic:t, Group:g (name * or prefix*), comma separated",
    )
    if rule:
        p.add_argument(
            "-a",
            "--actions",
            required=True,
            help="Pub,Sub,Create,Update,Delete,Get,List,All (comma separated)",
        )
        p.add_argument("-d", "--decision", default="Allow", help="Allow (default) or Deny")
        p.add_argument(
            "-i", "--source-ip", "--sourceIp", default="", help="addresses or CIDR blocks"
        )
    _where(p)


def _sub_group_commands(cli: CommandLine) -> None:
    """Consumer groups' config (RocketMQ's updateSubGroup -g, -o, -r; its groupRetryPolicy as
    --retryPolicy JSON), with -c / -b choosing the broker groups."""
    add = functools.partial(_command, cli)
    p = add(
        "updateSubGroup",
        cmd_update_sub_group,
        "create or update a consumer group: FIFO (-o), retries (-r), backoff (--retryPolicy)",
    )
    p.add_argument("-g", "--group", "--groupName", required=True, help="consumer group")
    p.add_argument(
        "-o",
        "--orderly",
        "--consumeMessageOrderly",
        type=_orderly,
        default=False,
        help="true: FIFO, a queue's messages one batch at a time in order (default false)",
    )
    p.add_argument(
        "-r",
        "--retry-max-times",
        "--retryMaxTimes",
        dest="retry_max_times",
        type=int,
        default=None,
        help="redeliveries before %%DLQ%%{group} (default: popMaxDeliveryAttempts - 1)",
    )
    p.add_argument(
        "-p",
        "--retry-policy",
        "--retryPolicy",
        "--groupRetryPolicy",
        dest="retry_policy",
        type=_retry_policy,
        default=None,
        help='RocketMQ\'s groupRetryPolicy JSON, e.g. {"type":"CUSTOMIZED",'
        '"customizedRetryPolicy":{"next":[1000,5000]}} (default: 1s 5s 10s 30s 1m .. 2h)',
    )
    _where(p)
    _sub_group_refusals(p)
    p = add(
        "deleteSubGroup",
        cmd_delete_sub_group,
        "delete a consumer group's config (it takes the defaults; offsets stay)",
    )
    p.add_argument("-g", "--group", "--groupName", required=True, help="consumer group")
    _where(p)
    p.add_argument(
        "-r",
        "--removeOffset",
        type=only_value("false", "offsets stay; resetOffsetByTime moves them"),
        default="false",
    )
    p = add("getConsumerConfig", cmd_get_consumer_config, "consumer groups' config")
    p.add_argument("-g", "--group", "--groupName", default="", help="only this group")
    _where(p)


def _sub_group_refusals(p: argparse.ArgumentParser) -> None:
    """updateSubGroup's RocketMQ options raftmq honours with its one behaviour only."""
    leader = "every read goes to the group's Raft leader"
    for flags, accepted, says in (
        (("-s", "--consumeEnable"), "true", "a group always consumes; revoke Sub in its ACL"),
        (("-d", "--consumeBroadcastEnable"), "false", "raftmq consumers share a group's queues"),
        (("-q", "--retryQueueNums"), "1", "a group has one retry queue per broker group"),
        (("-a", "--notifyConsumerIdsChanged"), "true", "consumers rebalance on every change"),
        (("-i", "--brokerId"), "0", leader),
        (("-w", "--whichBrokerWhenConsumeSlowly"), "1", leader),
    ):
        p.add_argument(*flags, type=only_value(accepted, says), default=accepted)
    p.add_argument(
        "-m",
        "--consumeFromMinEnable",
        type=_refuse_value("where a new group starts is its consumers' consumeFromWhere"),
    )
    p.add_argument("--attributes", type=_refuse_value("raftmq groups have no attributes"))


def _acl_commands(cli: CommandLine) -> None:
    """Users and ACL rules (RocketMQ 5.3): -u, -p, -t, -s (status / subject), -r, -a, -d, -i,
    -f, with -c / -b choosing the broker groups."""
    add = functools.partial(_command, cli)
    types = ("Super", "Normal")
    p = add("createUser", cmd_create_user, "create a user (AccessKey -u, SecretKey -p)")
    p.add_argument("-u", "--username", required=True, help="username (the AccessKey)")
    p.add_argument("-p", "--password", required=True, help="password (the SecretKey)")
    p.add_argument("-t", "--user-type", "--userType", default="Normal", choices=types)
    _where(p)
    p = add("updateUser", cmd_update_user, "change a user's password, type or status")
    p.add_argument("-u", "--username", required=True, help="username")
    p.add_argument("-p", "--password", default="", help="new password (default: keep)")
    p.add_argument("-t", "--user-type", "--userType", default="", choices=("", *types))
    p.add_argument(
        "-s", "--user-status", "--userStatus", default="", choices=("", "enable", "disable")
    )
    _where(p)
    p = add("deleteUser", cmd_delete_user, "delete a user and its ACL rules")
    p.add_argument("-u", "--username", required=True, help="username")
    _where(p)
    p = add("getUser", cmd_get_user, "a user (never its password), per broker group")
    p.add_argument("-u", "--username", required=True, help="username")
    _where(p)
    p = add("getAcl", cmd_get_acl, "a subject's rules, per broker group")
    p.add_argument("-s", "--subject", required=True, help="User:<username>")
    _where(p)
    p = add("listUser", cmd_list_user, "list users (never their passwords)")
    p.add_argument("-f", "--filter", default="", help="usernames containing this")
    _where(p)
    _acl_flags(add("createAcl", cmd_create_acl, "add rules: one per resource"), rule=True)
    _acl_flags(add("updateAcl", cmd_update_acl, "replace the rules of resources"), rule=True)
    _acl_flags(add("deleteAcl", cmd_delete_acl, "delete rules (all the subject's: no -r)"), False)
    p = add("listAcl", cmd_list_acl, "list rules")
    p.add_argument("-s", "--subject", default="", help="subjects containing this")
    p.add_argument("-r", "--resources", default="", help="resources containing this")
    _where(p)
    p = add(
        "copyUser",
        cmd_copy_user,
        "copy users, secrets sealed, from one broker group to another of the same cluster",
    )
    _copy_flags(p)
    p.add_argument(
        "-u", "--username", "--usernames", default="", help="users, comma-separated (default: all)"
    )
    p = add("copyAcl", cmd_copy_acl, "copy ACL rules from one broker group to another")
    _copy_flags(p)
    p.add_argument(
        "-s",
        "--subjects",
        "-u",
        default="",
        help="subjects (User:alice or alice), comma-separated (default: all)",
    )


def _copy_flags(p: argparse.ArgumentParser) -> None:
    """RocketMQ's copyUser / copyAcl: -f the source broker, -t the target broker."""
    p.add_argument(
        "-f",
        "--from-broker",
        "--fromBroker",
        dest="from_addr",
        required=True,
        help="a node (host:port) of the group to copy from",
    )
    p.add_argument(
        "-t",
        "--to-broker",
        "--toBroker",
        dest="to_addr",
        required=True,
        help="a node (host:port) of the group to copy to (its leader is found)",
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)  # exits 2 with usage on a bad command line
    if unknown and args.command not in REFUSED_COMMANDS:
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    if not args.namesrv:
        parser.error("no NameServer: pass -n host:port or set NAMESRV_ADDR")
    try:
        security = security_from_args(args)
    except SecurityError as exc:
        parser.error(str(exc))
    # The client logs retries and failovers; only the one error line goes to stderr by default.
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.CRITICAL + 1,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    out = Output(args.json)
    try:
        admin = MQAdmin(args.namesrv, security)
        rc = args.handler(admin, args, out)
    except Refused as exc:
        print(f"mqadmin {args.command}: refused: {exc.message}", file=sys.stderr)
        return EXIT_USAGE
    except MQClientError as exc:
        detail = " ".join(exc.message.split())
        if detail.startswith(exc.code + " "):
            detail = detail[len(exc.code) + 1 :]
        print(f"mqadmin {args.command}: {exc.code} ({exc.status}): {detail}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    return int(rc or 0)


if __name__ == "__main__":
    sys.exit(main())
