"""mqdashboard without a cluster: the rates, the pages over a fake reader (escaping, errors,
bounds), and the confirmed actions (token, origin, credentials)."""

from __future__ import annotations

import html
import re
import socket
import time
import urllib.parse
from typing import Any

import pytest
from starlette.testclient import TestClient

from client.errors import MQClientError
from client.message import Message, MessageExt, MessageQueue, SendResult
from mqdashboard.__main__ import allowed_hosts, main
from mqdashboard.rates import History, rate_per_s
from mqdashboard.reader import (
    ClientView,
    ConsumerGroupView,
    GroupReader,
    GroupView,
    LagRow,
    NodeConfig,
    NodeView,
    QueueRow,
    ShownMessage,
    TopicSpec,
    TopicView,
)
from mqdashboard.sampler import Sampler
from mqdashboard.sessions import (
    FAILED_LOGIN_WINDOW_S,
    MAX_FAILED_LOGINS,
    MAX_FAILED_LOGINS_TOTAL,
    MAX_LOGIN_ADDRESSES,
    SessionTable,
)
from mqdashboard.web import MAX_FORM_BYTES, Settings, create_app, parse_time_ms
from mqsecurity.channels import PLAINTEXT, ClientSecurity
from mqsecurity.credentials import Credentials

HOSTILE = '<script>window.__xss=1</script><img src=x onerror="window.__xss=2">&amp;'


def hostile_message(topic: str = "T") -> ShownMessage:
    return ShownMessage.of(
        MessageExt(
            topic=topic,
            body=HOSTILE.encode(),
            tags="<b>tag</b>",
            keys=("k<i>1</i>",),
            properties={"p<u>": '"><svg onload=alert(1)>'},
            msg_id="AB" * 16,
            offset_msg_id="CD" * 16,
            broker_name="broker-a",
            queue_id=1,
            queue_offset=7,
            commitlog_position=99,
            born_timestamp_ms=1_700_000_000_000,
            store_timestamp_ms=1_700_000_000_123,
            reconsume_times=0,
        )
    )


