"""The dashboard's web application (Starlette, served by uvicorn): the pages, the charts' JSON,
the confirmed actions (topics, subscription groups, a test send, resend, reset) and the login
of a secure group.

Every value shown comes from the cluster and is hostile input (message bodies, keys,
properties, client ids): the templates escape everything (Jinja2 autoescape, never
``|safe``), the charts' script writes text with ``textContent`` only, and the Content
Security Policy allows no inline script. A page whose reads fail shows the error, never a
blank page; with no NameServer answering, one banner naming it. Reads use the dashboard's own
security; an action runs only from a POST carrying the page's token, after the user confirmed
on a page of its own, and on a secure group as the acting user: the logged-in session's, or
the AccessKey and SecretKey typed there (never the dashboard's own credentials).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import hmac
import logging
import secrets
import urllib.parse
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

import jinja2
from raftmq.broker.v1 import broker_pb2 as pb
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.middleware import Middleware
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.templating import Jinja2Templates
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from client.errors import MQClientError
from client.message import Message as MQMessage
from mqdashboard.reader import (
    MAX_CLIENT_GROUPS,
    MAX_MESSAGES,
    GroupReader,
    TopicSpec,
    TopicView,
    error_text,
)
from mqdashboard.sampler import Sampler
from mqdashboard.sessions import COOKIE_NAME, Session, SessionTable
from mqerrors import codes as E
from mqsecurity.channels import ClientSecurity
from mqsecurity.credentials import Credentials
from mqsecurity.errors import SecurityError

log = logging.getLogger(__name__)

# Inputs from the browser, bounded before anything reaches the cluster.
MAX_NAME_CHARS = 255  # topic and consumer group names (the broker's limit)
MAX_KEY_CHARS = 1024
MAX_ID_CHARS = 64
MAX_FORM_BYTES = 8 << 10
# The actions, each a confirmation page (GET /actions/<name>?...) and its POST. Ordered as the
# ACL test runs them: the deleting ones last.
ACTIONS = (
    "resend",
    "reset",
    "send",
    "topic-update",
    "group-update",
    "group-delete",
    "topic-delete",
)
# The client-port calls each action makes, as the acting user (the credentials typed on its page
# or the session's user): the brokers' guard decides each one (broker/frontends/rpcmap.py;
# docs/SECURITY.md, "The other ports"). resend pulls the group's dead letters (%DLQ%<group>, as
# the group) and sends each to its original topic; reset sets the group's offsets; the others
# are one call each, on every broker group concerned. Checked against the calls an action
# really makes by tests/unit/test_acl_matrix.py.
_BROKER = "/raftmq.broker.v1.Broker/"
ACTION_CALLS: Mapping[str, tuple[str, ...]] = {
    "resend": (_BROKER + "PullMessage", _BROKER + "SendMessage"),
    "reset": (_BROKER + "ResetConsumerOffset",),
    "send": (_BROKER + "SendMessage",),
    "topic-update": (_BROKER + "CreateTopic",),
    "topic-delete": (_BROKER + "DeleteTopic",),
    "group-update": (_BROKER + "UpdateSubscriptionGroup",),
    "group-delete": (_BROKER + "DeleteSubscriptionGroup",),
}
# A topic's permission as the form offers it (RocketMQ's perm bits: 4 read, 2 write).
PERMS: Mapping[int, str] = {6: "read and write", 4: "read only", 2: "write only"}
# The broker's topic message types (broker/state/records.py TOPIC_MESSAGE_TYPES): "" is MIXED.
MESSAGE_TYPES = ("MIXED", "NORMAL", "FIFO", "DELAY", "TRANSACTION")
MAX_QUEUES = 1024  # read and write queues per broker group (the broker's MAX_QUEUE_NUMS)
MAX_RETRIES = 999  # the broker's max delivery attempts is 1 to 1000: the first plus retries
MAX_TAG_CHARS = 255
# A test message's body: a page's test, well inside MAX_FORM_BYTES once urlencoded.
MAX_BODY_CHARS = 2048
SECURITY_HEADERS = (
    (
        b"content-security-policy",
        b"default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
        b"connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
    ),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"same-origin"),  # no-referrer would make Origin "null"
    (b"cache-control", b"no-store"),
)


class BadInput(ValueError):
    """A request the dashboard refuses before calling the cluster (400)."""


class LoginRefused(BadInput):
    """A login the group refused: an unknown AccessKey or a wrong SecretKey (401)."""


class TooManyLogins(BadInput):
    """A login tried while too many failed (429): the group is not asked."""


@dataclass
class Settings:
    """What the pages need besides the reader: the token that POSTs must carry, and whether
    actions need the user's credentials (the dashboard itself signs its reads)."""

    namesrv_addr: str
    actions_need_credentials: bool
    csrf_token: str = field(default_factory=lambda: secrets.token_urlsafe(32))
    # Logins (a secure group only): the sessions of the users who logged in.
    sessions: SessionTable = field(default_factory=SessionTable)


