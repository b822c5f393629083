"""``mqadmin``: raftmq's admin command line, in RocketMQ's vocabulary (docs/CLIENT.md#mqadmin).

    mqadmin [-n host:port;host:port] [--json] [security options] COMMAND [flags]

Security options (docs/SECURITY.md): ``--tls-ca FILE`` (env ``RAFTMQ_TLS_CA``) speaks TLS,
``--credentials FILE`` (env ``RAFTMQ_CREDENTIALS``; JSON, mode 0600) or ``--access-key`` /
``--secret-key`` sign every call; ``--tls-cert`` / ``--tls-key`` present a client
certificate. A local secure group (``mqcluster up``) prints the two exports to use.

Exit codes: 0 ok; 1 a failed operation (one line on stderr with the broker's or NameServer's
stable code); 2 bad usage (unknown command, missing or malformed flag: argparse's usage);
3 the command ran and found something an operator must look at (``replicaStatus``: a member
repairing, chains that differ, damage counters, a member not answering).
"""

from __future__ import annotations

import argparse
import functools
import json
import logging
import os
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

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
from mqerrors import codes as E
from mqrelease import FEATURE_LEVEL
from mqsecurity.errors import SecurityError
from mqsecurity.options import OPTION_SPECS, security_from_args

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


def parse_timestamp(value: str) -> int:
    if value == "now":
        return int(time.time() * 1000)
    try:
        ts = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a timestamp in ms or 'now': {value!r}") from None
    if ts < 0:
        raise argparse.ArgumentTypeError(f"negative timestamp: {value}")
    return ts


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