class FakeReader:
    """What the pages call, answering canned data or raising ``fail``."""

    def __init__(self, secure: bool = False) -> None:
        self.security = (
            ClientSecurity(credentials=Credentials("reader", "reader-secret"))
            if secure
            else PLAINTEXT
        )
        self.fail: Exception | None = None
        self.namesrv_down = ""
        self.calls: list[tuple[Any, ...]] = []

    def namesrv_problem(self) -> str:
        return self.namesrv_down

    def _maybe_fail(self) -> None:
        if self.fail is not None:
            raise self.fail

    def clusters(self) -> list[GroupView]:
        self._maybe_fail()
        nodes = [
            NodeView(
                "n0",
                "127.0.0.1:1",
                "LEADER",
                10,
                role="LEADER",
                term=3,
                lag=0,
                disk_total_bytes=100 << 30,
                disk_free_bytes=40 << 30,
            ),
            NodeView("n1", "127.0.0.1:2", "FOLLOWER", 10, error="UNAVAILABLE: <down>"),
        ]
        return [GroupView("DefaultCluster", "broker-a", "n0", nodes)]

    def topics(self) -> list[TopicView]:
        self._maybe_fail()
        return [TopicView("Orders", [QueueRow("broker-a", 0, 0, 5)])]

    def topic(self, name: str) -> TopicView:
        self._maybe_fail()
        return TopicView(name, [QueueRow("broker-a", 0, 0, 5)])

    def consumer_groups(self, exact_clients: bool = True) -> list[ConsumerGroupView]:
        self._maybe_fail()
        return [ConsumerGroupView("g1", ["Orders"], 2)]

    def consumer_lag(self, group: str, topics: list[str]) -> list[LagRow]:
        return [LagRow(t, "broker-a", 0, 0, 5, 3, 2) for t in topics]

    def consumer_clients(self, group: str) -> list[tuple[str, str]]:
        return [("broker-a", "10.0.0.1@1<x>")]

    def dead_letters(self, group: str) -> list[ShownMessage]:
        return [hostile_message("%DLQ%" + group)]

    def by_key(self, topic: str, key: str) -> list[ShownMessage]:
        self._maybe_fail()
        self.calls.append(("by_key", topic, key))
        return [hostile_message(topic)]

    def by_id(self, topic: str, msg_id: str) -> list[ShownMessage]:
        return [hostile_message(topic)]

    def by_time(self, topic: str, begin: int, end: int) -> tuple[list[ShownMessage], bool]:
        self.calls.append(("by_time", topic, begin, end))
        return [hostile_message(topic)], True

    def resend_dlq(self, group: str, msg_id: str, security: ClientSecurity) -> list[str]:
        self.calls.append(("resend", group, msg_id, security))
        return ["NEWID"]

    def reset_offset(
        self, group: str, topic: str, ts: int, security: ClientSecurity
    ) -> list[tuple[str, int, int]]:
        self.calls.append(("reset", group, topic, ts, security))
        return [("broker-a", 0, 4)]

    def check_user(self, security: ClientSecurity) -> list[str]:
        self._maybe_fail()
        self.calls.append(("check_user", security.credentials))
        if security.credentials != Credentials("ops", "ops-secret-1"):
            raise MQClientError("UNAUTHENTICATED", "UNAUTHENTICATED", "broker-a: bad <signature>")
        return ["broker-a"]

    def broker_configs(self) -> list[NodeConfig]:
        self._maybe_fail()
        return [
            NodeConfig("broker-a", "n0", "127.0.0.1:1", {"flushDiskType": "SYNC", "k<x>": "v<y>"}),
            NodeConfig("broker-a", "n1", "127.0.0.1:2", {"flushDiskType": "ASYNC"}),
            NodeConfig("broker-a", "n2", "127.0.0.1:3", {}, "UNAVAILABLE: <down>"),
        ]

    def clients(self) -> list[tuple[str, ClientView]]:
        self._maybe_fail()
        c = ClientView("g1", "10.0.0.1@1<x>", "10.0.0.1:5<0>", "PYTHON", "0.3.0<v>", "v1", 1500)
        v2 = ClientView("g1", "rmq5-client-1", "10.0.0.3:7", "PYTHON", "5.0.3", "v2", 900)
        return [("broker-a", c), ("broker-a", v2), ("broker-b", ClientView("g1", "10.0.0.1@1<x>"))]

    def producers(self) -> tuple[list[tuple[str, ClientView]], bool]:
        self._maybe_fail()
        p = ClientView("pg<1>", "10.0.0.2@7", "10.0.0.2:6", "JAVA", "5.0.7", "v2", 200)
        return [("broker-a", p)], True

    def broker_names(self) -> list[str]:
        return ["broker-a", "broker-<b>"]

    def update_topic(self, spec: TopicSpec, broker: str, security: ClientSecurity) -> list[str]:
        self._maybe_fail()
        self.calls.append(("topic-update", spec, broker, security))
        return [broker] if broker else ["broker-a", "broker-b"]

    def delete_topic(self, topic: str, broker: str, security: ClientSecurity) -> list[str]:
        self._maybe_fail()
        self.calls.append(("topic-delete", topic, broker, security))
        return ["broker-a"]

    def update_group(
        self, config: Any, broker: str, security: ClientSecurity
    ) -> list[tuple[str, Any]]:
        self._maybe_fail()
        self.calls.append(("group-update", config, broker, security))
        return [("broker-a", config)]

    def delete_group(self, group: str, broker: str, security: ClientSecurity) -> list[str]:
        self._maybe_fail()
        self.calls.append(("group-delete", group, broker, security))
        return ["broker-a"]

    def send_test(self, msg: Message, security: ClientSecurity) -> SendResult:
        self._maybe_fail()
        self.calls.append(("send", msg, security))
        return SendResult(
            "SENTID", "OFFSETID", MessageQueue(msg.topic, "broker-a", 3), 41, 9, False
        )

    def close(self) -> None:
        pass


def client_for(reader: FakeReader) -> tuple[TestClient, Settings]:
    sampler = Sampler(reader, 1000)  # type: ignore[arg-type]
    settings = Settings(
        "127.0.0.1:9876", actions_need_credentials=reader.security.credentials is not None
    )
    app = create_app(reader, sampler, settings, allowed_hosts("127.0.0.1"), start_sampler=False)  # type: ignore[arg-type]
    return TestClient(app, base_url="http://127.0.0.1:8080"), settings


def test_rates_come_from_successive_samples_and_skip_a_counter_that_went_down() -> None:
    assert rate_per_s((0.0, 10.0), (2.0, 30.0)) == 10.0
    assert rate_per_s((0.0, 10.0), (0.0, 30.0)) is None
    assert rate_per_s((0.0, 10.0), (1.0, 3.0)) is None
    h = History(max_points=3, max_series=2)
    for t, v in [(0, 0), (1, 5), (2, 1), (3, 4), (4, 10)]:
        h.add(float(t), {"a": v, "b": v, "c": v})
    assert h.names() == ["a", "b"]  # the third series does not fit
    assert h.points("a") == [(2.0, 1.0), (3.0, 4.0), (4.0, 10.0)]  # bounded
    assert h.rates("a") == [(3.0, 3.0), (4.0, 6.0)]
    assert h.latest_rate("a") == 6.0
    h.add(5.0, {"a": 11})
    assert h.names() == ["a"]  # a series missing from a sample is dropped