class SecurityHeaders:
    """Adds the Content Security Policy and friends to every response."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                message.setdefault("headers", [])
                message["headers"] = [*message["headers"], *SECURITY_HEADERS]
            await send(message)

        await self.app(scope, receive, send_with_headers)


def _templates() -> Jinja2Templates:
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("mqdashboard", "templates"),
        autoescape=True,  # every value, whatever the template's name
        undefined=jinja2.ChainableUndefined,  # a page rendered after an error misses fields
    )
    env.filters["human_bytes"] = human_bytes
    env.filters["rate"] = format_rate
    env.filters["percent"] = lambda v: "-" if v is None else f"{v:.1f} %"
    return Jinja2Templates(env=env)


def human_bytes(n: int) -> str:
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def format_rate(value: float | None) -> str:
    return "-" if value is None else f"{value:,.1f}/s"


# -- inputs ----------------------------------------------------------------------------------


def bounded(value: str, name: str, max_chars: int, required: bool = True) -> str:
    value = value.strip()
    if required and not value:
        raise BadInput(f"{name} is required")
    if len(value) > max_chars:
        raise BadInput(f"{name} is {len(value)} characters, more than {max_chars}")
    if any(ord(c) < 32 for c in value):
        raise BadInput(f"{name} holds control characters")
    return value


def parse_time_ms(value: str, name: str) -> int:
    """Milliseconds since the epoch, or a UTC date and time (``2026-11-24T21:05``, what a
    ``datetime-local`` field sends, seconds optional)."""
    value = bounded(value, name, 32)
    if value.isdigit():
        ms = int(value)
    else:
        try:
            stamp = dt.datetime.fromisoformat(value)
        except ValueError:
            raise BadInput(f"{name}: not a time: {value!r}") from None
        if stamp.tzinfo is None:
            stamp = stamp.replace(tzinfo=dt.UTC)
        ms = int(stamp.timestamp() * 1000)
    if not 0 <= ms < 1 << 53:
        raise BadInput(f"{name}: out of range")
    return ms


def time_input(ms: int) -> str:
    """The value of a ``datetime-local`` field for ``ms`` (UTC, to the second)."""
    return dt.datetime.fromtimestamp(ms / 1000, tz=dt.UTC).strftime("%Y-%m-%dT%H:%M:%S")


async def read_form(request: Request) -> dict[str, str]:
    """A urlencoded form, at most MAX_FORM_BYTES; one value per field."""
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_FORM_BYTES:
            raise BadInput(f"form larger than {MAX_FORM_BYTES} bytes")
    try:
        pairs = urllib.parse.parse_qsl(body.decode("utf-8"), keep_blank_values=True)
    except (UnicodeDecodeError, ValueError):
        raise BadInput("the form is not urlencoded UTF-8") from None
    return dict(pairs)


# -- the application -------------------------------------------------------------------------


class Dashboard:
    """The request handlers over one reader, one sampler and the settings."""

    def __init__(self, reader: GroupReader, sampler: Sampler, settings: Settings) -> None:
        self.reader = reader
        self.sampler = sampler
        self.settings = settings
        self.templates = _templates()

    async def render(
        self,
        request: Request,
        template: str,
        build: Callable[[], dict[str, Any]],
        base: dict[str, Any] | None = None,
    ) -> Response:
        """``build()`` in a worker thread, rendered into ``template``; when it fails, the same
        page with the error instead of its data."""
        session = self.session(request)
        context: dict[str, Any] = {
            "namesrv": self.settings.namesrv_addr,
            "sample_errors": self.sampler.errors_now(),
            "login_enabled": self.settings.actions_need_credentials,
            "session_user": session.user if session else "",
            "csrf": self.settings.csrf_token,
            **(base or {}),
        }
        status = 200
        down = await run_in_threadpool(self.reader.namesrv_problem)
        if down:
            # One banner that names the NameServer: the sampler's warnings and the page's own
            # reads would all say the same thing less clearly; nothing is read or called.
            context.update(namesrv_down=down, error=down, sample_errors=[])
            return self.templates.TemplateResponse(request, template, context, status_code=502)
        try:
            context.update(await run_in_threadpool(build))
        except LoginRefused as exc:
            context["error"], status = str(exc), 401
        except TooManyLogins as exc:
            context["error"], status = str(exc), 429
        except BadInput as exc:
            context["error"], status = str(exc), 400
        except (MQClientError, SecurityError) as exc:
            context["error"], status = error_text(exc), 502
        except Exception as exc:
            log.exception("page %s failed", request.url.path)
            context["error"], status = error_text(exc), 500
        return self.templates.TemplateResponse(request, template, context, status_code=status)

    def session(self, request: Request) -> Session | None:
        """The live session of the request's cookie, or None."""
        return self.settings.sessions.get(request.cookies.get(COOKIE_NAME, ""))

    async def clusters(self, request: Request) -> Response:
        return await self.render(
            request, "clusters.html", lambda: {"groups": self.reader.clusters()}
        )

    async def topics(self, request: Request) -> Response:
        def build() -> dict[str, Any]:
            topics = self.reader.topics()
            rates = {t.name: self.sampler.send_rate(t.name) for t in topics}
            return {
                "topics": topics,
                "rates": rates,
                "brokers": self.reader.broker_names(),
                "perms": PERMS,
                "message_types": MESSAGE_TYPES,
            }

        return await self.render(request, "topics.html", build)

    async def topic(self, request: Request) -> Response:
        name = request.query_params.get("name", "")

        def build() -> dict[str, Any]:
            topic: TopicView = self.reader.topic(bounded(name, "topic", MAX_NAME_CHARS))
            if topic.error:
                raise MQClientError.local(E.READ_FAILED, topic.error)
            return {"topic": topic, "rate": self.sampler.send_rate(topic.name)}

        return await self.render(request, "topic.html", build, {"name": name})

    async def consumers(self, request: Request) -> Response:
        def build() -> dict[str, Any]:
            groups = self.reader.consumer_groups()
            lag = {g.name: self.sampler.lag.latest(g.name) for g in groups}
            rates = {g.name: self.sampler.consume_rate(g.name) for g in groups}
            brokers = self.reader.broker_names()
            return {"groups": groups, "lag": lag, "rates": rates, "brokers": brokers}

        return await self.render(request, "consumers.html", build)

    async def consumer(self, request: Request) -> Response:
        name = request.query_params.get("group", "")

        def build() -> dict[str, Any]:
            group = bounded(name, "group", MAX_NAME_CHARS)
            known = {g.name: g for g in self.reader.consumer_groups()}
            topics = known[group].topics if group in known else []
            return {
                "rows": self.reader.consumer_lag(group, topics),
                "clients": self.reader.consumer_clients(group),
                "dead": self.reader.dead_letters(group),
                "known": group in known,
                "rate": self.sampler.consume_rate(group),
                "max_messages": MAX_MESSAGES,
            }

        return await self.render(
            request, "consumer.html", build, {"group": name, "now": time_input(_now_ms())}
        )

    async def messages(self, request: Request) -> Response:
        q = request.query_params
        form = {k: q.get(k, "") for k in ("topic", "key", "msg_id", "begin", "end", "mode")}
        if not form["begin"]:
            form["begin"] = time_input(_now_ms() - 3_600_000)
        if not form["end"]:
            form["end"] = time_input(_now_ms() + 60_000)

        def build() -> dict[str, Any]:
            mode = form["mode"]
            if not mode:
                return {}
            topic = bounded(form["topic"], "topic", MAX_NAME_CHARS)
            if mode == "key":
                return {
                    "found": self.reader.by_key(topic, bounded(form["key"], "key", MAX_KEY_CHARS))
                }
            if mode == "id":
                return {
                    "found": self.reader.by_id(
                        topic, bounded(form["msg_id"], "message id", MAX_ID_CHARS)
                    )
                }
            if mode == "time":
                begin = parse_time_ms(form["begin"], "from")
                end = parse_time_ms(form["end"], "to")
                if end <= begin:
                    raise BadInput("the time range is empty: 'to' must be after 'from'")
                found, cut = self.reader.by_time(topic, begin, end)
                return {"found": found, "cut": cut}
            raise BadInput(f"unknown search mode {mode[:16]!r}: key, id or time")

        return await self.render(
            request, "messages.html", build, {"form": form, "max_messages": MAX_MESSAGES}
        )

    async def config(self, request: Request) -> Response:
        def build() -> dict[str, Any]:
            nodes = self.reader.broker_configs()
            keys = sorted({k for n in nodes for k in n.config})
            differs = {k for k in keys if len({n.config.get(k) for n in nodes if not n.error}) > 1}
            return {"nodes": nodes, "keys": keys, "differs": differs}

        return await self.render(request, "config.html", build)

    async def clients(self, request: Request) -> Response:
        return await self.render(
            request,
            "clients.html",
            lambda: {
                "clients": self.reader.clients(),
                "producers": self.reader.producers(),
                "max_groups": MAX_CLIENT_GROUPS,
            },
        )

    async def charts(self, request: Request) -> Response:
        return await self.render(
            request, "charts.html", dict, {"interval_ms": self.sampler.interval_ms}
        )

    async def series(self, request: Request) -> Response:
        def build() -> dict[str, Any]:
            series = self.sampler.series()
            down = self.reader.namesrv_problem()
            if down:  # one line naming the NameServer, as the pages' banner
                series["errors"] = [
                    f"the NameServer {self.settings.namesrv_addr} is unreachable: {down}"
                ]
            return series

        return JSONResponse(await run_in_threadpool(build))


