"""The dashboard's web application (Starlette, served by uvicorn): the pages, the charts' JSON
and the two confirmed actions.

Every value shown comes from the cluster and is hostile input (message bodies, keys,
properties, client ids): the templates escape everything (Jinja2 autoescape, never
``|safe``), the charts' script writes text with ``textContent`` only, and the Content
Security Policy allows no inline script. A page whose reads fail shows the error, never a
blank page. Reads use the dashboard's own security; an action (resend from the DLQ, reset
an offset) runs only from a POST carrying the page's token, after the user confirmed on a
page of its own, and on a secure group with the AccessKey and SecretKey the user types there
(never the dashboard's own credentials).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import hmac
import logging
import secrets
import urllib.parse
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import jinja2
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
from mqdashboard.reader import MAX_MESSAGES, GroupReader, TopicView, error_text
from mqdashboard.sampler import Sampler
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
ACTIONS = ("resend", "reset")
# The client-port calls each action makes, as the user whose credentials were typed on its page:
# the brokers' guard decides each one (broker/frontends/rpcmap.py; docs/SECURITY.md, "The other
# ports"). resend pulls the group's dead letters (%DLQ%<group>, as the group) and sends each to
# its original topic; reset sets the group's offsets. Checked against the calls an action really
# makes by tests/unit/test_acl_matrix.py.
_BROKER = "/raftmq.broker.v1.Broker/"
ACTION_CALLS: Mapping[str, tuple[str, ...]] = {
    "resend": (_BROKER + "PullMessage", _BROKER + "SendMessage"),
    "reset": (_BROKER + "ResetConsumerOffset",),
}
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


@dataclass
class Settings:
    """What the pages need besides the reader: the token that POSTs must carry, and whether
    actions need the user's credentials (the dashboard itself signs its reads)."""

    namesrv_addr: str
    actions_need_credentials: bool
    csrf_token: str = field(default_factory=lambda: secrets.token_urlsafe(32))


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
        context: dict[str, Any] = {
            "namesrv": self.settings.namesrv_addr,
            "sample_errors": self.sampler.errors_now(),
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
        except BadInput as exc:
            context["error"], status = str(exc), 400
        except (MQClientError, SecurityError) as exc:
            context["error"], status = error_text(exc), 502
        except Exception as exc:
            log.exception("page %s failed", request.url.path)
            context["error"], status = error_text(exc), 500
        return self.templates.TemplateResponse(request, template, context, status_code=status)

    async def clusters(self, request: Request) -> Response:
        return await self.render(
            request, "clusters.html", lambda: {"groups": self.reader.clusters()}
        )

    async def topics(self, request: Request) -> Response:
        def build() -> dict[str, Any]:
            topics = self.reader.topics()
            rates = {t.name: self.sampler.send_rate(t.name) for t in topics}
            return {"topics": topics, "rates": rates}

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
            return {"groups": groups, "lag": lag, "rates": rates}

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

    async def charts(self, request: Request) -> Response:
        return await self.render(
            request, "charts.html", lambda: {"interval_ms": self.sampler.interval_ms}
        )

    async def series(self, request: Request) -> Response:
        return JSONResponse(await run_in_threadpool(self.sampler.series))


def _now_ms() -> int:
    return int(dt.datetime.now(tz=dt.UTC).timestamp() * 1000)


class Actions:
    """Resend from the DLQ and reset an offset: a GET shows what will happen and asks to
    confirm; only the POST of that page (with its token) acts."""

    def __init__(self, board: Dashboard) -> None:
        self.board = board

    def _base(self, request: Request, action: str) -> dict[str, Any]:
        settings = self.board.settings
        return {
            "action": action,
            "csrf": settings.csrf_token,
            "need_credentials": settings.actions_need_credentials,
            "params": dict(request.query_params),
        }

    async def confirm_resend(self, request: Request) -> Response:
        def build() -> dict[str, Any]:
            bounded(request.query_params.get("group", ""), "group", MAX_NAME_CHARS)
            bounded(request.query_params.get("msg_id", ""), "message id", MAX_ID_CHARS, False)
            return {}

        return await self.board.render(
            request, "confirm.html", build, self._base(request, "resend")
        )

    async def confirm_reset(self, request: Request) -> Response:
        def build() -> dict[str, Any]:
            bounded(request.query_params.get("group", ""), "group", MAX_NAME_CHARS)
            bounded(request.query_params.get("topic", ""), "topic", MAX_NAME_CHARS)
            parse_time_ms(request.query_params.get("time", ""), "time")
            return {}

        return await self.board.render(request, "confirm.html", build, self._base(request, "reset"))

    async def do(self, request: Request) -> Response:
        action = request.path_params["action"]
        try:
            form = await read_form(request)
        except BadInput as exc:
            form, problem = {}, str(exc)
        else:
            problem = self._refusal(request, form)
        # What the result page may show: never the typed secret.
        base = {"action": action, "params": {"group": form.get("group", "")}}

        def build() -> dict[str, Any]:
            if problem:
                raise BadInput(problem)
            if action not in ACTIONS:
                raise BadInput(f"no action {action[:32]!r}: {', '.join(ACTIONS)}")
            security = self._security(form)
            if action == "resend":
                group = bounded(form.get("group", ""), "group", MAX_NAME_CHARS)
                msg_id = bounded(form.get("msg_id", ""), "message id", MAX_ID_CHARS, False)
                return {"resent": self.board.reader.resend_dlq(group, msg_id, security)}
            group = bounded(form.get("group", ""), "group", MAX_NAME_CHARS)
            topic = bounded(form.get("topic", ""), "topic", MAX_NAME_CHARS)
            when = parse_time_ms(form.get("time", ""), "time")
            return {"reset": self.board.reader.reset_offset(group, topic, when, security)}

        return await self.board.render(request, "done.html", build, base)

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

    def _security(self, form: dict[str, str]) -> ClientSecurity:
        reads = self.board.reader.security
        if not self.board.settings.actions_need_credentials:
            return reads
        access_key, secret_key = form.get("access_key", ""), form.get("secret_key", "")
        if not access_key or not secret_key:
            raise BadInput("this group is secure: an action needs an AccessKey and SecretKey")
        try:
            credentials = Credentials(access_key, secret_key)
        except SecurityError as exc:
            raise BadInput(str(exc)) from None
        return ClientSecurity(tls=reads.tls, credentials=credentials, server_name=reads.server_name)


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
        get("/api/series", board.series),
        get("/actions/resend", actions.confirm_resend),
        get("/actions/reset", actions.confirm_reset),
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
