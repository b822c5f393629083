"""Workloads: clients that write unique integers and read them back, recording every operation.

- ``queue``: producers send values to the queues of one topic (value ``v`` goes to queue
  ``v % queues`` through a selector, so its retries stay there); pull consumers read their
  queues during the run; after heal a final drain reads every queue from offset 0.
- ``log``: writers append raw entries (``jepsen:{v}``) to the replicated log with
  :class:`LogClient`; a reader follows the committed log; the drain reads the whole log.

Clients go through the proxies (NameServer routes and redirects name the proxy ports); the
drain and the replica state are read directly from the nodes, after heal.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import threading
import time
import zlib
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import grpc
from raftmq.broker.v1 import broker_pb2 as bpb
from raftmq.broker.v1 import broker_pb2_grpc as bpb_grpc
from raftmq.dledger.v1 import dledger_pb2 as dpb
from raftmq.dledger.v1 import dledger_pb2_grpc as dpb_grpc

from client import Message, MQAdmin, Producer, PullConsumer
from client.consumer import pulled_messages
from client.errors import MQClientError
from client.message import MessageQueue
from dledger.log import EntryType
from dledger.server.client import ClientError
from jepsen_like.checker import NodeState
from jepsen_like.cluster import JepsenCluster
from jepsen_like.history import MONITOR, History, OpType
from mqcluster.cluster import ClusterError
from mqerrors import codes as E
from mqerrors import table
from mqsecurity.channels import open_channel

logger = logging.getLogger(__name__)

TOPIC = "jepsen"
LOG_PREFIX = b"jepsen:"
# Failure codes after which the write certainly did not happen (the error table's outcome
# "definite"; everything else: unknown), unless the error says an attempt's outcome is unknown
# (the clients retry internally: a NOT_LEADER after a timed-out attempt is no proof the write
# did not happen).
DEFINITE_FAILURE_CODES = table.codes(outcome=table.Outcome.DEFINITE)
# Client-side deadline of one send/append (the broker's own is rpcTimeoutMs = 3 s).
WRITE_TIMEOUT_S = 4.0
# Messages per pull / entries per Get.
READ_BATCH = 64
GET_BATCH = 500
# Seconds a reader sleeps when nothing new came (the writers keep it busy otherwise).
IDLE_READ_S = 0.05
# Seconds a thread gets to finish after stop().
JOIN_S = 15.0
# Seconds the final drain may take, including retries while a node is slow.
DRAIN_S = 60.0
# Seconds between the monitor's polls of every node.
MONITOR_PERIOD_S = 0.25
# Seconds of a Metadata poll by the monitor (a paused node must not hold it up).
MONITOR_RPC_TIMEOUT_S = 0.3
# Seconds of the calls that read a node's state after heal, and between convergence checks.
AUDIT_METADATA_TIMEOUT_S = 2.0
AUDIT_RPC_TIMEOUT_S = 10.0
CONVERGE_POLL_S = 0.2
# Messages per pull when a node's ConsumeQueues are read for the replica check.
AUDIT_PULL_BATCH = 256
# Pages of one drain / replica read (each page up to READ_BATCH or GET_BATCH items).
MAX_PAGES = 100_000


class Workload(Protocol):
    name: str

    def setup(self) -> None: ...
    def start(self) -> None: ...
    def stop(self) -> None: ...
    def drain(self, deadline_mono: float) -> None: ...
    def consume_queues(self, node_id: str) -> dict[str, list[tuple[int, str]]]: ...


class _Base:
    name = ""

    def __init__(
        self, cluster: JepsenCluster, history: History, writers: int, rate_hz: float
    ) -> None:
        self.cluster = cluster
        self.history = history
        self.n_writers = writers
        self.period_s = 1.0 / rate_hz if rate_hz > 0 else 0.0
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._values = itertools.count(1)
        self._values_lock = threading.Lock()

    def next_value(self) -> int:
        with self._values_lock:
            return next(self._values)

    def _spawn(self, name: str, fn: Callable[[], None]) -> None:
        def run() -> None:
            try:
                fn()
            except Exception:
                logger.exception("%s crashed", name)

        t = threading.Thread(target=run, name=f"jepsen-{name}", daemon=True)
        self._threads.append(t)
        t.start()

    def stop(self) -> None:
        self._stop.set()
        deadline = time.monotonic() + JOIN_S
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))
        alive = [t.name for t in self._threads if t.is_alive()]
        if alive:
            logger.warning("workload threads still running after %s s: %s", JOIN_S, alive)

    def _pace(self, started: float) -> None:
        rest = self.period_s - (time.monotonic() - started)
        if rest > 0:
            self._stop.wait(rest)

    def _complete(self, process: str, f: str, value: dict[str, Any], exc: BaseException) -> None:
        code = getattr(exc, "code", "") or type(exc).__name__
        unknown = getattr(exc, "outcome_unknown", True)  # an error that cannot say: unknown
        kind: OpType = "fail" if code in DEFINITE_FAILURE_CODES and not unknown else "info"
        self.history.add(process, kind, f, {**value, "error": str(code)})


class _QueueSelector:
    def select(self, queues: Sequence[MessageQueue], msg: Message, arg: Any) -> MessageQueue:
        for q in queues:
            if q.queue_id == arg:
                return q
        raise MQClientError.local(E.NO_ROUTE, f"queue {arg} not in the route")


class QueueWorkload(_Base):
    name = "queue"

    def __init__(
        self,
        cluster: JepsenCluster,
        history: History,
        writers: int = 4,
        readers: int = 2,
        queues: int = 4,
        rate_hz: float = 40.0,
    ) -> None:
        super().__init__(cluster, history, writers, rate_hz)
        self.n_readers = readers
        self.queues = queues

    def setup(self) -> None:
        MQAdmin(self.cluster.namesrv_addr, self.cluster.security).create_topic(
            TOPIC, queues=self.queues
        )

    def start(self) -> None:
        for i in range(self.n_writers):
            self._spawn(f"p{i}", lambda i=i: self._produce(f"p{i}"))  # type: ignore[misc]
        for j in range(self.n_readers):
            mine = [q for q in range(self.queues) if q % self.n_readers == j]
            self._spawn(f"c{j}", lambda j=j, mine=mine: self._consume(f"c{j}", mine))  # type: ignore[misc]

    def _produce(self, process: str) -> None:
        selector = _QueueSelector()
        with Producer(
            f"jepsen-{process}",
            self.cluster.namesrv_addr,
            send_msg_timeout_s=WRITE_TIMEOUT_S,
            security=self.cluster.security,
        ) as producer:
            while not self._stop.is_set():
                started = time.monotonic()
                v = self.next_value()
                value = {"v": v, "queue": v % self.queues}
                self.history.add(process, "invoke", "send", value)
                try:
                    r = producer.send(Message(TOPIC, str(v).encode()), selector, v % self.queues)
                except Exception as exc:
                    self._complete(process, "send", value, exc)
                else:
                    self.history.add(
                        process,
                        "ok",
                        "send",
                        {"v": v, "queue": r.message_queue.queue_id, "offset": r.queue_offset},
                    )
                self._pace(started)

    def _consume(self, process: str, mine: list[int]) -> None:
        consumer = PullConsumer(
            f"jepsen-{process}", self.cluster.namesrv_addr, self.cluster.security
        )
        consumer.start()
        try:
            mqs: list[MessageQueue] = []
            while not mqs and not self._stop.is_set():
                try:
                    mqs = [q for q in consumer.fetch_queues(TOPIC) if q.queue_id in mine]
                except Exception:
                    self._stop.wait(IDLE_READ_S)
            offsets = {mq.queue_id: 0 for mq in mqs}
            while not self._stop.is_set():
                got_any = False
                for mq in mqs:
                    self.history.add(process, "invoke", "poll", {"queue": mq.queue_id})
                    try:
                        res = consumer.pull(mq, offsets[mq.queue_id], READ_BATCH)
                    except Exception as exc:
                        err = getattr(exc, "code", type(exc).__name__)
                        self.history.add(process, "fail", "poll", {"error": str(err)})
                        continue
                    triples = [[m.queue_id, m.queue_offset, _int(m.body)] for m in res.messages]
                    self.history.add(process, "ok", "poll", triples)
                    if res.messages:
                        got_any = True
                        offsets[mq.queue_id] = res.next_begin_offset
                if not got_any:
                    self._stop.wait(IDLE_READ_S)
        finally:
            consumer.shutdown()

    def drain(self, deadline_mono: float) -> None:
        consumer = PullConsumer("jepsen-drain", self.cluster.namesrv_addr, self.cluster.security)
        consumer.start()
        try:
            mqs: list[MessageQueue] = []
            while not mqs and time.monotonic() < deadline_mono:
                try:
                    mqs = consumer.fetch_queues(TOPIC)
                except Exception as exc:
                    logger.warning("drain: no route for %s yet: %s", TOPIC, exc)
                    time.sleep(IDLE_READ_S)
            if len(mqs) != self.queues:
                self.history.add("drain", "invoke", "drain", {"queue": -1})
                self.history.add(
                    "drain", "fail", "drain", {"queue": -1, "error": f"route has {len(mqs)} queues"}
                )
            for mq in mqs:
                self.history.add("drain", "invoke", "drain", {"queue": mq.queue_id})
                triples: list[list[int]] = []
                offset = 0
                error = ""
                for _ in range(MAX_PAGES):
                    if time.monotonic() > deadline_mono:
                        error = "drain deadline passed"
                        break
                    try:
                        res = consumer.pull(mq, offset, READ_BATCH)
                        end = consumer.max_offset(mq)
                    except Exception as exc:
                        error = str(exc)
                        time.sleep(IDLE_READ_S)
                        continue
                    error = ""
                    triples += [[m.queue_id, m.queue_offset, _int(m.body)] for m in res.messages]
                    if res.messages:
                        offset = res.next_begin_offset
                    elif offset >= end:
                        break
                    else:
                        time.sleep(IDLE_READ_S)
                if error:
                    self.history.add(
                        "drain", "fail", "drain", {"queue": mq.queue_id, "error": error}
                    )
                else:
                    self.history.add("drain", "ok", "drain", triples)
        finally:
            consumer.shutdown()

    def consume_queues(self, node_id: str) -> dict[str, list[tuple[int, str]]]:
        """Every message of every queue as this node's ConsumeQueue has it (read directly)."""
        addr = self.cluster.node(node_id).client_addr
        out: dict[str, list[tuple[int, str]]] = {}
        with open_channel(addr, self.cluster.security) as ch:
            stub = bpb_grpc.BrokerStub(ch)
            for q in range(self.queues):
                rows: list[tuple[int, str]] = []
                offset = 0
                for _ in range(MAX_PAGES):
                    resp = stub.PullMessage(
                        bpb.PullMessageRequest(
                            consumer_group="jepsen-audit",
                            topic=TOPIC,
                            queue_id=q,
                            queue_offset=offset,
                            max_msgs=AUDIT_PULL_BATCH,
                            no_suspend=True,
                        ),
                        timeout=AUDIT_RPC_TIMEOUT_S,
                    )
                    pulled = pulled_messages(resp, node_id)
                    if not pulled:
                        break
                    rows += [(m.queue_offset, m.msg_id) for m in pulled]
                    offset = resp.next_begin_offset
                out[f"{TOPIC}/{q}"] = rows
        return out