def _now_ms() -> int:
    return int(dt.datetime.now(tz=dt.UTC).timestamp() * 1000)


def _int_field(value: str, name: str, low: int, high: int) -> int:
    value = bounded(value, name, 8)
    if not value.isdigit() or not low <= int(value) <= high:
        raise BadInput(f"{name} must be a whole number from {low} to {high}")
    return int(value)


def _choice(value: str, name: str, choices: Collection[str]) -> str:
    value = bounded(value, name, 32, required=False)
    if value not in choices:
        raise BadInput(f"{name} {value[:32]!r} is not one of {', '.join(map(str, choices))}")
    return value


def _body(value: str) -> str:
    """A test message's body: any text but NUL and the other control characters besides
    newline and tab, at most MAX_BODY_CHARS."""
    if len(value) > MAX_BODY_CHARS:
        raise BadInput(f"body is {len(value)} characters, more than {MAX_BODY_CHARS}")
    if any(ord(c) < 32 and c not in "\n\r\t" for c in value):
        raise BadInput("body holds control characters")
    return value


def _broker(params: Mapping[str, str]) -> str:
    """The form's "on one broker group" choice ("": every group)."""
    return bounded(params.get("broker", ""), "broker group", MAX_NAME_CHARS, required=False)


def parse_action(action: str, p: Mapping[str, str]) -> dict[str, Any]:
    """The checked arguments of ``action`` from its form (the confirmation page shows them,
    the POST runs with them); BadInput on the first wrong field."""
    if action == "resend":
        return {
            "group": bounded(p.get("group", ""), "group", MAX_NAME_CHARS),
            "msg_id": bounded(p.get("msg_id", ""), "message id", MAX_ID_CHARS, False),
        }
    if action == "reset":
        return {
            "group": bounded(p.get("group", ""), "group", MAX_NAME_CHARS),
            "topic": bounded(p.get("topic", ""), "topic", MAX_NAME_CHARS),
            "time": parse_time_ms(p.get("time", ""), "time"),
        }
    if action == "send":
        keys = bounded(p.get("keys", ""), "keys", MAX_KEY_CHARS, False)
        return {
            "topic": bounded(p.get("topic", ""), "topic", MAX_NAME_CHARS),
            "tag": bounded(p.get("tag", ""), "tag", MAX_TAG_CHARS, False),
            "keys": tuple(keys.split()),
            "body": _body(p.get("body", "")),
        }
    if action in ("topic-update", "topic-delete"):
        args: dict[str, Any] = {
            "topic": bounded(p.get("topic", ""), "topic", MAX_NAME_CHARS),
            "broker": _broker(p),
        }
        if action == "topic-update":
            args["queues"] = _int_field(p.get("queues", ""), "queues", 1, MAX_QUEUES)
            args["perm"] = int(_choice(p.get("perm", ""), "perm", [str(k) for k in PERMS]))
            args["message_type"] = _choice(p.get("message_type", ""), "type", MESSAGE_TYPES)
        return args
    if action in ("group-update", "group-delete"):
        args = {"group": bounded(p.get("group", ""), "group", MAX_NAME_CHARS), "broker": _broker(p)}
        if action == "group-update":
            args["orderly"] = _choice(p.get("orderly", "false"), "orderly", ("true", "false"))
            retries = p.get("retries", "").strip()
            args["retries"] = _int_field(retries, "retries", 0, MAX_RETRIES) if retries else None
        return args
    raise BadInput(f"no action {action[:32]!r}: {', '.join(ACTIONS)}")


