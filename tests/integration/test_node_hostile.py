"""Issue 16 on a real group: a failing apply ends its node at once (fail fast), and a forged
peer stream costs no acknowledged send and no availability."""

from __future__ import annotations

import os
import re
import signal
import threading
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

import grpc
import pytest
from raftmq.dledger.v1 import dledger_pb2_grpc as pb_grpc
from support import wait_for

from dledger.core import AppendRequest
from dledger.log import Entry
from dledger.server.client import ClientError, LogClient
from dledger.server.convert import to_pb
from mqcluster.cluster import LocalCluster
from prockit.fatal import EXIT_FATAL

pytestmark = pytest.mark.integration

# The must-show bound: from the fault to the end of the process.
FATAL_EXIT_BOUND_S = 1.0
# Applies the restarted node does before its failpoint fires (its catch-up is one or two).
APPLY_HITS_BEFORE_FAULT = 4
_FATAL_LINE = re.compile(
    r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) CRITICAL \S+ FATAL component=apply cause=.*"
    r"FailpointError",
    re.MULTILINE,
)


def _append_ok(client: LogClient, body: bytes) -> bool:
    try:
        client.append([body])
    except ClientError:
        return False
    return True


def _bodies(client: LogClient, addr: str) -> set[bytes]:
    try:
        return {e.body for e in client.read_all(addr) if e.type == 0}
    except ClientError:
        return set()


def test_failing_apply_ends_the_node_within_a_second(
    local_group: Callable[..., LocalCluster],
) -> None:
    cluster = local_group(3)
    leader = cluster.wait_leader()
    victim = next(n for n in cluster.nodes if n.node_id != leader)
    cluster.signal(victim.node_id, signal.SIGKILL)
    cluster.node_env[victim.node_id] = {
        "RAFTMQ_FAILPOINTS": f"apply=raise@{APPLY_HITS_BEFORE_FAULT}"
    }
    pid = cluster.start(victim.node_id)
    ended: list[tuple[float, int]] = []

    def reap() -> None:
        # Our child: wait for it here, blocking (cluster.pid() would reap it and lose the
        # status), and note the moment it ended.
        _, raw = os.waitpid(pid, 0)
        ended.append((time.time(), os.waitstatus_to_exitcode(raw)))

    threading.Thread(target=reap, daemon=True).start()
    sent = 0
    with cluster.client() as client:
        deadline = time.monotonic() + 60
        while not ended and time.monotonic() < deadline:
            if _append_ok(client, b"before-%d" % sent):
                sent += 1
            time.sleep(0.02)
        assert ended, f"{victim.node_id} still alive after {sent} appends"
        gone_at, status = ended[0]
        assert status == EXIT_FATAL
        log = Path(victim.log).read_text(errors="replace")
        match = _FATAL_LINE.search(log)
        assert match is not None, log[-3000:]
        assert len(_FATAL_LINE.findall(log)) == 1
        logged_at = datetime.strptime(match.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
        # The FATAL line is written where the fault is caught, so it dates the fault.
        assert gone_at - logged_at < FATAL_EXIT_BOUND_S, (gone_at, logged_at)
        # The other two keep serving: writes commit and both hold them.
        others = [n for n in cluster.nodes if n.node_id != victim.node_id]
        after = [b"after-%d" % i for i in range(20)]
        for body in after:
            wait_for(lambda b=body: _append_ok(client, b), 15, f"append of {body!r}")
        for n in others:
            wait_for(
                lambda a=n.client_addr: set(after) <= _bodies(client, a),
                15,
                f"{n.node_id} to hold the appends made after the fault",
            )


def test_forged_peer_stream_costs_no_acked_send(local_group: Callable[..., LocalCluster]) -> None:
    """The issue's first finding, end to end: a stream to a follower's peer port with the
    group's headers claims the leader's id and term and carries entries beyond the leader's
    last index with a commit index covering them. Old code: the leader counted the follower's
    ack beyond its last index and its tick task died on the next heartbeat."""
    cluster = local_group(3)
    leader_id = cluster.wait_leader()
    leader = cluster.node(leader_id)
    follower = next(n for n in cluster.nodes if n.node_id != leader_id)
    with cluster.client() as client:
        for i in range(5):
            wait_for(lambda i=i: _append_ok(client, b"seed-%d" % i), 15, "seed appends")
        md = client.metadata(leader.client_addr)
        term, last = md.term, md.last_index
        # The forged append follows the leader's last entry: a follower still behind it (a
        # send commits with the other follower) would refuse it as a gap, and ack nothing.
        wait_for(
            lambda: client.metadata(follower.client_addr).last_index >= last,
            15,
            "the follower to hold the leader's last entry",
        )
        forged = AppendRequest(
            leader_id,
            follower.node_id,
            term,
            last,
            term,
            (Entry(term, last + 1, b"forged-1"), Entry(term, last + 2, b"forged-2")),
            last + 2,
        )
        metadata = (
            ("x-raftmq-group", cluster.group),
            ("x-raftmq-from", leader_id),
            ("x-raftmq-client-addr", "203.0.113.66:1"),
        )
        with grpc.insecure_channel(f"127.0.0.1:{follower.peer_port}") as ch:
            pb_grpc.DLedgerPeerStub(ch).Stream(
                iter([to_pb(forged, cluster.group)]), metadata=metadata, timeout=5
            )
        # The fooled follower acks index last + 2 to the real leader. Wait for the leader to
        # drop it before the next send: a send that raised the leader's last index first would
        # make the ack no longer "beyond the last index" (and the run a race).
        wait_for(
            lambda: "drop reason=ack_beyond_last" in Path(leader.log).read_text(errors="replace"),
            15,
            "the leader to drop the forged follower's ack",
        )
        # The leader keeps leading (its tick task lives: heartbeats go on) and acks sends.
        acked = []
        for i in range(30):
            body = b"after-%d" % i
            wait_for(lambda b=body: _append_ok(client, b), 15, f"append of {body!r}")
            acked.append(body)
        assert cluster.wait_leader(10) == leader_id
        # Every acknowledged send is held by a majority (the leader and the honest follower).
        honest = [n for n in cluster.nodes if n.node_id != follower.node_id]
        for n in honest:
            wait_for(
                lambda a=n.client_addr: set(acked) <= _bodies(client, a),
                15,
                f"{n.node_id} to hold every acknowledged send",
            )
        # A new term (the leader steps aside) still commits, and the group is still one.
        client.transfer_leadership(next(n.node_id for n in honest if n.node_id != leader_id))
        wait_for(lambda: _append_ok(client, b"final"), 15, "an append under the new leader")
    log = Path(leader.log).read_text(errors="replace")
    assert "drop reason=ack_beyond_last" in log
    assert "Traceback" not in log, log[-3000:]