def test_every_page_renders_and_escapes_hostile_values() -> None:
    reader = FakeReader()
    client, _ = client_for(reader)
    with client:
        for path in [
            "/",
            "/topics",
            "/topic?name=Orders",
            "/consumers",
            "/consumer?group=g1",
            "/charts",
            "/config",
            "/clients",
            "/messages",
            "/messages?mode=key&topic=T&key=k",
        ]:
            resp = client.get(path)
            assert resp.status_code == 200, (path, resp.text)
            assert "content-security-policy" in resp.headers
            assert "<script>window" not in resp.text and "<img src=x" not in resp.text
            assert "<svg onload" not in resp.text and "<b>tag" not in resp.text
        page = client.get("/messages?mode=key&topic=T&key=k").text
        assert "&lt;script&gt;window.__xss=1&lt;/script&gt;" in page
        assert "&amp;amp;" in page  # escaped once, shown as typed
        assert "UNAVAILABLE: &lt;down&gt;" in client.get("/").text
        assert "10.0.0.1@1&lt;x&gt;" in client.get("/consumer?group=g1").text
        assert client.get("/api/series").json()["interval_ms"] == 1000
        assert client.get("/static/charts.js").status_code == 200


PAGES = [
    "/",
    "/config",
    "/clients",
    "/topics",
    "/topic?name=Orders",
    "/consumers",
    "/consumer?group=g1",
    "/charts",
    "/messages",
    "/messages?mode=key&topic=T&key=k",
    "/actions/resend?group=g1",
]


def test_an_unreachable_nameserver_is_one_banner_naming_it_on_every_page() -> None:
    reader = FakeReader()
    reader.namesrv_down = "127.0.0.1:9876: UNAVAILABLE (UNAVAILABLE): connection <refused>"
    client, settings = client_for(reader)
    with client:
        for path in PAGES:
            resp = client.get(path)
            assert resp.status_code == 502, path
            assert resp.text.count('class="error"') == 1, path
            assert 'class="warning"' not in resp.text
            assert "The NameServer 127.0.0.1:9876 is unreachable." in resp.text
            assert "connection &lt;refused&gt;" in resp.text
            assert 'id="nav-charts"' in resp.text  # the whole page, with its navigation
        assert reader.calls == []  # nothing read past the check
        [line] = client.get("/api/series").json()["errors"]
        assert line.startswith("the NameServer 127.0.0.1:9876 is unreachable: ")
        form = {"csrf": settings.csrf_token, "group": "g1"}
        assert client.post("/actions/resend", data=form).status_code == 502
        assert reader.calls == []


