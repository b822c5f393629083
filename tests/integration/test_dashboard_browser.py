"""mqdashboard in a real browser (issue #22): Debian's headless Chromium, driven by selenium,
against a live secure 3-node group and its NameServer. It loads every page, finds a sent
message by key, shows a hostile body as text, resends a dead letter after confirming with the
admin's credentials, sees the leader change after a SIGKILL, and writes a screenshot of each
page to build/test-output/dashboard/ (RAFTMQ_TEST_OUTPUT overrides build/test-output).

The dashboard runs as the read-only user docs/DASHBOARD.md recommends (``Cluster:c Get, List``,
``Topic:* Get, Sub``, ``Group:* Get, Sub``): every page must work with it, and an action
confirmed with that user's own keys is refused and changes nothing.

Without chromium and chromedriver (``make system-deps`` installs them as root) the test is
skipped, saying so.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from raftmq.broker.v1 import broker_pb2 as bpb
from support import create_topic, wait_for

from client import ConsumeStatus, Producer, PullConsumer, PushConsumer
from client.admin import MQAdmin
from client.errors import MQClientError
from client.message import Message, MessageQueue
from client.route import ChannelPool
from mqcluster.cluster import LocalCluster, _free_port
from mqcluster.groups import Groups
from mqrelease import RELEASE
from mqsecurity.channels import ClientSecurity

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
OUTPUT = Path(os.environ.get("RAFTMQ_TEST_OUTPUT", REPO / "build" / "test-output")) / "dashboard"
TOPIC = "DashOrders"
GROUP = "dash-group"
LIVE_GROUP = "dash-live"
# The read-only user of docs/DASHBOARD.md "Actions".
VIEWER = {"accessKey": "dash-viewer", "secretKey": "viewer-secret-0001"}
VIEWER_RULES = (
    (["Cluster:DefaultCluster"], ["Get", "List"]),
    (["Topic:*", "Group:*"], ["Get", "Sub"]),
)
HOSTILE = '<script>window.__xss=1</script><img src=x onerror="window.__xss=2"> & <b>bold</b>'
# A page load, a leader change seen by the dashboard: deadlines on a loaded 2-core machine.
PAGE_DEADLINE_S = 20.0
FAILOVER_DEADLINE_S = 30.0


def _browser_binaries() -> tuple[str, str]:
    chromium = shutil.which("chromium")
    driver = shutil.which("chromedriver")
    if chromium is None or driver is None:
        pytest.skip(
            "needs Debian's chromium and chromium-driver (make system-deps installs them as root)"
        )
    return chromium, driver


@pytest.fixture
def browser() -> Iterator[Any]:
    chromium, driver_path = _browser_binaries()
    from selenium import webdriver
    from selenium.common.exceptions import WebDriverException
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for arg in (
        "--headless=new",
        "--no-sandbox",  # CI runs as root, where Chromium's sandbox refuses to start
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--window-size=1360,900",
    ):
        options.add_argument(arg)
    try:
        driver = webdriver.Chrome(service=Service(driver_path), options=options)
    except WebDriverException as exc:
        pytest.skip(f"headless Chromium did not start: {exc.msg}")
    driver.set_page_load_timeout(PAGE_DEADLINE_S)
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture
def group(tmp_path: Path) -> Iterator[LocalCluster]:
    cluster = LocalCluster(tmp_path / "group")
    cluster.configure(
        3,
        auto_ports=True,
        namesrv=True,
        secure=True,
        extra={"mappedFileSizeCommitLog": str(4 << 20), "registerBrokerPeriod": "1000"},
    )
    try:
        cluster.up()
        yield cluster
    finally:
        cluster.down(grace_s=5.0)


def _viewer(namesrv_addr: str, security: ClientSecurity, tmp_path: Path) -> Path:
    """The read-only user, created by the admin on every group; its credentials file."""
    admin = MQAdmin(namesrv_addr, security)
    admin.create_user(VIEWER["accessKey"], VIEWER["secretKey"], "Normal")
    for resources, actions in VIEWER_RULES:
        admin.put_acl(f"User:{VIEWER['accessKey']}", resources, actions)
    path = tmp_path / "viewer.json"
    path.write_text(json.dumps(VIEWER))
    path.chmod(0o600)
    return path


@pytest.fixture
def dashboard(group: LocalCluster, tmp_path: Path) -> Iterator[str]:
    assert group.namesrv is not None
    with _run_dashboard(
        group.namesrv.addr, group.client_security(), group.tool_argv(), tmp_path
    ) as url:
        yield url


@contextlib.contextmanager
def _run_dashboard(
    namesrv_addr: str, security: ClientSecurity, tool_argv: list[str], tmp_path: Path
) -> Iterator[str]:
    """mqdashboard for the cluster of ``namesrv_addr``, reading as the read-only user (made by
    the admin, whose ``security`` and tool options are given); its URL, until the end."""
    port = _free_port()
    argv = [sys.executable, "-m", "mqdashboard", "-n", namesrv_addr, "--port", str(port)]
    options = list(tool_argv)
    at = options.index("--credentials")
    options[at + 1] = str(_viewer(namesrv_addr, security, tmp_path))
    argv += ["--sample-interval-ms", "500", *options]
    log = (tmp_path / "dashboard.log").open("wb")
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: _answers(url, proc), PAGE_DEADLINE_S, "the dashboard to listen")
        yield url
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
        log.close()


def _answers(url: str, proc: subprocess.Popen[bytes]) -> bool:
    if proc.poll() is not None:
        raise AssertionError(f"mqdashboard exited with {proc.returncode}")
    try:
        with urllib.request.urlopen(url + "/api/series", timeout=2) as resp:
            return bool(resp.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def _fill(group: LocalCluster) -> None:
    """A topic with keyed messages (one hostile), a consumer group with lag on some queues,
    and one dead letter."""
    assert group.namesrv is not None
    create_topic(group, TOPIC, 4)
    security = group.client_security()
    with Producer("dash-producer", group.namesrv.addr, security=security) as producer:
        for i in range(40):
            producer.send(Message(TOPIC, f"order body {i}".encode(), "tagA", (f"order-{i}",)))
        producer.send(
            Message(TOPIC, HOSTILE.encode(), "<i>t</i>", ("xss-1",), {"note": '"><svg onload=1>'})
        )
    with PullConsumer(GROUP, group.namesrv.addr, security) as consumer:
        queues = consumer.fetch_queues(TOPIC)
        first = consumer.pull(queues[0], 0, 1).messages[0]
        consumer.update_offset(queues[0], 3)
        consumer.update_offset(queues[1], 1)
    request = bpb.ConsumerSendMsgBackRequest(
        consumer_group=GROUP,
        messages=[
            bpb.SendBackItem(commitlog_position=first.commitlog_position, msg_id=first.msg_id)
        ],
        delay_level=-1,
    )
    channels = ChannelPool(security)

    def dead_lettered() -> bool:
        leader = group.node(group.wait_leader()).client_addr
        try:
            channels.broker(leader).ConsumerSendMsgBack(request, timeout=5)
        except grpc.RpcError:  # a loaded machine: a slow connect, an election
            return False
        return True

    try:
        wait_for(dead_lettered, PAGE_DEADLINE_S, "a dead letter")
    finally:
        channels.close()


class Traffic:
    """Sends for the live charts, bounded in count and time, until stopped, and a push
    consumer of another group reading them (the consume-rate chart)."""

    MAX_MESSAGES = 2_000
    MAX_SECONDS = 20.0

    def __init__(self, group: LocalCluster) -> None:
        assert group.namesrv is not None
        self.producer = Producer(
            "dash-traffic", group.namesrv.addr, security=group.client_security()
        )
        self.consumer = PushConsumer(
            LIVE_GROUP, group.namesrv.addr, security=group.client_security()
        )
        self.consumer.subscribe(TOPIC, "*")
        self.consumer.register_listener(lambda msgs: ConsumeStatus.CONSUME_SUCCESS)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        deadline = time.monotonic() + self.MAX_SECONDS
        for i in range(self.MAX_MESSAGES):
            if self.stop.is_set() or time.monotonic() > deadline:
                return
            try:
                self.producer.send(Message(TOPIC, f"live {i}".encode()))
            except Exception:  # a failover in the middle: the chart shows the dip
                time.sleep(0.05)
            self.stop.wait(0.01)

    def __enter__(self) -> Traffic:
        self.producer.start()
        self.consumer.start()
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(10)
        self.producer.shutdown()
        self.consumer.shutdown()


def _shot(driver: Any, name: str) -> None:
    OUTPUT.mkdir(parents=True, exist_ok=True)
    assert driver.save_screenshot(str(OUTPUT / f"{name}.png"))


def _open(driver: Any, url: str, expect: str) -> str:
    """Load ``url`` (again until ``expect`` shows, within the deadline); the page's text."""
    from selenium.webdriver.common.by import By

    text = ""

    def shows() -> bool:
        nonlocal text
        driver.get(url)
        text = driver.find_element(By.TAG_NAME, "body").text
        return expect in text

    wait_for(shows, PAGE_DEADLINE_S, f"{expect!r} on {url}")
    return text