class LogWorkload(_Base):
    name = "log"

    def __init__(
        self, cluster: JepsenCluster, history: History, writers: int = 4, rate_hz: float = 40.0
    ) -> None:
        super().__init__(cluster, history, writers, rate_hz)

    def setup(self) -> None:
        pass

    def start(self) -> None:
        for i in range(self.n_writers):
            self._spawn(f"w{i}", lambda i=i: self._append(f"w{i}"))  # type: ignore[misc]
        self._spawn("r0", lambda: self._read("r0"))

    def _append(self, process: str) -> None:
        with self.cluster.proxied_client(WRITE_TIMEOUT_S) as client:
            while not self._stop.is_set():
                started = time.monotonic()
                v = self.next_value()
                value = {"v": v, "queue": 0}
                self.history.add(process, "invoke", "append", value)
                try:
                    r = client.append([LOG_PREFIX + str(v).encode()])
                except Exception as exc:
                    self._complete(process, "append", value, exc)
                else:
                    self.history.add(
                        process, "ok", "append", {"v": v, "queue": 0, "offset": r.first_index}
                    )
                self._pace(started)

    def _read(self, process: str) -> None:
        next_index = 1
        with self.cluster.proxied_client(WRITE_TIMEOUT_S) as client:
            while not self._stop.is_set():
                self.history.add(process, "invoke", "read", {"index": next_index})
                try:
                    addr = client.find_leader() or client.addrs[0]
                    entries, _commit = client.get(addr, next_index, max_count=GET_BATCH)
                except Exception as exc:
                    err = getattr(exc, "code", type(exc).__name__)
                    self.history.add(process, "fail", "read", {"error": str(err)})
                    self._stop.wait(IDLE_READ_S)
                    continue
                triples = [
                    [0, e.index, _int(e.body[len(LOG_PREFIX) :])]
                    for e in entries
                    if e.type == EntryType.NORMAL and e.body.startswith(LOG_PREFIX)
                ]
                self.history.add(process, "ok", "read", triples)
                if entries:
                    next_index = entries[-1].index + 1
                else:
                    self._stop.wait(IDLE_READ_S)

    def drain(self, deadline_mono: float) -> None:
        self.history.add("drain", "invoke", "drain", {"queue": 0})
        error = "no leader to drain from"
        with self.cluster.direct_client() as client:
            while time.monotonic() < deadline_mono:
                leader = self.cluster.leader(client)
                if leader is None:
                    time.sleep(IDLE_READ_S)
                    continue
                try:
                    entries = read_entries(client, self.cluster.node(leader).client_addr)
                except ClientError as exc:
                    error = str(exc)
                    time.sleep(IDLE_READ_S)
                    continue
                triples = [
                    [0, e.index, _int(e.body[len(LOG_PREFIX) :])]
                    for e in entries
                    if e.type == EntryType.NORMAL and e.body.startswith(LOG_PREFIX)
                ]
                self.history.add("drain", "ok", "drain", triples)
                return
        self.history.add("drain", "fail", "drain", {"queue": 0, "error": error})

    def consume_queues(self, node_id: str) -> dict[str, list[tuple[int, str]]]:
        return {}


