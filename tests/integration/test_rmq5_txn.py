"""RocketMQ 5 transactional messages on a real 3-node group (docs/RMQ5.md, "Transactional
messages"): the official Python and Node.js producers commit one half message, roll back one
and leave one open, which their checker commits when the group checks it back; a half whose
leader is SIGKILLed before the commit is committed through the new leader and delivered exactly
once on every member; hostile EndTransactions get their status and change nothing."""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from rmq5_support import (
    NODE_MODULES,
    PYTHON,
    SCRIPTS,
    ClientProcess,
    client_env,
    running_group,
    topic_on_every_node,
)
from rmq5_support import code as _code
from rmq5_support import follower_v2_addr as _follower_v2_addr
from support import pull_all, wait_for

from broker.frontends.v2 import stubs
from mqcluster.cluster import LocalCluster

pytestmark = [pytest.mark.integration]

v2, v2_service, v2_grpc = stubs.load()

QUEUES = 2
# transactionTimeOut / transactionCheckInterval / transactionCheckMax: short, so that the
# check-back comes within seconds (RocketMQ's 6 s / 30 s / 15 in production).
IMMUNITY_MS = 2000
CHECK_INTERVAL_MS = 2000
CHECK_MAX = 3
CLIENT_TIMEOUT_S = 60
CALL_TIMEOUT_S = 10