def _leader_row(driver: Any) -> tuple[str, int]:
    from selenium.webdriver.common.by import By

    rows = driver.find_elements(By.CSS_SELECTOR, "tr.role-leader")
    if len(rows) != 1:
        return "", 0
    return rows[0].get_attribute("data-node"), int(
        rows[0].find_element(By.CSS_SELECTOR, ".term").text
    )


def _resend_all(driver: Any, credentials: dict[str, str], shot: str = "") -> str:
    """From a consumer page: "Resend all", confirmed with ``credentials``; the answer shown."""
    from selenium.webdriver.common.by import By

    driver.find_element(By.LINK_TEXT, "Resend all…").click()
    driver.find_element(By.NAME, "access_key").send_keys(credentials["accessKey"])
    driver.find_element(By.NAME, "secret_key").send_keys(credentials["secretKey"])
    if shot:
        _shot(driver, shot)
    driver.find_element(By.ID, "do").click()
    wait_for(
        lambda: bool(driver.find_elements(By.CSS_SELECTOR, "#done, #error")),
        PAGE_DEADLINE_S,
        "the resend's answer",
    )
    return str(driver.find_element(By.CSS_SELECTOR, "#done, #error").text)


def test_dashboard_in_a_browser(browser: Any, group: LocalCluster, dashboard: str) -> None:
    from selenium.webdriver.common.by import By

    driver = browser
    _fill(group)
    with Traffic(group):
        # Cluster: every node with its role, term, lag and disk.
        text = _open(driver, dashboard + "/", "LEADER")
        assert text.count("FOLLOWER") >= 2 and "n0" in text and "n2" in text
        assert " %" in text  # disk used
        _shot(driver, "clusters")
        _open(driver, dashboard + "/topics", TOPIC)
        _shot(driver, "topics")
        _open(driver, dashboard + f"/topic?name={TOPIC}", "max offset")
        _shot(driver, "topic")
        _open(driver, dashboard + "/consumers", GROUP)
        _shot(driver, "consumers")
        # Live charts: drawn from successive samples, updated without a reload.
        driver.get(dashboard + "/charts")

        def drawn() -> bool:
            samples = driver.find_element(By.ID, "charts").get_attribute("data-samples")
            charts = driver.find_elements(By.CSS_SELECTOR, "figure[data-series]")
            return int(samples or 0) >= 6 and all(
                c.find_elements(By.TAG_NAME, "polyline") for c in charts
            )

        try:
            wait_for(drawn, PAGE_DEADLINE_S, "every chart to draw six samples")
        except AssertionError:
            with urllib.request.urlopen(dashboard + "/api/series", timeout=5) as resp:
                raise AssertionError(resp.read()[:2000]) from None
        _shot(driver, "charts")
    # Find a message by key: its body and properties.
    text = _open(driver, dashboard + f"/messages?mode=key&topic={TOPIC}&key=order-7", "1 message")
    assert "order body 7" in text and "order-7" in text
    _shot(driver, "messages")
    # Hostile values are shown as text: nothing of them runs or becomes markup.
    _open(driver, dashboard + f"/messages?mode=key&topic={TOPIC}&key=xss-1", "1 message")
    body = driver.find_element(By.CSS_SELECTOR, "pre.body").text
    assert body == HOSTILE
    assert driver.execute_script("return window.__xss === undefined")
    assert not driver.find_elements(By.CSS_SELECTOR, "main img, main svg, main b")
    assert '"><svg onload=1>' in driver.find_element(By.CSS_SELECTOR, "table.props").text
    _shot(driver, "messages_hostile")
    # The consumer group: lag per queue, and its dead letter, resent after confirming with the
    # admin's credentials (a secure group: the dashboard's own credentials only read).
    text = _open(driver, dashboard + f"/consumer?group={GROUP}", "Resend all")
    assert TOPIC in text
    _shot(driver, "consumer")
    # The dashboard's own read-only user may not act: refused, nothing resent.
    assert group.namesrv is not None
    admin = MQAdmin(group.namesrv.addr, group.client_security())
    written = sum(q.max_offset for q in admin.topic_status(TOPIC))
    answer = _resend_all(driver, VIEWER)
    assert "PERMISSION_DENIED" in answer, answer
    assert sum(q.max_offset for q in admin.topic_status(TOPIC)) == written
    _open(driver, dashboard + f"/consumer?group={GROUP}", "Resend all")
    credentials = json.loads(Path(group.layout.admin_credentials).read_text())
    answer = _resend_all(driver, credentials, shot="confirm")
    assert "Resent 1 message" in answer, answer
    _shot(driver, "resent")
    # A SIGKILLed leader: the page shows another leader in a higher term.
    _open(driver, dashboard + "/", "LEADER")
    old_leader, old_term = _leader_row(driver)
    assert old_leader
    group.signal(old_leader, signal.SIGKILL)

    def new_leader() -> bool:
        driver.get(dashboard + "/")
        leader, term = _leader_row(driver)
        return bool(leader) and leader != old_leader and term > old_term

    wait_for(new_leader, FAILOVER_DEADLINE_S, f"a leader other than {old_leader}")
    killed = driver.find_element(By.CSS_SELECTOR, f'tr[data-node="{old_leader}"]').text
    assert "UNREACHABLE" in killed
    _shot(driver, "clusters_after_kill")