def _int(body: bytes) -> int:
    """A value from a message body; -1 (never sent, so *unexpected*) when it is not one."""
    try:
        return int(body.decode())
    except (UnicodeDecodeError, ValueError):
        return -1


def read_entries(client: Any, addr: str, upto: int | None = None) -> list[Any]:
    """Committed entries of ``addr`` from index 1 (up to ``upto``), paging through Get."""
    out: list[Any] = []
    index = 1
    for _ in range(MAX_PAGES):
        entries, commit = client.get(addr, index, max_count=GET_BATCH)
        if upto is not None:
            entries = [e for e in entries if e.index <= upto]
        out.extend(entries)
        if not entries:
            break
        index = entries[-1].index + 1
        if index > (upto if upto is not None else commit):
            break
    return out


def entry_checksum(term: int, type_: int, body: bytes) -> int:
    return zlib.crc32(body, zlib.crc32(f"{term}:{type_}:".encode()))


class Monitor:
    """Polls every running node's role and term into the history (for the leaders checker)."""

    def __init__(self, cluster: JepsenCluster, history: History) -> None:
        self.cluster = cluster
        self.history = history
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="jepsen-monitor", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(JOIN_S)

    def _run(self) -> None:
        with self.cluster.direct_client() as client:
            while not self._stop.wait(MONITOR_PERIOD_S):
                for nid in self.cluster.ids:
                    if nid in self.cluster.paused:
                        continue
                    try:
                        addr = self.cluster.node(nid).client_addr
                    except ClusterError:
                        continue  # the membership nemesis removed it meanwhile
                    try:
                        md = client.metadata(addr, timeout_s=MONITOR_RPC_TIMEOUT_S)
                    except ClientError:
                        continue
                    self.history.add(
                        MONITOR,
                        "ok",
                        "state",
                        {
                            "node": nid,
                            "role": md.role,
                            "term": md.term,
                            "commit": md.commit_index,
                            "repairing": md.repairing,
                        },
                    )


