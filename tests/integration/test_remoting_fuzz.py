"""Hostile requests to the brokers' remoting ports of a live 3-node group (docs/REMOTING.md,
"Broker"), in the manner of tests/integration/test_fuzz_services.py:

- commands built by hypothesis: every request code the broker serves and others, their header
  fields with boundary integers, huge, empty, ``null`` and unicode values, bodies of random bytes
  and of hostile JSON, on every node (the leader and the followers);
- raw bytes on a fresh connection: frames whose lengths, header types and headers do not decode.

Checked for every answer: its code is in the documented set, a refusal has a remark, and no
answer is an unexpected exception (a SYSTEM_ERROR whose remark starts with INTERNAL). Afterwards:
no process exited, the RSS of every node grew less than :data:`RSS_GROWTH_BOUND_MIB`, the
messages sent before are read back unchanged, and the group still stores a send.
Hypothesis runs derandomized with no example database: the same requests on every run.
"""

from __future__ import annotations

import asyncio
import json
import struct
from collections import Counter
from collections.abc import Iterator

import pytest
from fuzz_support import assert_group_survived, group_rss_mib, raw_exchange
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from rmq5_support import GROUP_CONF
from support import create_topic_on

from mqcluster.cluster import LocalCluster
from remoting.client import RemotingClient
from remoting.codes import RequestCode as Q
from remoting.codes import ResponseCode as R
from remoting.protocol import RemotingCommand

pytestmark = [pytest.mark.integration]

TOPIC = "FuzzRemoting"
QUEUES = 2
EXAMPLES = 300
RAW_EXAMPLES = 60
CALL_TIMEOUT_S = 5.0
# A node's resident memory may grow this much over the fuzz (caches, buffers), no more.
RSS_GROWTH_BOUND_MIB = 150
SEED = [f"seed-{i}".encode() for i in range(10)]
# The answers a remoting request may get from the broker (docs/REMOTING.md, "Broker: errors").
ALLOWED = frozenset(
    {
        R.SUCCESS,
        R.SYSTEM_ERROR,
        R.SYSTEM_BUSY,
        R.REQUEST_CODE_NOT_SUPPORTED,
        R.MESSAGE_ILLEGAL,
        R.SERVICE_NOT_AVAILABLE,
        R.NO_PERMISSION,
        R.TOPIC_NOT_EXIST,
        R.PULL_NOT_FOUND,
        R.PULL_RETRY_IMMEDIATELY,
        R.PULL_OFFSET_MOVED,
        R.QUERY_NOT_FOUND,
        R.SUBSCRIPTION_PARSE_FAILED,
    }
)
SERVED = [
    Q.SEND_MESSAGE,
    Q.SEND_MESSAGE_V2,
    Q.SEND_BATCH_MESSAGE,
    Q.PULL_MESSAGE,
    Q.QUERY_CONSUMER_OFFSET,
    Q.UPDATE_CONSUMER_OFFSET,
    Q.GET_MAX_OFFSET,
    Q.GET_MIN_OFFSET,
    Q.SEARCH_OFFSET_BY_TIMESTAMP,
    Q.HEART_BEAT,
    Q.UNREGISTER_CLIENT,
    Q.GET_CONSUMER_LIST_BY_GROUP,
    Q.CONSUMER_SEND_MSG_BACK,
    Q.VIEW_MESSAGE_BY_ID,
    Q.QUERY_MESSAGE,
    Q.LOCK_BATCH_MQ,
    Q.UNLOCK_BATCH_MQ,
]
FIELDS = [
    "topic", "queueId", "queueOffset", "maxMsgNums", "sysFlag", "commitOffset",
    "suspendTimeoutMillis", "subscription", "expressionType", "consumerGroup", "group",
    "offset", "delayLevel", "originMsgId", "maxReconsumeTimes", "timestamp", "key", "maxNum",
    "beginTimestamp", "endTimestamp", "clientID", "producerGroup", "properties", "batch",
    "a", "b", "c", "d", "e", "f", "g", "h", "i", "j", "k", "l", "m",
]  # fmt: skip
NUMBERS = [
    "-1", "0", "1", "2", "3", "15", "16", "255", "2147483647", "2147483648", "-2147483649",
    "9223372036854775807", "9223372036854775808", "-9223372036854775808", "1e3", "0x10",
    "", "null", " 1", "99999999999999999999999",
]  # fmt: skip
TEXTS = [
    TOPIC, "%RETRY%G", "%DLQ%G", "SCHEDULE_TOPIC_XXXX", "rmq_sys_TRANS_HALF_TOPIC", "*",
    "TagA || TagB", "SQL92", "TAG", "G", "a" * 300, "x" * 40_000, "\u0000", "é€😀", "../..",
    "TAGS\x01A\x02KEYS\x01k\x02", "UNIQ_KEY\x01" + "F" * 32 + "\x02", "DELAY\x01999\x02",
    "TRAN_MSG\x01true\x02", "\x01\x02\x01", "true", "false",
]  # fmt: skip
JSON_BODIES = [
    b"{}", b"[]", b"null", b"{\"clientID\": 1}", b"[" * 5000 + b"]" * 5000,
    json.dumps({"clientID": "c", "consumerDataSet": [{"groupName": "G"}] * 300}).encode(),
    json.dumps({"clientID": "c", "consumerDataSet": [{"groupName": "G", "subscriptionDataSet":
        [{"topic": TOPIC, "subString": "a||" * 3000}]}]}).encode(),
    json.dumps({"consumerGroup": "G", "clientId": "c", "mqSet":
        [{"topic": TOPIC, "queueId": q} for q in range(5000)]}).encode(),
    json.dumps({"consumerGroup": "G", "clientId": "c",
                "mqSet": [{"topic": 1, "queueId": "x"}]}).encode(),
]  # fmt: skip
VALUES = st.one_of(st.sampled_from(NUMBERS), st.sampled_from(TEXTS), st.text(max_size=40))
BODIES = st.one_of(st.sampled_from(JSON_BODIES), st.binary(max_size=256), st.just(b""))
# A valid header of each served code, which the fuzz mutates: most hostile requests then get
# past the first field check and reach the components.
_QUEUE = {"topic": TOPIC, "queueId": "0"}
_GROUP = {"consumerGroup": "G", **_QUEUE}
TEMPLATES: dict[int, dict[str, str]] = {
    Q.SEND_MESSAGE: {"producerGroup": "PG", **_QUEUE, "properties": "TAGS\x01A\x02"},
    Q.SEND_MESSAGE_V2: {"a": "PG", "b": TOPIC, "e": "1", "i": "TAGS\x01A\x02", "h": "0"},
    Q.SEND_BATCH_MESSAGE: {"producerGroup": "PG", **_QUEUE, "batch": "true"},
    Q.PULL_MESSAGE: {**_GROUP, "queueOffset": "0", "maxMsgNums": "32", "sysFlag": "0"},
    Q.QUERY_CONSUMER_OFFSET: _GROUP,
    Q.UPDATE_CONSUMER_OFFSET: {**_GROUP, "commitOffset": "1"},
    Q.GET_MAX_OFFSET: _QUEUE,
    Q.GET_MIN_OFFSET: _QUEUE,
    Q.SEARCH_OFFSET_BY_TIMESTAMP: {**_QUEUE, "timestamp": "0"},
    Q.UNREGISTER_CLIENT: {"clientID": "c", "consumerGroup": "G"},
    Q.GET_CONSUMER_LIST_BY_GROUP: {"consumerGroup": "G"},
    Q.CONSUMER_SEND_MSG_BACK: {"offset": "0", "group": "G", "delayLevel": "0"},
    Q.VIEW_MESSAGE_BY_ID: {"offset": "0"},
    Q.QUERY_MESSAGE: {"topic": TOPIC, "key": "k", "maxNum": "32"},
}