def run_action(
    reader: GroupReader, action: str, a: dict[str, Any], security: ClientSecurity
) -> dict[str, Any]:
    """Run the checked ``action`` as ``security``: what its result page shows."""
    if action == "resend":
        return {"resent": reader.resend_dlq(a["group"], a["msg_id"], security)}
    if action == "reset":
        return {"reset": reader.reset_offset(a["group"], a["topic"], a["time"], security)}
    if action == "send":
        msg = MQMessage(a["topic"], a["body"].encode(), tags=a["tag"], keys=a["keys"])
        return {"sent": reader.send_test(msg, security)}
    if action == "topic-update":
        spec = TopicSpec(a["topic"], a["queues"], a["perm"], a["message_type"])
        return {"groups": reader.update_topic(spec, a["broker"], security)}
    if action == "topic-delete":
        return {"groups": reader.delete_topic(a["topic"], a["broker"], security)}
    if action == "group-update":
        config = pb.SubscriptionGroup(
            group=a["group"], consume_message_orderly=a["orderly"] == "true"
        )
        if a["retries"] is not None:
            config.max_delivery_attempts = a["retries"] + 1  # the first delivery + retries
        done = reader.update_group(config, a["broker"], security)
        return {"groups": [name for name, _ in done], "configs": done}
    assert action == "group-delete", action
    return {"groups": reader.delete_group(a["group"], a["broker"], security)}