def converge(cluster: JepsenCluster, timeout_s: float) -> str:
    """Wait until every node has the leader's last index committed and applied, and none is
    repairing (docs/RAFT.md section 11); "" or why not."""
    deadline = time.monotonic() + timeout_s
    why = "no leader"
    with cluster.direct_client() as client:
        while time.monotonic() < deadline:
            try:
                mds = {
                    n: client.metadata(cluster.node(n).client_addr, AUDIT_METADATA_TIMEOUT_S)
                    for n in cluster.ids
                }
            except ClientError as exc:
                why = f"a node does not answer: {exc}"
                time.sleep(CONVERGE_POLL_S)
                continue
            leaders = [md for md in mds.values() if md.role == "LEADER"]
            if len(leaders) == 1:
                target = leaders[0].last_index
                lag = {
                    n: (md.commit_index, md.applied_index)
                    for n, md in mds.items()
                    if md.commit_index != target or md.applied_index != target
                }
                repairing = sorted(n for n, md in mds.items() if md.repairing)
                if not lag and not repairing:
                    return ""
                why = (
                    f"nodes behind the leader's last index {target}: {lag}"
                    if lag
                    else f"nodes still repairing: {repairing}"
                )
            time.sleep(CONVERGE_POLL_S)
    return why


def node_states(cluster: JepsenCluster, workload: Workload) -> list[NodeState]:
    """Every node's entry checksums up to the lowest commit index among the nodes (entries
    may still be committing while the nodes are read one by one: consumer offsets, a new
    leader's no-op), its chained checksum there, its ConsumeQueues, its role, repair state
    and whether the group's configuration has it as a voter."""
    out = []
    with cluster.direct_client() as client:
        commits = []
        for nid in cluster.ids:
            with contextlib.suppress(ClientError):
                md = client.metadata(cluster.node(nid).client_addr, AUDIT_METADATA_TIMEOUT_S)
                commits.append(md.commit_index)
        upto = min(commits, default=0)
        voters = _voters(cluster, client)
        for nid in cluster.ids:
            addr = cluster.node(nid).client_addr
            try:
                md = client.metadata(addr, AUDIT_METADATA_TIMEOUT_S)
                chain = _chain_at(cluster, addr, upto)
                entries = read_entries(client, addr, upto)
                sums = [(e.index, e.term, entry_checksum(e.term, e.type, e.body)) for e in entries]
                cqs = workload.consume_queues(nid)
                out.append(
                    NodeState(
                        nid,
                        md.commit_index,
                        md.last_index,
                        sums,
                        cqs,
                        role=md.role,
                        repairing=md.repairing,
                        voter=nid in voters,
                        chain_index=upto if chain is not None else 0,
                        chain=chain or 0,
                    )
                )
            except (ClientError, grpc.RpcError) as exc:
                out.append(NodeState(nid, error=str(exc)[:500]))
    return out


def _voters(cluster: JepsenCluster, client: Any) -> set[str]:
    """The voters of the group's configuration, as the leader lists them (empty if no node
    answers: then no node counts as a voter, and a damaged one fails ``repaired``)."""
    for addr in [None, *(cluster.node(nid).client_addr for nid in cluster.ids)]:
        try:
            resp = client.list_members(addr)  # None: the leader's view
        except ClientError:
            continue
        return {m.id for m in resp.members if m.role == "VOTER"}
    return set()


def _chain_at(cluster: JepsenCluster, addr: str, index: int) -> int | None:
    """The node's chained checksum at ``index`` (docs/RAFT.md section 13); None when it does
    not hold that index (or 0 was asked)."""
    if index <= 0:
        return None
    with open_channel(addr, cluster.security) as channel:
        md = dpb_grpc.DLedgerClientStub(channel).Metadata(
            dpb.MetadataRequest(group=cluster.local.group, chain_index=index),
            timeout=AUDIT_METADATA_TIMEOUT_S,
        )
    return int(md.chain) if md.chain_known and md.chain_index == index else None