@st.composite
def commands(draw: st.DrawFn) -> tuple[int, dict[str, str], bytes, int]:
    """A served code's valid header with a few fields made hostile, or any code with any
    fields."""
    node = draw(st.integers(0, 2))
    body = draw(BODIES)
    if draw(st.integers(0, 3)):
        code = draw(st.sampled_from(SERVED))
        fields = dict(TEMPLATES.get(code, {}))
        fields.update(draw(st.dictionaries(st.sampled_from(FIELDS), VALUES, max_size=3)))
        return code, fields, body, node
    code = draw(st.one_of(st.sampled_from(SERVED), st.integers(-(2**15), 2**15 - 1)))
    return code, draw(st.dictionaries(st.sampled_from(FIELDS), VALUES, max_size=12)), body, node


COMMANDS = commands()
RAW = st.one_of(
    st.sampled_from(
        [
            struct.pack(">ii", -1, 0),
            struct.pack(">ii", 8, 1 << 30),
            struct.pack(">iI", 100, 0xFF000004) + b"{}\x00\x00",
            struct.pack(">ii", 12, 4) + b'{"a"' + b"xxxx",
            struct.pack(">ii", 0x7FFFFFFF, 0),
            struct.pack(">ii", 20, 16) + b'{"code":"x"}' + b"\x00" * 4,
        ]
    ),
    st.binary(min_size=1, max_size=128),
)