def back_link(action: str, params: Mapping[str, str]) -> str:
    """Where an action's Cancel and Back links lead: the page it was started from."""
    quote = urllib.parse.quote
    if action in ("resend", "reset"):
        return "/consumer?group=" + quote(params.get("group", ""))
    if action in ("send", "topic-update"):
        return "/topic?name=" + quote(params.get("topic", ""))
    return "/topics" if action == "topic-delete" else "/consumers"


def acting_as(reads: ClientSecurity, credentials: Credentials) -> ClientSecurity:
    """The dashboard's TLS settings, signed as ``credentials``."""
    return ClientSecurity(tls=reads.tls, credentials=credentials, server_name=reads.server_name)


def typed_credentials(access_key: str, secret_key: str) -> Credentials:
    try:
        return Credentials(access_key, secret_key)
    except SecurityError as exc:
        raise BadInput(str(exc)) from None


class Logins:
    """Log in (a form whose AccessKey and SecretKey are checked against every broker group),
    log out; both POSTs carry the page's token, as the actions'."""

    def __init__(self, board: Dashboard, actions: Actions) -> None:
        self.board = board
        self.actions = actions

    def _not_secure(self) -> None:
        if not self.board.settings.actions_need_credentials:
            raise BadInput("this group is not secure: actions need no login")

    async def form(self, request: Request) -> Response:
        def build() -> dict[str, Any]:
            self._not_secure()
            return {}

        return await self.board.render(request, "login.html", build)

    async def login(self, request: Request) -> Response:
        form, problem = await self.actions.checked_form(request)
        opened: list[str] = []

        def build() -> dict[str, Any]:
            if problem:
                raise BadInput(problem)
            self._not_secure()
            address = request.client.host if request.client is not None else ""
            wait_s = self.board.settings.sessions.login_wait_s(address)
            if wait_s > 0:
                raise TooManyLogins(f"too many failed logins: try again in {wait_s:.0f} s")
            credentials = typed_credentials(
                bounded(form.get("access_key", ""), "AccessKey", MAX_ID_CHARS),
                form.get("secret_key", ""),
            )
            reads = self.board.reader.security
            try:
                groups = self.board.reader.check_user(acting_as(reads, credentials))
            except MQClientError as exc:
                if exc.status != "UNAUTHENTICATED":
                    raise
                self.board.settings.sessions.login_failed(address)
                raise LoginRefused(f"the group refused the login: {error_text(exc)}") from None
            opened.append(self.board.settings.sessions.open(credentials))
            user = credentials.access_key
            return {"logged_in": user, "groups": groups, "session_user": user}

        response = await self.board.render(request, "login.html", build)
        if opened:
            response.set_cookie(
                COOKIE_NAME,
                opened[0],
                httponly=True,
                samesite="strict",
                secure=request.url.scheme == "https",
                path="/",
            )
        return response

    async def logout(self, request: Request) -> Response:
        _, problem = await self.actions.checked_form(request)

        def build() -> dict[str, Any]:
            if problem:
                raise BadInput(problem)
            self.board.settings.sessions.close(request.cookies.get(COOKIE_NAME, ""))
            return {"logged_out": True, "session_user": ""}

        response = await self.board.render(request, "login.html", build)
        if not problem:
            response.delete_cookie(COOKIE_NAME, path="/", httponly=True, samesite="strict")
        return response