@pytest.fixture(scope="module")
def group(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    extra = {
        "transactionTimeOut": str(IMMUNITY_MS),
        "transactionCheckInterval": str(CHECK_INTERVAL_MS),
        "transactionCheckMax": str(CHECK_MAX),
    }
    with running_group(tmp_path_factory.mktemp("rmq5t"), extra) as cluster:
        yield cluster


def _topic(cluster: LocalCluster, name: str) -> str:
    return topic_on_every_node(cluster, name, QUEUES)


def _visible(addr: str, topic: str) -> list[Any]:
    """Every message of ``topic`` the node at ``addr`` serves (raftmq's own pull)."""
    return [m for q in range(QUEUES) for m in pull_all(addr, topic, q)]


def _count(addr: str, topic: str) -> int:
    """How many messages of ``topic`` the node at ``addr`` serves (-1: it does not answer yet)."""
    try:
        return len(_visible(addr, topic))
    except grpc.RpcError:
        return -1


def _bodies(addr: str, topic: str) -> list[str]:
    return sorted(m.body.decode() for m in _visible(addr, topic))


def _start(argv: list[str], home: Path, node: bool) -> ClientProcess:
    """A client script, its output in files in ``home`` (a chatty client never blocks on a full
    pipe while the test waits for the check-back); its stdin a pipe."""
    return ClientProcess(argv, home, client_env(home, node=node), stdin=True)


def _read_until(client: ClientProcess, sent: int) -> None:
    """Return once the script reported ``sent`` half messages."""
    client.wait_lines(
        lambda lines: sum(e.get("event") == "sent" for e in lines) >= sent, CLIENT_TIMEOUT_S
    )


def _finish(client: ClientProcess, say: str = "") -> list[Any]:
    """Say ``say`` (then close stdin), wait for the script's end; all its lines but ``done``."""
    if say:
        client.say(say)
    return client.finish(CLIENT_TIMEOUT_S)


def _sent(lines: list[Any]) -> dict[str, Any]:
    return {e["body"]: e for e in lines if e.get("event") == "sent"}


def test_commit_rollback_and_a_check_back_answered_with_commit(
    group: LocalCluster, tmp_path: Path
) -> None:
    assert PYTHON.exists(), "build/rmq5/pyclient missing: run 'make venv'"
    assert (NODE_MODULES / "rocketmq-client-nodejs").exists(), "build/rmq5/node: run 'make venv'"
    addr = _follower_v2_addr(group)
    runs = {
        "py": [str(PYTHON), str(SCRIPTS / "py_txn.py"), addr, _topic(group, "TxPy"), "py", "all"],
        "nd": ["node", str(SCRIPTS / "node_txn.js"), addr, _topic(group, "TxNd"), "nd", "all"],
    }
    procs = {lang: _start(argv, tmp_path, lang == "nd") for lang, argv in runs.items()}
    try:
        for p in procs.values():
            _read_until(p, 3)
        leader_addr = group.node(group.wait_leader()).client_addr
        want = {lang: sorted([f"{lang}-check-commit", f"{lang}-commit"]) for lang in procs}
        # The open half becomes visible only when the group asked the producer (after the
        # immunity time) and its checker answered COMMIT.
        wait_for(
            lambda: all(
                _bodies(leader_addr, f"Tx{lang.capitalize()}") == want[lang] for lang in procs
            ),
            CLIENT_TIMEOUT_S,
            "the committed and the checked-back halves",
        )
        lines = {lang: _finish(p) for lang, p in procs.items()}
    finally:
        for p in procs.values():
            p.kill()
    for lang, events in lines.items():
        sent = _sent(events)
        checked = [e["body"] for e in events if e.get("event") == "checked"]
        assert f"{lang}-check-commit" in checked, events
        visible = _visible(leader_addr, f"Tx{lang.capitalize()}")
        assert sorted(m.body.decode() for m in visible) == want[lang]  # once each, none rolled back
        for m in visible:
            s = sent[m.body.decode()]
            assert "01" + m.msg_id == s["message_id"] and len(s["transaction_id"]) == 16
            assert m.tags == "tx" and m.properties["kind"] == m.body.decode().split("-")[-1]
            assert not {"TRAN_MSG", "REAL_TOPIC", "REAL_QID"} & set(m.properties)


def _half(stub: Any, topic: str, uniq: str, kind: int = v2.TRANSACTION, **props: str) -> Any:
    msg = _message(topic, uniq, kind, **props)
    return stub.SendMessage(v2_service.SendMessageRequest(messages=[msg]), timeout=CALL_TIMEOUT_S)


def _message(topic: str, uniq: str, kind: int = v2.TRANSACTION, **props: str) -> Any:
    return v2.Message(
        topic=v2.Resource(name=topic),
        user_properties=props,
        system_properties=v2.SystemProperties(
            message_id="01" + uniq, message_type=kind, body_encoding=v2.IDENTITY
        ),
        body=b"raw-" + uniq.encode(),
    )


def _end(stub: Any, topic: str, message_id: str, txn: str, resolution: int = v2.COMMIT) -> str:
    resp = stub.EndTransaction(
        v2_service.EndTransactionRequest(
            topic=v2.Resource(name=topic),
            message_id=message_id,
            transaction_id=txn,
            resolution=resolution,
            source=v2.SOURCE_CLIENT,
        ),
        timeout=CALL_TIMEOUT_S,
    )
    return _code(resp.status)


def test_hostile_end_transactions_change_nothing(group: LocalCluster) -> None:
    raw, other = _topic(group, "TxRaw"), _topic(group, "TxRaw2")
    leader_addr = group.node(group.wait_leader()).client_addr
    with grpc.insecure_channel(_follower_v2_addr(group)) as ch:
        stub = v2_grpc.MessagingServiceStub(ch)
        a_id, b_id = "A1" * 16, "B2" * 16
        a = _half(stub, raw, a_id)
        b = _half(stub, other, b_id)
        assert _code(a.status) == _code(b.status) == "OK"
        ta, tb = a.entries[0].transaction_id, b.entries[0].transaction_id
        assert len(ta) == len(tb) == 16 and ta != tb
        again = _half(stub, raw, a_id)  # a retried half send: the same transaction
        assert again.entries[0].transaction_id == ta
        for topic, mid, txn, res, code in (
            (raw, "01" + a_id, "7" + "F" * 15, v2.COMMIT, "INVALID_TRANSACTION_ID"),  # unknown
            (raw, "01" + a_id, tb, v2.COMMIT, "INVALID_TRANSACTION_ID"),  # another's id
            (other, "01" + a_id, ta, v2.COMMIT, "INVALID_TRANSACTION_ID"),  # another topic
            (raw, "01" + b_id, ta, v2.COMMIT, "INVALID_TRANSACTION_ID"),  # another message
            (raw, "01" + a_id, "xyz", v2.COMMIT, "INVALID_TRANSACTION_ID"),  # malformed
            (raw, "not-an-id", ta, v2.COMMIT, "ILLEGAL_MESSAGE_ID"),
            (raw, "01" + a_id, ta, v2.TRANSACTION_RESOLUTION_UNSPECIFIED, "BAD_REQUEST"),
            ("bad topic!", "01" + a_id, ta, v2.COMMIT, "ILLEGAL_TOPIC"),
        ):
            assert _end(stub, topic, mid, txn, res) == code, (topic, mid, txn, res)
        assert _visible(leader_addr, raw) == _visible(leader_addr, other) == []
        # Refused sends: a user property the broker reserves, two halves in one send.
        spoof = _half(stub, raw, "C3" * 16, v2.NORMAL, TRAN_MSG="true")
        assert _code(spoof.status) == "ILLEGAL_MESSAGE_PROPERTY_KEY"
        two = v2_service.SendMessageRequest(messages=[_message(raw, "D4" * 16)] * 2)
        assert _code(stub.SendMessage(two, timeout=CALL_TIMEOUT_S).status) == "BAD_REQUEST"
        # The rightful verdicts: idempotent, and a contrary one refused.
        assert _end(stub, raw, "01" + a_id, ta, v2.ROLLBACK) == "OK"
        assert _end(stub, raw, "01" + a_id, ta, v2.ROLLBACK) == "OK"
        assert _end(stub, raw, "01" + a_id, ta, v2.COMMIT) == "INVALID_TRANSACTION_ID"
        assert _end(stub, other, "01" + b_id, tb) == "OK"
        assert _end(stub, other, "01" + b_id, tb) == "OK"
    assert _visible(leader_addr, raw) == []
    assert [m.msg_id for m in _visible(leader_addr, other)] == [b_id]


def test_commit_through_a_new_leader_after_a_sigkill_is_delivered_once(
    group: LocalCluster, tmp_path: Path
) -> None:
    topic = _topic(group, "TxFail")
    argv = [
        str(PYTHON),
        str(SCRIPTS / "py_txn.py"),
        _follower_v2_addr(group),
        topic,
        "fo",
        "failover",
    ]
    with _start(argv, tmp_path, node=False) as proc:
        _read_until(proc, 1)
        old = group.wait_leader()
        group.signal(old, signal.SIGKILL)
        killed_at = time.monotonic()
        lines = _finish(proc, "go\n")
    new = group.wait_leader(exclude=old)
    sent = _sent(lines)["fo-failover"]
    ended = [e for e in lines if e.get("event") == "ended"]
    assert ended and time.monotonic() - killed_at < CLIENT_TIMEOUT_S
    live = [n for n in group.nodes if n.node_id != old]
    for n in live:
        wait_for(lambda a=n.client_addr: _count(a, topic) == 1, 10, f"the copy on {n.node_id}")
    # The killed member, restarted, applies the same log: one copy there too.
    group.start(old)
    old_addr = group.node(old).client_addr
    wait_for(lambda: _count(old_addr, topic) == 1, 30, "the copy on the restarted member")
    for n in group.nodes:
        [m] = _visible(n.client_addr, topic)
        assert "01" + m.msg_id == sent["message_id"] and m.body == b"fo-failover"
    assert new != old