# -- the operations: topics, subscription groups, a test send; the NameServer down ----------

NEW_TOPIC = "DashMade"
NEW_GROUP = "dash-made"
NEW_PRODUCER = "dash-producer"


def _act(
    driver: Any,
    button: str,
    fields: dict[str, str],
    credentials: dict[str, str],
    shot: str = "",
) -> str:
    """On the current page: fill ``fields`` of the form of ``button``, press it, confirm with
    ``credentials`` (screenshot ``shot`` of the confirmation page); the answer shown."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    form = driver.find_element(By.ID, button).find_element(By.XPATH, "./ancestor::form")
    for name, value in fields.items():
        element = form.find_element(By.NAME, name)
        if element.tag_name == "select":
            Select(element).select_by_value(value)
        else:
            element.clear()
            element.send_keys(value)
    driver.find_element(By.ID, button).click()
    wait_for(
        lambda: bool(driver.find_elements(By.CSS_SELECTOR, "#do, #error")),
        PAGE_DEADLINE_S,
        "the confirmation page",
    )
    if not driver.find_elements(By.ID, "do"):
        return str(driver.find_element(By.ID, "error").text)
    if credentials:  # else logged in: the page asks for no keys
        driver.find_element(By.NAME, "access_key").send_keys(credentials["accessKey"])
        driver.find_element(By.NAME, "secret_key").send_keys(credentials["secretKey"])
    if shot:
        _shot(driver, shot)
    driver.find_element(By.ID, "do").click()
    wait_for(
        lambda: bool(driver.find_elements(By.CSS_SELECTOR, "#done, #error")),
        PAGE_DEADLINE_S,
        "the action's answer",
    )
    return str(driver.find_element(By.CSS_SELECTOR, "#done, #error").text)


def _login(driver: Any, dashboard: str, credentials: dict[str, str]) -> None:
    """Log in on the login page: a wrong SecretKey is refused first, then ``credentials``."""
    from selenium.webdriver.common.by import By

    for secret, expect in (("wrong-secret-0001", "#error"), (credentials["secretKey"], "")):
        _open(driver, dashboard + "/login", "Log in with a user")
        driver.find_element(By.NAME, "access_key").send_keys(credentials["accessKey"])
        driver.find_element(By.NAME, "secret_key").send_keys(secret)
        if expect == "":
            _shot(driver, "login")
        driver.find_element(By.ID, "do-login").click()
        wait_for(
            lambda: bool(driver.find_elements(By.CSS_SELECTOR, "#logged-in, #error")),
            PAGE_DEADLINE_S,
            "the login's answer",
        )
        if expect:
            assert "UNAUTHENTICATED" in driver.find_element(By.ID, "error").text
            assert not driver.get_cookies()
    assert driver.find_element(By.ID, "session-user").text == credentials["accessKey"]
    [cookie] = driver.get_cookies()
    assert cookie["name"] == "mqdashboard_session" and cookie["httpOnly"]
    assert cookie["sameSite"] == "Strict"
    assert credentials["secretKey"] not in cookie["value"]


def _topic_queues(admin: MQAdmin, topic: str) -> int:
    try:
        return len(admin.topic_status(topic))
    except MQClientError:
        return 0


def _sub_group(admin: MQAdmin, group: str) -> list[bpb.SubscriptionGroup]:
    return [c for cs in admin.sub_groups().values() for c in cs if c.group == group]


def test_dashboard_actions_in_a_browser(browser: Any, group: LocalCluster, dashboard: str) -> None:
    """Create a topic, send it a test message, create and delete a subscription group, each
    confirmed with the admin's keys, each checked through mqadmin's calls; the dashboard's
    read-only user refused; the clients and config pages; a login as the admin (a wrong
    SecretKey refused first) deleting the topic without keys, and a logout; then the
    NameServer killed: the page says so."""
    from selenium.webdriver.common.by import By

    driver = browser
    assert group.namesrv is not None
    admin = MQAdmin(group.namesrv.addr, group.client_security())
    credentials = json.loads(Path(group.layout.admin_credentials).read_text())
    # A topic, 2 queues, on every broker group.
    _open(driver, dashboard + "/topics", "Create or update a topic")
    fields = {"topic": NEW_TOPIC, "queues": "2", "perm": "6", "message_type": "NORMAL"}
    answer = _act(driver, "topic-create", fields, credentials, shot="action_topic_confirm")
    assert f"Topic {NEW_TOPIC} created or updated on broker-a" in answer, answer
    _shot(driver, "action_topic_done")
    assert _topic_queues(admin, NEW_TOPIC) == 2
    # A test message with a hostile body: shown as text on the confirmation page, stored as typed.
    _open(driver, dashboard + f"/topic?name={NEW_TOPIC}", "Send a test message")
    fields = {"tag": "probe", "keys": "probe-1 probe-2", "body": HOSTILE}
    answer = _act(driver, "send", fields, credentials, shot="action_send_confirm")
    assert answer.startswith("Sent"), answer
    assert driver.execute_script("return window.__xss === undefined")
    sent_id = driver.find_element(By.ID, "sent-id").text
    _shot(driver, "action_send_done")
    [found] = admin.query_msg_by_key(NEW_TOPIC, "probe-2", 4)
    assert (found.msg_id, found.tags, found.body) == (sent_id, "probe", HOSTILE.encode())
    # Clients: a live producer and consumer of the new topic, listed per broker group with
    # their client id, address, language and version.
    consumer = PushConsumer(NEW_GROUP, group.namesrv.addr, security=group.client_security())
    consumer.subscribe(NEW_TOPIC, "*")
    consumer.register_listener(lambda msgs: ConsumeStatus.CONSUME_SUCCESS)
    consumer.start()
    producer = Producer(NEW_PRODUCER, group.namesrv.addr, security=group.client_security())
    try:
        producer.start()
        producer.send(Message(NEW_TOPIC, b"a producer to list"))
        _open(driver, dashboard + "/clients", NEW_PRODUCER)
        _open(driver, dashboard + "/clients", NEW_GROUP)
        for table, name, client_id in (
            ("producers", NEW_PRODUCER, producer.client_id),
            ("clients", NEW_GROUP, consumer.client_id),
        ):
            [row] = driver.find_elements(By.CSS_SELECTOR, f"#{table} tbody tr")
            cells = [td.text for td in row.find_elements(By.TAG_NAME, "td")]
            assert cells[:3] == [name, "broker-a", client_id], cells
            assert cells[3].startswith("127.0.0.1:") and cells[4:6] == ["PYTHON", RELEASE], cells
        _shot(driver, "clients")
    finally:
        producer.shutdown()
        consumer.shutdown()
    # The config of every node, as the dashboard's read-only user reads it.
    text = _open(driver, dashboard + "/config", "broker-a/n2")
    assert "broker-a/n0" in text and "broker-a/n1" in text
    assert len(driver.find_elements(By.CSS_SELECTOR, "#config tr[data-key]")) >= 10
    _shot(driver, "config")
    # The dashboard's own read-only user may not delete: the broker's refusal, nothing deleted.
    _open(driver, dashboard + f"/topic?name={NEW_TOPIC}", "Delete topic")
    answer = _act(driver, "topic-delete", {}, VIEWER)
    assert "PERMISSION_DENIED" in answer, answer
    _shot(driver, "action_refused")
    assert _topic_queues(admin, NEW_TOPIC) == 2
    # A subscription group: orderly, 3 retries; then deleted.
    _open(driver, dashboard + "/consumers", "Create or update a subscription group")
    fields = {"group": NEW_GROUP, "orderly": "true", "retries": "3"}
    answer = _act(driver, "group-create", fields, credentials, shot="action_group_confirm")
    assert f"Subscription group {NEW_GROUP} created or updated on broker-a" in answer, answer
    [config] = _sub_group(admin, NEW_GROUP)
    assert config.consume_message_orderly and config.max_delivery_attempts == 4
    _open(driver, dashboard + "/consumers", "Delete a subscription group")
    answer = _act(driver, "group-delete", {"group": NEW_GROUP}, credentials)
    assert f"Subscription group {NEW_GROUP} deleted on broker-a" in answer, answer
    assert _sub_group(admin, NEW_GROUP) == []
    # Log in as the admin: a session cookie (HttpOnly, SameSite=Strict), and the topic deleted
    # without typing keys, signed as the session's user; then log out.
    _login(driver, dashboard, credentials)
    _open(driver, dashboard + f"/topic?name={NEW_TOPIC}", "Delete topic")
    answer = _act(driver, "topic-delete", {}, {}, shot="action_signed_as")
    assert f"Topic {NEW_TOPIC} deleted on broker-a" in answer, answer
    driver.find_element(By.ID, "logout").click()
    wait_for(lambda: bool(driver.find_elements(By.ID, "logged-out")), PAGE_DEADLINE_S, "logout")
    assert not driver.find_elements(By.ID, "session-user")
    assert not driver.get_cookies()
    wait_for(
        lambda: NEW_TOPIC not in admin.topic_list(), PAGE_DEADLINE_S, "the topic to leave routes"
    )
    # The NameServer down: every page is one banner naming it.
    group.signal_namesrv(signal.SIGKILL)
    for path in ("/", "/topics", "/consumers", "/charts"):
        text = _open(driver, dashboard + path, "is unreachable")
        assert f"The NameServer {group.namesrv.addr} is unreachable." in text
        assert len(driver.find_elements(By.CSS_SELECTOR, ".error, .warning")) == 1
        if path == "/":
            _shot(driver, "namesrv_down")


# -- a cluster of two broker groups (mqcluster up --groups 2) --------------------------------

SPREAD_TOPIC = "DashSpread"
SPREAD_GROUP = "dash-spread"
# Sends per broker group, each to a queue of that group (so that both hold messages).
SENDS_PER_GROUP = 12
BROKER_GROUPS = ("broker-a", "broker-b")


@pytest.fixture
def two_groups(tmp_path: Path) -> Iterator[Groups]:
    """Two secure 3-node groups under one NameServer, one CA and one admin."""
    cluster = Groups(tmp_path / "cluster")
    extra = {"mappedFileSizeCommitLog": str(4 << 20), "registerBrokerPeriod": "1000"}
    try:
        cluster.configure(2, 3, auto_ports=True, extra=extra, namesrv=True, secure=True)
        cluster.up()
        yield cluster
    finally:
        Groups(tmp_path / "cluster").down(grace_s=5.0)


@pytest.fixture
def groups_dashboard(two_groups: Groups, tmp_path: Path) -> Iterator[str]:
    tool_argv = two_groups.first.tool_argv()
    with _run_dashboard(two_groups.namesrv_addr, two_groups.security(), tool_argv, tmp_path) as url:
        yield url


class _OnGroup:
    """A queue selector: the first queue of one broker group."""

    def __init__(self, group: str) -> None:
        self.group = group

    def select(self, queues: list[MessageQueue], msg: Message, arg: object) -> MessageQueue:
        return next(q for q in queues if q.broker_name == self.group)


def _fill_groups(groups: Groups) -> None:
    """A topic on both groups, each holding SENDS_PER_GROUP keyed messages."""
    admin = MQAdmin(groups.namesrv_addr, groups.security())
    assert admin.create_topic(SPREAD_TOPIC, 2) == list(BROKER_GROUPS)
    with Producer("dash-spread-p", groups.namesrv_addr, security=groups.security()) as producer:
        for name in BROKER_GROUPS:
            for i in range(SENDS_PER_GROUP):
                body = f"{name} body {i}".encode()
                sent = producer.send(
                    Message(SPREAD_TOPIC, body, keys=(f"{name}-{i}",)), _OnGroup(name)
                )
                assert sent.message_queue.broker_name == name


def _group_rows(driver: Any, name: str) -> dict[str, tuple[str, int]]:
    """node -> (role, term) of broker group ``name``'s section of the cluster page."""
    from selenium.webdriver.common.by import By

    out = {}
    for row in driver.find_elements(By.CSS_SELECTOR, f'tr[data-group="{name}"]'):
        role = row.find_element(By.CSS_SELECTOR, ".role").text
        term = row.find_element(By.CSS_SELECTOR, ".term").text
        out[row.get_attribute("data-node")] = (role, int(term) if term.isdigit() else 0)
    return out