class Actions:
    """The actions of ACTIONS: a GET shows exactly what will happen and asks to confirm; only
    the POST of that page (with its token) acts, as the acting user."""

    def __init__(self, board: Dashboard) -> None:
        self.board = board

    async def confirm(self, request: Request) -> Response:
        action = request.path_params["action"]
        params = dict(request.query_params)
        settings = self.board.settings
        base = {
            "action": action,
            "csrf": settings.csrf_token,
            "need_credentials": settings.actions_need_credentials,
            "params": params,
            "back": back_link(action, params),
            "perms": PERMS,
        }
        return await self.board.render(
            request, "confirm.html", lambda: {"args": parse_action(action, params)}, base
        )

    async def do(self, request: Request) -> Response:
        action = request.path_params["action"]
        form, problem = await self.checked_form(request)
        session = self.board.session(request)
        # What the result page may show: never the typed secret.
        shown = {k: v for k, v in form.items() if k in ("group", "topic")}
        base = {"action": action, "params": shown, "back": back_link(action, shown)}

        def build() -> dict[str, Any]:
            if problem:
                raise BadInput(problem)
            args = parse_action(action, form)
            security = self._security(form, session)
            result = run_action(self.board.reader, action, args, security)
            return {"args": args, **result}

        return await self.board.render(request, "done.html", build, base)

    async def checked_form(self, request: Request) -> tuple[dict[str, str], str]:
        """The POSTed form and why it may not act ("" when it may)."""
        try:
            form = await read_form(request)
        except BadInput as exc:
            return {}, str(exc)
        return form, self._refusal(request, form)

    def _refusal(self, request: Request, form: dict[str, str]) -> str:
        """Why this POST may not act ("" when it may): it must carry the token of a page this
        dashboard served, and come from such a page when the browser says where from."""
        token = form.get("csrf", "")
        if not hmac.compare_digest(token.encode(), self.board.settings.csrf_token.encode()):
            return "the form's token is missing or stale: open the confirmation page again"
        origin = request.headers.get("origin")
        if origin is not None and origin != f"{request.url.scheme}://{request.url.netloc}":
            return f"a form from another site ({origin[:80]}) may not act here"
        return ""

    def _security(self, form: dict[str, str], session: Session | None) -> ClientSecurity:
        """Who an action is signed as: the logged-in user, else the keys typed on its page
        (never the dashboard's own credentials, on a secure group)."""
        reads = self.board.reader.security
        if not self.board.settings.actions_need_credentials:
            return reads
        if session is not None:
            return acting_as(reads, session.credentials)
        access_key, secret_key = form.get("access_key", ""), form.get("secret_key", "")
        if not access_key or not secret_key:
            raise BadInput(
                "this group is secure: an action needs an AccessKey and SecretKey (or a login)"
            )
        return acting_as(reads, typed_credentials(access_key, secret_key))