def cmd_update_topic(admin: MQAdmin, args: argparse.Namespace, out: Output) -> None:
    if args.cluster:
        names = [c.name for c in admin.cluster_info().clusters]
        if args.cluster not in names:
            raise MQClientError(
                E.CLUSTER_NOT_FOUND, "NOT_FOUND", f"no cluster {args.cluster!r}; known: {names}"
            )
    groups = admin.create_topic(
        args.topic,
        cluster=args.cluster,
        read_queues=args.read_queues,
        write_queues=args.write_queues,
        perm=args.perm,
        message_type=args.message_type or "",
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
    groups = admin.delete_topic(args.topic)
    out.table([{"broker": g, "topic": args.topic, "deleted": True} for g in groups])


def cmd_topic_list(admin: MQAdmin, args: argparse.Namespace, out: Output) -> None:
    topics = admin.topic_list()
    if out.as_json:
        print(json.dumps(topics))
    else:
        print("\n".join(topics) if topics else "(none)")


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
    rows = [
        {
            "broker": s.broker_name,
            "queue": s.queue_id,
            "min_offset": s.min_offset,
            "max_offset": s.max_offset,
        }
        for s in admin.topic_status(args.topic)
    ]
    out.table(rows)


def cmd_cluster_list(admin: MQAdmin, args: argparse.Namespace, out: Output) -> None:
    rows = []
    for c in admin.cluster_info().clusters:
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


def cmd_broker_status(admin: MQAdmin, args: argparse.Namespace, out: Output) -> None:
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
    progress = admin.consumer_progress(args.group, args.topic)
    rows = [
        {
            "broker": p.broker_name,
            "queue": p.queue_id,
            "broker_offset": p.broker_offset,
            "consumer_offset": p.consumer_offset,
            "lag": p.lag,
        }
        for p in progress
    ]
    out.table(rows, {"total_lag": sum(p.lag for p in progress)})


def cmd_query_msg_by_key(admin: MQAdmin, args: argparse.Namespace, out: Output) -> None:
    out.table([message_row(m) for m in admin.query_msg_by_key(args.topic, args.key, args.max)])


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
    resets = admin.reset_offset_by_time(args.group, args.topic, args.timestamp)
    out.table(
        [{"broker": r.broker_name, "queue": r.queue_id, "offset": r.offset} for r in resets],
        {"timestamp_ms": args.timestamp},
    )


def cmd_send_message(admin: MQAdmin, args: argparse.Namespace, out: Output) -> None:
    keys = tuple(k for k in (args.keys or "").split(",") if k) if args.keys else ()
    msg = Message(args.topic, args.body.encode(), tags=args.tags, keys=keys)
    with Producer(args.producer_group, admin.namesrv_addr, security=admin.security) as producer:
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


def cmd_consume_message(admin: MQAdmin, args: argparse.Namespace, out: Output) -> None:
    rows: list[Row] = []
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
        for mq in queues:
            offset = 0 if args.offset is None else args.offset
            while len(rows) < args.count:
                res = consumer.pull(mq, offset, min(args.count - len(rows), 32), args.subexpr)
                if res.status == "OFFSET_ILLEGAL" and res.next_begin_offset != offset:
                    offset = res.next_begin_offset
                    continue
                if res.status not in ("FOUND", "NO_MATCHED_MSG"):
                    break
                rows.extend(message_row(m) for m in res.messages)
                if res.next_begin_offset <= offset:
                    break
                offset = res.next_begin_offset
            if len(rows) >= args.count:
                break
    out.table(rows[: args.count])


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

# A handler returns None (exit 0) or its own exit code (EXIT_FLAGGED).
Handler = Callable[[MQAdmin, argparse.Namespace, Output], int | None]
# The command ran but found something an operator must look at (replicaStatus).
EXIT_FLAGGED = 3


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
    p = cli.add(name, help=help_, description=help_)
    p.set_defaults(handler=handler)
    return p


def _topic_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("-t", "--topic", required=True, help="topic name")


def _topic_commands(cli: CommandLine) -> None:
    """Topics and the cluster: RocketMQ's -t, -c, -r, -w, -p, -b (a node's address)."""

    add = functools.partial(_command, cli)
    topic = _topic_flag
    p = add("updateTopic", cmd_update_topic, "create or update a topic on every broker group")
    topic(p)
    p.add_argument(
        "-c",
        "--cluster",
        "--clusterName",
        default="",
        help="cluster name (default: every cluster)",
    )
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

    p = add("deleteTopic", cmd_delete_topic, "delete a topic on every broker group serving it")
    topic(p)
    add("topicList", cmd_topic_list, "list every topic the NameServer routes")
    topic(add("topicRoute", cmd_topic_route, "a topic's route: groups, queues, leader, followers"))
    topic(add("topicStatus", cmd_topic_status, "min and max offset of every queue of a topic"))
    add("clusterList", cmd_cluster_list, "clusters and their broker groups")
    p = add(
        "brokerStatus",
        cmd_broker_status,
        "every node: role, term, address, heartbeat age, release and feature levels",
    )
    p.add_argument("-c", "--cluster", "--clusterName", default="", help="only this cluster")
    p.add_argument(
        "-b", "--broker-addr", "--brokerAddr", default="", help="only the node at host:port"
    )


def _query_commands(cli: CommandLine) -> None:
    """Offsets and lookups: RocketMQ's -g, -t, -k, -i, -s."""

    add = functools.partial(_command, cli)
    topic = _topic_flag
    p = add("consumerProgress", cmd_consumer_progress, "a consumer group's offsets and lag")
    p.add_argument("-g", "--group", required=True, help="consumer group")
    topic(p)

    p = add("queryMsgByKey", cmd_query_msg_by_key, "messages of a topic with a key")
    topic(p)
    p.add_argument("-k", "--key", "--msgKey", dest="key", required=True)
    p.add_argument("-m", "--max", type=int, default=32, help="at most this many (default 32)")

    p = add("queryMsgById", cmd_query_msg_by_id, "a message by uniq id or offsetMsgId")
    topic(p)
    p.add_argument(
        "-i", "--id", "--msgId", dest="id", required=True, help="msg id (uniq) or offset msg id"
    )

    p = add("resetOffsetByTime", cmd_reset_offset_by_time, "reset a group's offsets to a time")
    p.add_argument("-g", "--group", required=True, help="consumer group")
    topic(p)
    p.add_argument(
        "-s", "--timestamp", required=True, type=parse_timestamp, help="ms since epoch, or now"
    )


def _message_commands(cli: CommandLine) -> None:
    """Sending, consuming, dead letters: RocketMQ's -t, -p, -k, -c, -b, -i, -o, -g."""

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
    p.add_argument("--producer-group", default=DEFAULT_PRODUCER_GROUP)

    p = add("consumeMessage", cmd_consume_message, "pull messages and print them (no commit)")
    topic(p)
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
        default=32,
        help="at most this many (default 32)",
    )
    p.add_argument("-s", "--subexpr", default="*", help="tag expression (default *)")

    p = add("dlqList", cmd_dlq_list, "a consumer group's dead letters (%%DLQ%%{group})")
    p.add_argument("-g", "--group", required=True, help="consumer group")
    p.add_argument("-c", "--count", type=int, default=1000, help="at most this many (1000)")
    p = add("dlqResend", cmd_dlq_resend, "resend dead letters to their original topics")
    p.add_argument("-g", "--group", required=True, help="consumer group")
    p.add_argument("-i", "--id", default="", help="only this msg id (default: all)")


def _member_target(p: argparse.ArgumentParser) -> None:
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument(
        "-b", "--broker", "--brokerName", dest="broker", default="", help="broker group name"
    )
    where.add_argument(
        "-a",
        "--broker-addr",
        "--brokerAddr",
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
        dest="peer_addr",
        required=True,
        help="its Raft host:port",
    )
    p.add_argument(
        "-c",
        "--client-addr",
        "--clientAddr",
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
        "--retry-policy",
        "--retryPolicy",
        dest="retry_policy",
        type=_retry_policy,
        default=None,
        help='RocketMQ\'s groupRetryPolicy JSON, e.g. {"type":"CUSTOMIZED",'
        '"customizedRetryPolicy":{"next":[1000,5000]}} (default: 1s 5s 10s 30s 1m .. 2h)',
    )
    _where(p)
    p = add(
        "deleteSubGroup",
        cmd_delete_sub_group,
        "delete a consumer group's config (it takes the defaults; offsets stay)",
    )
    p.add_argument("-g", "--group", "--groupName", required=True, help="consumer group")
    _where(p)
    p = add("getConsumerConfig", cmd_get_consumer_config, "consumer groups' config")
    p.add_argument("-g", "--group", "--groupName", default="", help="only this group")
    _where(p)


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
    args = parser.parse_args(argv)  # exits 2 with usage on a bad command line
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