@pytest.fixture(scope="module")
def group(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    cluster = LocalCluster(tmp_path_factory.mktemp("remfuzz"))
    cluster.configure(3, auto_ports=True, namesrv=True, extra=GROUP_CONF)
    try:
        cluster.up()
        assert cluster.namesrv is not None
        create_topic_on([cluster], [cluster.namesrv.addr], TOPIC, QUEUES)
        yield cluster
    finally:
        cluster.down(grace_s=5.0)


class Fuzzer:
    """One remoting connection per node, reopened when a node closed it; the answers seen."""

    def __init__(self, cluster: LocalCluster) -> None:
        self.ports = [n.remoting_port for n in cluster.nodes]
        assert all(self.ports), "every node serves remotingListenPort"
        self.loop = asyncio.new_event_loop()
        self.clients: dict[int, RemotingClient] = {}
        self.codes: Counter[int] = Counter()
        self.bad: list[str] = []
        self.opaque = 0

    def call(self, node: int, code: int, fields: dict[str, str], body: bytes) -> RemotingCommand:
        return self.loop.run_until_complete(self._call(node, code, fields, body))

    async def _call(
        self, node: int, code: int, fields: dict[str, str], body: bytes
    ) -> RemotingCommand:
        client = self.clients.get(node)
        if client is None or client.closed:
            client = await RemotingClient.connect("127.0.0.1", self.ports[node])
            self.clients[node] = client
        self.opaque += 1
        cmd = RemotingCommand(code=code, opaque=self.opaque, ext_fields=fields, body=body)
        return await client.request(cmd, CALL_TIMEOUT_S)

    def check(self, what: str, answer: RemotingCommand) -> None:
        self.codes[answer.code] += 1
        if answer.code not in ALLOWED:
            self.bad.append(f"{what}: code {answer.code} {answer.remark!r}")
        elif answer.code != R.SUCCESS and not answer.remark:
            self.bad.append(f"{what}: code {answer.code} without a remark")
        elif (answer.remark or "").startswith("INTERNAL"):
            self.bad.append(f"{what}: {answer.remark}")

    def raw(self, node: int, data: bytes) -> None:
        """``data`` on a fresh connection: the node answers or closes it, never hangs it."""
        if raw_exchange(self.ports[node], data, CALL_TIMEOUT_S) is None:
            self.bad.append(f"raw {data[:32]!r}: the connection was held open")

    def close(self) -> None:
        for client in self.clients.values():
            self.loop.run_until_complete(client.close())
        self.loop.close()


def _send(f: Fuzzer, node: int, body: bytes) -> RemotingCommand:
    fields = {"b": TOPIC, "a": "PG", "e": "0", "i": "TAGS\x01seed\x02"}
    return f.call(node, Q.SEND_MESSAGE_V2, fields, body)


def _read_queue0(f: Fuzzer, node: int) -> list[bytes]:
    fields = {
        "consumerGroup": "fuzz-check", "topic": TOPIC, "queueId": "0", "queueOffset": "0",
        "maxMsgNums": "1000", "sysFlag": "0",
    }  # fmt: skip
    answer = f.call(node, Q.PULL_MESSAGE, fields, b"")
    bodies, at = [], 0
    while at < len(answer.body):
        (total,) = struct.unpack_from(">i", answer.body, at)
        body_len_at = at + 84
        (body_len,) = struct.unpack_from(">i", answer.body, body_len_at)
        bodies.append(answer.body[body_len_at + 4 : body_len_at + 4 + body_len])
        at += total
    return bodies


def test_fuzz_remoting_ports(group: LocalCluster) -> None:
    leader = int(group.wait_leader()[1:])
    f = Fuzzer(group)
    try:
        for body in SEED:
            assert _send(f, leader, body).code == R.SUCCESS
        rss_before = group_rss_mib(group)

        @settings(
            max_examples=EXAMPLES,
            derandomize=True,
            database=None,
            deadline=None,
            phases=[Phase.generate],
            suppress_health_check=list(HealthCheck),
        )
        @given(COMMANDS)
        def fuzz(command: tuple[int, dict[str, str], bytes, int]) -> None:
            code, fields, body, node = command
            try:
                f.check(f"code {code} {sorted(fields)}", f.call(node, code, fields, body))
            except TimeoutError:
                if code != Q.PULL_MESSAGE:  # a pull may be held up to its suspend timeout
                    f.bad.append(f"code {code} {fields}: no answer in {CALL_TIMEOUT_S} s")

        @settings(max_examples=RAW_EXAMPLES, derandomize=True, database=None, deadline=None,
                  phases=[Phase.generate], suppress_health_check=list(HealthCheck))  # fmt: skip
        @given(RAW, st.integers(0, 2))
        def fuzz_raw(data: bytes, node: int) -> None:
            f.raw(node, data)

        fuzz()
        fuzz_raw()
        print(f"answers by code: {dict(f.codes)}")
        assert_group_survived(group, rss_before, RSS_GROWTH_BOUND_MIB)
        assert not f.bad, "\n".join(f.bad[:20])
        leader = int(group.wait_leader()[1:])
        assert _send(f, leader, b"after").code == R.SUCCESS
        stored = _read_queue0(f, leader)
        assert stored[: len(SEED)] == SEED, stored[: len(SEED)]
    finally:
        f.close()