def create_app(
    reader: GroupReader,
    sampler: Sampler,
    settings: Settings,
    allowed_hosts: list[str],
    start_sampler: bool = True,
) -> Starlette:
    """The ASGI application. ``allowed_hosts``: the Host headers served (the others get 400:
    a page of another site cannot reach the dashboard by renaming itself, DNS rebinding)."""
    board = Dashboard(reader, sampler, settings)
    actions = Actions(board)
    logins = Logins(board, actions)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        if start_sampler:
            sampler.start()
        try:
            yield
        finally:
            sampler.stop()
            reader.close()

    def get(path: str, handler: Callable[[Request], Awaitable[Response]]) -> Route:
        return Route(path, handler, methods=["GET"])

    routes = [
        get("/", board.clusters),
        get("/topics", board.topics),
        get("/topic", board.topic),
        get("/consumers", board.consumers),
        get("/consumer", board.consumer),
        get("/messages", board.messages),
        get("/charts", board.charts),
        get("/config", board.config),
        get("/clients", board.clients),
        get("/api/series", board.series),
        get("/login", logins.form),
        Route("/login", logins.login, methods=["POST"]),
        Route("/logout", logins.logout, methods=["POST"]),
        get("/actions/{action:str}", actions.confirm),
        Route("/actions/{action:str}", actions.do, methods=["POST"]),
        Mount("/static", StaticFiles(packages=[("mqdashboard", "static")]), name="static"),
    ]
    return Starlette(
        routes=routes,
        lifespan=lifespan,
        middleware=[
            Middleware(SecurityHeaders),
            Middleware(TrustedHostMiddleware, allowed_hosts=allowed_hosts),
        ],
    )