def test_a_real_reader_says_the_nameserver_is_unreachable() -> None:
    """No NameServer listens on the port: every page says so at once (before the page's own
    reads would each time out)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed when the block ends: nobody listens there
    reader = GroupReader(f"127.0.0.1:{port}")
    sampler = Sampler(reader, 1000)
    sampler.sample_once()  # the sampler's errors are not shown next to the banner
    settings = Settings(f"127.0.0.1:{port}", actions_need_credentials=False)
    app = create_app(reader, sampler, settings, allowed_hosts("127.0.0.1"), start_sampler=False)
    with TestClient(app, base_url="http://127.0.0.1:8080") as client:
        for path in ["/", "/topics", "/charts", "/messages"]:
            started = time.monotonic()
            resp = client.get(path)
            assert resp.status_code == 502, path
            assert f"The NameServer 127.0.0.1:{port} is unreachable." in resp.text
            assert f"127.0.0.1:{port}: " in resp.text and "UNAVAILABLE" in resp.text
            assert resp.text.count('class="error"') == 1 and 'class="warning"' not in resp.text
            assert time.monotonic() - started < 5.0


def test_the_config_page_shows_every_node_and_marks_keys_that_differ() -> None:
    client, _ = client_for(FakeReader())
    with client:
        resp = client.get("/config")
        assert resp.status_code == 200
        rows = dict(re.findall(r'<tr data-key="([^"]+)">(.*?)</tr>', resp.text))
        assert "<strong>differs</strong>" in rows["flushDiskType"]
        assert "<td>-</td>" in rows["k&lt;x&gt;"] and "differs" in rows["k&lt;x&gt;"]
        assert "<td>SYNC</td><td>ASYNC</td><td>?</td>" in rows["flushDiskType"]
        assert "v&lt;y&gt;" in rows["k&lt;x&gt;"] and "UNAVAILABLE: &lt;down&gt;" in resp.text


def test_the_clients_page_lists_producers_and_consumers_with_their_versions() -> None:
    client, _ = client_for(FakeReader())
    with client:
        resp = client.get("/clients")
        assert resp.status_code == 200
        assert resp.text.count("10.0.0.1@1&lt;x&gt;") == 2
        assert "<td>10.0.0.1:5&lt;0&gt;</td><td>PYTHON</td><td>0.3.0&lt;v&gt;</td>" in resp.text
        assert "<td>unknown</td><td>unknown</td>" in resp.text  # a client before 0.3.0
        producers = resp.text[resp.text.index('id="producers"') : resp.text.index('id="clients"')]
        assert "<td>pg&lt;1&gt;</td><td>broker-a</td><td>10.0.0.2@7</td>" in producers
        assert "<td>JAVA</td><td>5.0.7</td><td>v2</td><td>0.2 s ago</td>" in producers
        consumers = resp.text[resp.text.index('id="clients"') :]
        assert "<td>10.0.0.3:7</td><td>PYTHON</td><td>5.0.3</td><td>v2</td>" in consumers
        assert "<td>PYTHON</td><td>0.3.0&lt;v&gt;</td><td>v1</td>" in consumers
        assert "some are left out" in resp.text


def test_errors_from_the_group_are_shown_never_a_blank_page() -> None:
    reader = FakeReader()
    reader.fail = MQClientError("NO_LEADER", "UNAVAILABLE", "broker-a: no <leader>")
    client, _ = client_for(reader)
    with client:
        for path in [
            "/",
            "/topics",
            "/consumers",
            "/config",
            "/clients",
            "/messages?mode=key&topic=T&key=k",
        ]:
            resp = client.get(path)
            assert resp.status_code == 502
            assert "NO_LEADER (UNAVAILABLE): broker-a: no &lt;leader&gt;" in resp.text
            assert 'id="nav-charts"' in resp.text  # the whole page, with its navigation
        reader.fail = RuntimeError("bug")
        assert client.get("/").status_code == 500


def test_inputs_are_bounded_before_the_cluster_is_called() -> None:
    reader = FakeReader()
    client, _ = client_for(reader)
    with client:
        for query in [
            "mode=key&topic=&key=k",
            "mode=key&topic=T&key=" + "k" * 1025,
            "mode=key&topic=" + "t" * 256 + "&key=k",
            "mode=key&topic=T%01&key=k",
            "mode=time&topic=T&begin=yesterday&end=1",
            "mode=time&topic=T&begin=2000&end=1000",
            "mode=nope&topic=T",
        ]:
            resp = client.get("/messages?" + query)
            assert resp.status_code == 400, query
            assert 'class="error"' in resp.text
        assert reader.calls == []
        resp = client.get(
            "/messages?mode=time&topic=T&begin=2026-11-24T21:00&end=2026-11-24T21:00:30"
        )
        assert resp.status_code == 200 and "stopped at a limit" in resp.text
        assert reader.calls == [("by_time", "T", 1795554000000, 1795554030000)]
        assert client.get("/", headers={"host": "evil.example"}).status_code == 400
    assert parse_time_ms("1700000000000", "t") == 1_700_000_000_000


def _token(page: str) -> str:
    match = re.search(r'name="csrf" value="([^"]+)"', page)
    assert match is not None
    return match.group(1)


def test_actions_need_a_confirmed_form_and_credentials_on_a_secure_group() -> None:
    reader = FakeReader(secure=True)
    client, settings = client_for(reader)
    with client:
        page = client.get("/actions/resend?group=g1&msg_id=ABC").text
        assert 'name="secret_key"' in page and "ABC" in page
        token = _token(page)
        form = {"group": "g1", "msg_id": "ABC", "csrf": token}
        # No token, a wrong one, another site's page: refused, nothing called.
        for bad, headers in [
            ({**form, "csrf": ""}, {}),
            ({**form, "csrf": "x" * 43}, {}),
            (form, {"origin": "http://evil.example"}),
        ]:
            resp = client.post("/actions/resend", data=bad, headers=headers)
            assert resp.status_code == 400 and reader.calls == []
        # A secure group: the user's credentials, never the dashboard's own.
        resp = client.post("/actions/resend", data=form)
        assert resp.status_code == 400 and "AccessKey" in resp.text and reader.calls == []
        resp = client.post(
            "/actions/resend", data={**form, "access_key": "ops", "secret_key": "ops-secret-1"}
        )
        assert resp.status_code == 200 and "Resent 1 message: NEWID" in resp.text
        assert "ops-secret-1" not in resp.text
        ((name, group, msg_id, security),) = reader.calls
        assert (name, group, msg_id) == ("resend", "g1", "ABC")
        assert security.credentials == Credentials("ops", "ops-secret-1")
        reader.calls.clear()
        resp = client.post(
            "/actions/reset",
            data={
                "group": "g1",
                "topic": "Orders",
                "time": "1000",
                "csrf": settings.csrf_token,
                "access_key": "ops",
                "secret_key": "ops-secret-1",
            },
        )
        assert resp.status_code == 200 and reader.calls[0][:4] == ("reset", "g1", "Orders", 1000)
        resp = client.post("/actions/drop", data={"csrf": settings.csrf_token})
        assert resp.status_code == 400
        resp = client.post(
            "/actions/reset",
            content=b"a=" + b"x" * MAX_FORM_BYTES,
            headers={"content-type": "application/x-www-form-urlencoded"},
        )
        assert resp.status_code == 400 and "form larger" in resp.text


def test_plaintext_group_actions_need_only_the_confirmation() -> None:
    reader = FakeReader(secure=False)
    client, _ = client_for(reader)
    with client:
        page = client.get("/actions/resend?group=g1").text
        assert 'name="secret_key"' not in page
        resp = client.post("/actions/resend", data={"group": "g1", "csrf": _token(page)})
        assert resp.status_code == 200 and reader.calls[0][:3] == ("resend", "g1", "")


def _confirm_and_do(client: TestClient, path: str) -> tuple[str, Any]:
    """Open a confirmation page, then POST its form as the page would (hidden fields, token,
    and the admin's credentials when the page asks for them)."""
    page = client.get(path)
    assert page.status_code == 200, page.text
    fields = dict(re.findall(r'<input type="hidden" name="([a-z_]+)" value="([^"]*)"', page.text))
    if 'name="secret_key"' in page.text:
        fields.update(access_key="ops", secret_key="ops-secret-1")
    action = path.split("?")[0].rsplit("/", 1)[1]
    return page.text, client.post("/actions/" + action, data=_unescape(fields))


def _unescape(fields: dict[str, str]) -> dict[str, str]:
    return {k: html.unescape(v) for k, v in fields.items()}


def test_topic_and_group_actions_confirm_then_act_as_the_user() -> None:
    reader = FakeReader(secure=True)
    client, _ = client_for(reader)
    ops = Credentials("ops", "ops-secret-1")
    with client:
        topics = client.get("/topics").text
        assert 'id="topic-form"' in topics and "broker-&lt;b&gt;" in topics
        page, done = _confirm_and_do(
            client,
            "/actions/topic-update?topic=New<T>&queues=4&perm=4&message_type=FIFO&broker=broker-a",
        )
        assert "New&lt;T&gt;" in page and "read only" in page and "broker-a</strong> only" in page
        assert done.status_code == 200 and "created or updated on broker-a" in done.text
        ((name, spec, broker, security),) = reader.calls
        assert (name, spec, broker) == (
            "topic-update",
            TopicSpec("New<T>", 4, 4, "FIFO"),
            "broker-a",
        )
        assert security.credentials == ops
        reader.calls.clear()
        page, done = _confirm_and_do(client, "/actions/topic-delete?topic=Old")
        assert "<strong>every</strong> broker group" in page and done.status_code == 200
        assert reader.calls[0][:3] == ("topic-delete", "Old", "")
        reader.calls.clear()
        page, done = _confirm_and_do(
            client, "/actions/group-update?group=G1&orderly=true&retries=3"
        )
        assert "orderly" in page and "at most <strong>3</strong> retries" in page
        (_, config, broker, security) = reader.calls[0]
        assert (config.group, config.consume_message_orderly, config.max_delivery_attempts) == (
            "G1",
            True,
            4,
        )
        assert broker == "" and security.credentials == ops and done.status_code == 200
        reader.calls.clear()
        page, done = _confirm_and_do(client, "/actions/group-delete?group=G1&broker=broker-a")
        assert reader.calls[0][:3] == ("group-delete", "G1", "broker-a")
        assert "Subscription group <strong>G1</strong> deleted on broker-a" in done.text
        # The broker's refusal is the result page's banner.
        reader.calls.clear()
        reader.fail = MQClientError("PERMISSION_DENIED", "PERMISSION_DENIED", "ops may not <x>")
        _, done = _confirm_and_do(client, "/actions/group-delete?group=G1")
        assert done.status_code == 502
        assert "PERMISSION_DENIED (PERMISSION_DENIED): ops may not &lt;x&gt;" in done.text


def test_a_test_send_shows_the_brokers_answer_and_keeps_the_body_as_typed() -> None:
    reader = FakeReader(secure=False)
    client, _ = client_for(reader)
    body = HOSTILE + "\nsecond line"
    with client:
        assert 'id="send-form"' in client.get("/topic?name=Orders").text
        query = urllib.parse.urlencode(
            {"topic": "Orders", "tag": "t<1>", "keys": "k1 k2", "body": body}
        )
        page, done = _confirm_and_do(client, "/actions/send?" + query)
        assert "<script>window" not in page and "&lt;script&gt;window" in page
        assert done.status_code == 200
        assert 'id="sent-id">SENTID<' in done.text and "<td>41</td>" in done.text
        ((_, msg, _),) = reader.calls
        assert (msg.topic, msg.tags, msg.keys, msg.body) == (
            "Orders",
            "t<1>",
            ("k1", "k2"),
            body.encode(),
        )


def test_action_inputs_are_bounded_and_nothing_is_called() -> None:
    reader = FakeReader(secure=False)
    client, settings = client_for(reader)
    bad_queries = [
        "topic-update?topic=T&queues=0&perm=6&message_type=NORMAL",
        "topic-update?topic=T&queues=1025&perm=6&message_type=NORMAL",
        "topic-update?topic=T&queues=x&perm=6&message_type=NORMAL",
        "topic-update?topic=T&queues=8&perm=7&message_type=NORMAL",
        "topic-update?topic=T&queues=8&perm=6&message_type=STRANGE",
        "topic-update?topic=" + "t" * 256 + "&queues=8&perm=6&message_type=NORMAL",
        "topic-delete?topic=",
        "topic-delete?topic=T&broker=" + "b" * 256,
        "group-update?group=G&orderly=maybe",
        "group-update?group=G&retries=1000",
        "group-delete?group=G%01",
        "send?topic=T&body=" + "b" * 2049,
        "send?topic=T&body=%00",
        "send?topic=T&tag=" + "t" * 256,
        "nothing?topic=T",
    ]
    with client:
        for query in bad_queries:
            resp = client.get("/actions/" + query)
            assert resp.status_code == 400, query
            action, params = query.split("?", 1)
            form = {**dict(urllib.parse.parse_qsl(params)), "csrf": settings.csrf_token}
            assert client.post("/actions/" + action, data=form).status_code == 400, query
        assert reader.calls == []


def test_the_session_table_is_bounded_in_size_and_time() -> None:
    now = [0.0]
    table = SessionTable(max_sessions=2, idle_s=10.0, max_age_s=25.0, clock=lambda: now[0])
    ops = Credentials("ops", "ops-secret-1")
    a, b = table.open(ops), table.open(ops)
    assert a != b and len(a) == 43 and len(table) == 2
    now[0] = 1.0
    assert table.get(a) is not None  # a used after b: b is the one unused longest
    c = table.open(ops)
    assert len(table) == 2 and table.get(b) is None and table.get(c) is not None
    now[0] = 9.0
    assert table.get(a) is not None  # used at 1 and 9: never 10 s idle
    now[0] = 19.5
    assert table.get(c) is None  # unused since 1.0
    now[0] = 26.0
    assert table.get(a) is None  # used at 19.5 but older than 25 s
    assert table.get("x" * 65) is None and table.get("") is None and len(table) == 0
    d = table.open(ops)
    table.close(d)
    assert table.get(d) is None


def test_login_signs_actions_as_the_user_until_logout() -> None:
    reader = FakeReader(secure=True)
    client, settings = client_for(reader)
    ops = Credentials("ops", "ops-secret-1")
    with client:
        page = client.get("/login").text
        assert 'id="login"' in page and 'id="nav-login"' in page
        token = _token(page)
        login = {"csrf": token, "access_key": "ops", "secret_key": "ops-secret-1"}
        # No token, another site: refused before the group is asked; no cookie.
        resp = client.post("/login", data={**login, "csrf": ""})
        assert resp.status_code == 400 and "set-cookie" not in resp.headers
        resp = client.post("/login", data=login, headers={"origin": "http://evil.example"})
        assert resp.status_code == 400 and reader.calls == []
        # A wrong SecretKey: the group's refusal, no session.
        resp = client.post("/login", data={**login, "secret_key": "wrong-secret-1"})
        assert resp.status_code == 401 and "bad &lt;signature&gt;" in resp.text
        assert "set-cookie" not in resp.headers and len(settings.sessions) == 0
        assert client.post("/login", data={**login, "access_key": "a b"}).status_code == 400
        # The right keys: a session cookie, HttpOnly and SameSite=Strict, never the secret.
        resp = client.post("/login", data=login)
        assert resp.status_code == 200 and 'id="logged-in"' in resp.text
        cookie = resp.headers["set-cookie"]
        assert cookie.startswith("mqdashboard_session=") and "HttpOnly" in cookie
        assert "SameSite=strict" in cookie and "Path=/" in cookie and "ops-secret" not in cookie
        assert len(settings.sessions) == 1
        assert 'id="session-user">ops<' in client.get("/").text
        # An action asks for no keys and is signed as the session's user.
        reader.calls.clear()
        page = client.get("/actions/topic-delete?topic=Old").text
        assert 'id="signed-as"' in page and 'name="secret_key"' not in page
        resp = client.post("/actions/topic-delete", data={"topic": "Old", "csrf": token})
        assert resp.status_code == 200, resp.text
        assert reader.calls[0][:3] == ("topic-delete", "Old", "")
        assert reader.calls[0][3].credentials == ops
        # A made-up session id is no session.
        client.cookies.clear()
        client.cookies.set("mqdashboard_session", "forged-id")
        resp = client.post("/actions/topic-delete", data={"topic": "Old", "csrf": token})
        assert resp.status_code == 400 and "AccessKey" in resp.text
        client.cookies.clear()
        # Log out: the session is gone server side, and the cookie.
        resp = client.post("/login", data=login)
        session_id = resp.cookies["mqdashboard_session"]
        resp = client.post("/logout", data={"csrf": token})
        assert resp.status_code == 200 and 'id="logged-out"' in resp.text
        assert settings.sessions.get(session_id) is None
        client.cookies.clear()
        client.cookies.set("mqdashboard_session", session_id)
        resp = client.post("/actions/topic-delete", data={"topic": "Old", "csrf": token})
        assert resp.status_code == 400 and "AccessKey" in resp.text


def test_failed_logins_are_bounded_per_minute() -> None:
    reader = FakeReader(secure=True)
    client, settings = client_for(reader)
    now = [100.0]
    settings.sessions = SessionTable(clock=lambda: now[0])
    wrong = {"csrf": settings.csrf_token, "access_key": "ops", "secret_key": "wrong-secret-1"}
    with client:
        for _ in range(MAX_FAILED_LOGINS):
            assert client.post("/login", data=wrong).status_code == 401
        asked = len(reader.calls)
        resp = client.post("/login", data={**wrong, "secret_key": "ops-secret-1"})
        assert resp.status_code == 429 and "try again in 60 s" in resp.text
        assert len(reader.calls) == asked and "set-cookie" not in resp.headers
        now[0] += FAILED_LOGIN_WINDOW_S + 1
        resp = client.post("/login", data={**wrong, "secret_key": "ops-secret-1"})
        assert resp.status_code == 200 and 'id="logged-in"' in resp.text


def test_one_address_failing_logins_does_not_slow_another() -> None:
    reader = FakeReader(secure=True)
    attacker, settings = client_for(reader)
    now = [100.0]
    settings.sessions = SessionTable(clock=lambda: now[0])
    # The same application, reached from another source address.
    operator = TestClient(attacker.app, base_url="http://127.0.0.1:8080", client=("10.0.0.7", 4))
    wrong = {"csrf": settings.csrf_token, "access_key": "ops", "secret_key": "wrong-secret-1"}
    right = {**wrong, "secret_key": "ops-secret-1"}
    with attacker, operator:
        for _ in range(MAX_FAILED_LOGINS):
            assert attacker.post("/login", data=wrong).status_code == 401
        assert attacker.post("/login", data=right).status_code == 429
        # The operator's address never failed: asked at once, logged in.
        asked = len(reader.calls)
        resp = operator.post("/login", data=right)
        assert resp.status_code == 200 and 'id="logged-in"' in resp.text
        assert len(reader.calls) == asked + 1
        assert attacker.post("/login", data=right).status_code == 429  # still waiting


def test_failed_logins_per_address_are_bounded_with_a_total_ceiling() -> None:
    now = [0.0]
    table = SessionTable(clock=lambda: now[0])
    for _ in range(MAX_FAILED_LOGINS):
        assert table.login_wait_s("a") == 0.0
        table.login_failed("a")
    assert table.login_wait_s("a") == FAILED_LOGIN_WINDOW_S and table.login_wait_s("b") == 0.0
    now[0] = 10.0
    assert table.login_wait_s("a") == FAILED_LOGIN_WINDOW_S - 10.0
    # Many addresses each under their own limit: the total ceiling stops everyone.
    for i in range(MAX_FAILED_LOGINS_TOTAL - MAX_FAILED_LOGINS):
        table.login_failed(f"10.1.{i // 256}.{i % 256}")
    assert table.login_wait_s("fresh") == FAILED_LOGIN_WINDOW_S - 10.0
    now[0] = FAILED_LOGIN_WINDOW_S + 10.5  # a's failures (at 0) and the others' (at 10) aged out
    assert table.login_wait_s("fresh") == 0.0 and table.login_wait_s("a") == 0.0
    # The table of addresses is bounded: the address that failed least recently goes first.
    table = SessionTable(clock=lambda: now[0])
    table.login_failed("first")
    for i in range(MAX_LOGIN_ADDRESSES):
        now[0] += FAILED_LOGIN_WINDOW_S  # the total ceiling never binds here
        table.login_failed(f"addr-{i}")
    assert table.login_addresses == MAX_LOGIN_ADDRESSES
    for _ in range(MAX_FAILED_LOGINS):
        table.login_failed("x" * 10_000)  # a hostile address text is cut, still counted
    assert table.login_addresses == MAX_LOGIN_ADDRESSES
    assert table.login_wait_s("x" * 10_000) == FAILED_LOGIN_WINDOW_S
    assert "first" not in table._failures_by_address and "addr-1" in table._failures_by_address


def test_a_plaintext_group_has_no_login() -> None:
    reader = FakeReader(secure=False)
    client, settings = client_for(reader)
    with client:
        page = client.get("/")
        assert 'id="nav-login"' not in page.text
        assert client.get("/login").status_code == 400
        resp = client.post(
            "/login", data={"csrf": settings.csrf_token, "access_key": "a", "secret_key": "b"}
        )
        assert resp.status_code == 400 and "not secure" in resp.text and reader.calls == []


def test_command_line_is_checked(capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (["--port", "0"], ["--sample-interval-ms", "5"], ["--tls-cert", "x"], ["-n", ";"]):
        with pytest.raises(SystemExit) as exc:
            main(argv)
        assert exc.value.code == 2
    assert allowed_hosts("127.0.0.1") == ["127.0.0.1", "[::1]", "localhost"]
    assert allowed_hosts("0.0.0.0") == ["*"]


class HealthReader(FakeReader):
    """A group with a member repairing and one whose damage counters are non-zero."""

    def clusters(self) -> list[GroupView]:
        nodes = [
            NodeView("n0", "127.0.0.1:1", "LEADER", 10, role="LEADER", term=3, lag=0),
            NodeView(
                "n1",
                "127.0.0.1:2",
                "FOLLOWER",
                10,
                role="FOLLOWER",
                term=3,
                repairing=True,
                promised_index=812,
            ),
            NodeView(
                "n2",
                "127.0.0.1:3",
                "FOLLOWER",
                10,
                role="FOLLOWER",
                term=3,
                corruption_found=2,
                chain_mismatches=1,
                derived_mismatches=5,
            ),
            NodeView("n3", "127.0.0.1:4", "FOLLOWER", 10, error="UNAVAILABLE: down"),
        ]
        return [GroupView("DefaultCluster", "broker-a", "n0", nodes)]


def _node_cells(page: str, node: str) -> dict[str, str]:
    row = re.search(rf'<tr [^>]*data-node="{node}">(.*?)</tr>', page, re.S)
    assert row is not None, node
    cells = re.findall(r'<td class="(repairing|corruption)">(.*?)</td>', row.group(1), re.S)
    return {name: re.sub(r"<[^>]+>", "", text) for name, text in cells}


def test_the_nodes_page_shows_repairing_and_the_corruption_counters_per_node() -> None:
    client, _ = client_for(HealthReader())
    with client:
        page = client.get("/").text
    assert "<th>repairing</th><th>corruption</th>" in page
    assert _node_cells(page, "n0") == {"repairing": "no", "corruption": "none"}
    assert _node_cells(page, "n1") == {"repairing": "repairing to 812", "corruption": "none"}
    assert _node_cells(page, "n2") == {
        "repairing": "no",
        "corruption": "damage found 2, chain mismatches 1, derived mismatches 5",
    }
    assert _node_cells(page, "n3") == {}  # no answer: dashes, its error says why


def test_the_reader_takes_the_health_fields_from_each_nodes_metadata(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from raftmq.dledger.v1 import dledger_pb2 as dpb
    from raftmq.dledger.v1 import dledger_pb2_grpc as dpb_grpc
    from raftmq.nameserver.v1 import nameserver_pb2 as ns_pb

    from mqdashboard import reader as reader_mod

    answer = dpb.MetadataResponse(
        role="FOLLOWER",
        term=3,
        repairing=True,
        promised_index=40,
        corruption_found={"scrub": 1, "open": 2},
        chain_mismatches=1,
        chain_check_mismatches=2,
        committed_repairs=4,
        derived_mismatches={"consumequeue": 5, "index": 1},
    )

    class Stub:
        def __init__(self, channel: object) -> None:
            pass

        def Metadata(self, request: object, timeout: float) -> dpb.MetadataResponse:
            return answer

    monkeypatch.setattr(dpb_grpc, "DLedgerClientStub", Stub)
    reader = reader_mod.GroupReader("127.0.0.1:1")
    try:
        view, _ = reader._metadata(ns_pb.MemberInfo(node_id="n1", client_addr="127.0.0.1:2"))
    finally:
        reader.close()
    assert (view.repairing, view.promised_index) == (True, 40)
    assert view.corruption_counters == [
        ("damage found", 3),
        ("chain mismatches", 3),
        ("committed repairs", 4),
        ("derived mismatches", 6),
    ]