def _one_leader(rows: dict[str, tuple[str, int]]) -> str:
    leaders = [node for node, (role, _) in rows.items() if role == "LEADER"]
    return leaders[0] if len(leaders) == 1 else ""


# Six nodes, a NameServer, a dashboard, a consumer and the browser on 2 cores beside another
# test session: the first page with both groups settled (every member registered and answering
# Metadata, one leader each) came later than PAGE_DEADLINE_S once in about 15 loaded runs; the
# wait ends as soon as the page shows it.
GROUPS_SETTLED_S = 60.0


def test_dashboard_shows_every_group_of_a_cluster(
    browser: Any, two_groups: Groups, groups_dashboard: str, consumers: list[PushConsumer]
) -> None:
    """Two broker groups: the cluster page holds both with their members and Raft state, the
    topic pages show the topic spread over both with each group's queues and offsets, a
    consumer online on both groups counts once, a message stored on the second group is found
    by key, and the second group's leader change shows while the first's stays."""
    from selenium.webdriver.common.by import By

    driver, url = browser, groups_dashboard
    _fill_groups(two_groups)
    consumer = PushConsumer(SPREAD_GROUP, two_groups.namesrv_addr, security=two_groups.security())
    consumers.append(consumer)
    consumer.subscribe(SPREAD_TOPIC, "*")
    consumer.register_listener(lambda msgs: ConsumeStatus.CONSUME_SUCCESS)
    consumer.start()

    seen: list[dict[str, dict[str, tuple[str, int]]]] = [{}]

    def both_led() -> bool:
        driver.get(url + "/")
        seen[0] = {g: _group_rows(driver, g) for g in BROKER_GROUPS}
        return all(len(rows) == 3 and _one_leader(rows) for rows in seen[0].values())

    try:
        wait_for(both_led, GROUPS_SETTLED_S, "both groups, each with 3 members and a leader")
    except AssertionError as exc:
        banner = driver.find_elements(By.CSS_SELECTOR, ".banner, .error")
        raise AssertionError(
            f"{exc}; the page last showed {seen[0]}; banners: {[b.text for b in banner]}"
        ) from None
    summary = driver.find_element(By.ID, "summary").text
    assert summary.startswith("2 broker groups, 6 nodes"), summary
    _shot(driver, "groups_clusters")
    # The topic list: spread over both groups, two queues each.
    # (Routes are read again when 5 s old: the dashboard may have read this one while only
    # broker-a had registered the topic.)
    _open(driver, url + "/topics", "broker-b (2)")
    row = driver.find_element(By.XPATH, f'//table[@id="topics"]//tr[td/a[.="{SPREAD_TOPIC}"]]')
    assert row.find_element(By.CSS_SELECTOR, ".groups").text == "broker-a (2), broker-b (2)"
    _shot(driver, "groups_topics")
    # The topic: each group's queues with what it stored.
    _open(driver, url + f"/topic?name={SPREAD_TOPIC}", "max offset")
    stored: dict[str, int] = {}
    for tr in driver.find_elements(By.CSS_SELECTOR, "main table tbody tr"):
        cells = [td.text for td in tr.find_elements(By.TAG_NAME, "td")]
        stored[cells[0]] = stored.get(cells[0], 0) + int(cells[3])
    assert stored == dict.fromkeys(BROKER_GROUPS, SENDS_PER_GROUP), stored

    # The consumer group: its one client online on both groups, lag rows of both once it
    # committed offsets on each (the push consumer commits every few seconds); the list of
    # groups counts that client once.
    def on_both() -> bool:
        driver.get(url + f"/consumer?group={SPREAD_GROUP}")
        rows = driver.find_elements(By.CSS_SELECTOR, "#clients tbody tr")
        clients = {r.find_element(By.TAG_NAME, "td").text for r in rows}
        lag = driver.find_element(By.ID, "lag").text
        committed = all(f"{SPREAD_TOPIC} {name} 0" in lag for name in BROKER_GROUPS)
        return clients == set(BROKER_GROUPS) and committed

    wait_for(on_both, PAGE_DEADLINE_S, f"{SPREAD_GROUP}'s client and offsets on both groups")
    _shot(driver, "groups_consumer")
    _open(driver, url + "/consumers", SPREAD_GROUP)
    row = driver.find_element(By.XPATH, f'//tr[td/a[.="{SPREAD_GROUP}"]]')
    assert row.find_elements(By.TAG_NAME, "td")[2].text == "1", row.text
    # A message the second group stored, found by its key.
    search = f"/messages?mode=key&topic={SPREAD_TOPIC}&key=broker-b-3"
    text = _open(driver, url + search, "1 message")
    assert "broker-b body 3" in text
    # Logged in as the admin (checked with both groups), a topic made on broker-b only.
    creds = two_groups.security().credentials
    assert creds is not None
    _login(driver, url, {"accessKey": creds.access_key, "secretKey": creds.secret_key})
    assert "broker-a, broker-b" in driver.find_element(By.ID, "logged-in").text
    _open(driver, url + "/topics", "Create or update a topic")
    fields = {"topic": "DashOnB", "queues": "3", "perm": "6", "broker": "broker-b"}
    answer = _act(driver, "topic-create", fields, {})
    assert answer == "Topic DashOnB created or updated on broker-b.", answer
    admin = MQAdmin(two_groups.namesrv_addr, two_groups.security())
    route = admin.topic_route_info("DashOnB")
    assert [(g.broker_name, g.write_queue_nums) for g in route.groups] == [("broker-b", 3)]
    # broker-b's leader SIGKILLed: its section shows another leader in a higher term, and
    # broker-a's keeps its leader and term.
    driver.get(url + "/")
    a_before, b_before = _group_rows(driver, "broker-a"), _group_rows(driver, "broker-b")
    b_leader = _one_leader(b_before)
    two_groups.group("broker-b").signal(b_leader, signal.SIGKILL)

    def b_moved() -> bool:
        driver.get(url + "/")
        rows = _group_rows(driver, "broker-b")
        now = _one_leader(rows)
        return bool(now) and now != b_leader and rows[now][1] > b_before[b_leader][1]

    wait_for(b_moved, FAILOVER_DEADLINE_S, f"broker-b led by a node other than {b_leader}")
    assert _group_rows(driver, "broker-b")[b_leader][0] == "UNREACHABLE"
    a_after = _group_rows(driver, "broker-a")
    assert _one_leader(a_after) == _one_leader(a_before)
    assert a_after[_one_leader(a_after)][1] == a_before[_one_leader(a_before)][1]
    _shot(driver, "groups_clusters_after_kill")
