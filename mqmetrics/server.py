"""The read-only ``/metrics`` endpoint of a process, and the collector that reads its state.

The endpoint is `prometheus_client`'s WSGI app behind a small server of our own bounds: only
``GET /metrics`` (anything else: 404 or 405), at most `MAX_CONNECTIONS` connections at once and
`MAX_CONNECTIONS_PER_ADDRESS` from one address, each with `READ_TIMEOUT_S` to send its request.
A new connection beyond either bound takes the slot of the oldest connection (of that address
when its own bound is reached) that has not sent its request yet: a handful of silent or slow
sockets, re-opened as soon as closed, cannot keep a scraper out, since a scraper sends its
request at once and is then never closed for another. Only when every slot is serving a
request is the new connection closed unserved. Both kinds of closing are counted in
``raftmq_metrics_refused_connections_total``. It is unauthenticated, like etcd's and NATS'
monitoring ports: bind it where only the scrapers reach (docs/METRICS.md "What the endpoint
promises"). Given a server `ssl.SSLContext` it speaks HTTPS (`mqsecurity.tls.https_server_context`:
the process's certificate, no client certificate asked): the TLS handshake runs in the
connection's own thread, within `READ_TIMEOUT_S` in all, so a client that stays silent or does
not speak TLS holds one slot for at most that long and never delays another scrape or the
accepting thread; a failed handshake is counted in ``raftmq_metrics_failed_handshakes_total``.
What the metrics cost the process is on ``raftmq_metrics_cpu_seconds_total`` (the CPU of the
builds on the loop and of the connections' threads; not the counting on the hot paths).

`LoopCollector` builds the families on the process's asyncio loop (the one thread that
changes the state it reads), at most once per `MIN_COLLECT_INTERVAL_S` whoever scrapes: a
scraper in a tight loop costs the process one bounded collection per interval.

Given ``const_labels`` (a broker node: ``cluster``, ``broker``, ``node``), `MetricsServer` adds
them to every sample it serves, of every collector (``process_*`` and the endpoint's own
counters included), in this one place (docs/METRICS.md "Labels"); a family's own label of the
same name keeps its value.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import io
import logging
import re
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app
from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector

logger = logging.getLogger(__name__)

# The one path served (Prometheus' default metrics_path).
METRICS_PATH = "/metrics"
# Connections served at once (Prometheus, a dashboard, an operator's curl: a handful); more
# are closed at once so that a flood of connections costs a thread each for at most this many.
MAX_CONNECTIONS = 8
# Connections one address may hold (a scraper needs one; a NAT'd team of operators a few): one
# address can take at most half the slots.
MAX_CONNECTIONS_PER_ADDRESS = 4
# Seconds a connection has, in all, to send its request line and headers (and, over TLS, as
# much again for its handshake): a slow or dribbling sender would hold a slot otherwise.
READ_TIMEOUT_S = 5.0
# A scrape reuses the families built less than this long ago: the state is read at most this
# often whoever scrapes (a collection is bounded by the families' caps, docs/METRICS.md).
MIN_COLLECT_INTERVAL_S = 0.5
# How long a scrape waits for the event loop to build the families; a busy or stopping loop
# answers the scrape without them (counted in raftmq_metrics_collect_timeouts_total).
COLLECT_TIMEOUT_S = 5.0

Build = Callable[[], list[Metric]]


class LoopCollector(Collector):
    """Runs ``build`` on ``loop`` and hands its families to the scrape's thread."""

    def __init__(
        self,
        build: Build,
        loop: asyncio.AbstractEventLoop,
        *,
        min_interval_s: float = MIN_COLLECT_INTERVAL_S,
        timeout_s: float = COLLECT_TIMEOUT_S,
    ) -> None:
        self._build = build
        self._loop = loop
        self._min_interval_s = min_interval_s
        self._timeout_s = timeout_s
        self._lock = threading.Lock()
        self._families: list[Metric] = []
        self._built_at = float("-inf")
        self.timeouts = 0
        self.collections = 0
        # CPU seconds the builds took on the loop's thread (only that thread adds to it).
        self.collect_cpu_s = 0.0

    def describe(self) -> list[Metric]:
        return []  # no fixed names: nothing for the registry to check at register time

    def collect(self) -> Iterable[Metric]:
        with self._lock:  # one scrape builds, concurrent ones wait and reuse its result
            now = time.monotonic()
            if now - self._built_at >= self._min_interval_s:
                self._families = self._build_on_loop()
                self._built_at = time.monotonic()
            families = self._families
        return [*families, self._own_family()]

    def _build_on_loop(self) -> list[Metric]:
        done: concurrent.futures.Future[list[Metric]] = concurrent.futures.Future()

        def run() -> None:
            if not done.set_running_or_notify_cancel():
                return
            started_s = time.thread_time()
            try:
                families = self._build()
            except BaseException as exc:  # handed to the scrape, which logs it
                self.collect_cpu_s += time.thread_time() - started_s
                done.set_exception(exc)
                return
            # Counted before the scrape is woken: its answer includes this build.
            self.collect_cpu_s += time.thread_time() - started_s
            done.set_result(families)

        try:
            self._loop.call_soon_threadsafe(run)
        except RuntimeError:  # the loop is closed: the process is stopping
            return []
        try:
            families = done.result(self._timeout_s)
        except concurrent.futures.TimeoutError:
            done.cancel()
            self.timeouts += 1
            return []
        except Exception:
            logger.exception("metrics collection failed")
            return []
        self.collections += 1
        return families

    def _own_family(self) -> CounterMetricFamily:
        return CounterMetricFamily(
            "raftmq_metrics_collect_timeouts",
            "Scrapes answered without the state's families: the event loop did not build them "
            f"within {COLLECT_TIMEOUT_S:g} s",
            value=self.timeouts,
        )


class _DeadlineReader(io.RawIOBase):
    """A socket's bytes under one deadline for every read: each read may wait only for what is
    left of it, so a client sending a byte now and then cannot stretch its request past it."""

    def __init__(self, sock: socket.socket, deadline: float) -> None:
        super().__init__()
        self._sock = sock
        self._deadline = deadline

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        left_s = self._deadline - time.monotonic()
        if left_s <= 0:
            raise TimeoutError("the request did not arrive within the read timeout")
        self._sock.settimeout(left_s)
        return self._sock.recv_into(buffer)


class _Handler(WSGIRequestHandler):
    def setup(self) -> None:
        """The request line and headers are read under one deadline, the server's read
        timeout from now."""
        super().setup()
        self.rfile.close()  # the socket's own reader: replaced before anything was read
        deadline = time.monotonic() + self._read_timeout_s()
        self.rfile = io.BufferedReader(_DeadlineReader(self.connection, deadline))

    def parse_request(self) -> bool:
        parsed = super().parse_request()
        if parsed:
            assert isinstance(self.server, _BoundedServer)
            self.server.request_arrived()
        # The answer's writes: the read timeout per write.
        self.connection.settimeout(self._read_timeout_s())
        return parsed

    def _read_timeout_s(self) -> float:
        assert isinstance(self.server, _BoundedServer)
        return self.server.read_timeout_s

    def log_message(self, format: str, *args: Any) -> None:
        pass  # a scrape every few seconds would flood the process log


def _handshake(request: socket.socket, context: ssl.SSLContext, timeout_s: float) -> ssl.SSLSocket:
    """The server side of a TLS handshake on ``request``, done within ``timeout_s`` in all:
    CPython's handshake keeps one deadline over all its reads (a client sending a byte now and
    then does not extend it). The wrapped socket keeps ``timeout_s`` per read, as a plaintext
    one; on any failure it is closed and the error raised."""
    request.settimeout(timeout_s)
    tls = context.wrap_socket(request, server_side=True, do_handshake_on_connect=False)
    try:
        tls.do_handshake()
    except BaseException:
        tls.close()
        raise
    return tls


@dataclass(eq=False)
class _Conn:
    """A connection holding a slot: its address, its socket's descriptor (to shut it down from
    another thread) and whether its request arrived (then it is never closed for another)."""

    address: str
    fd: int
    family: int
    requested: bool = False


class _BoundedServer(WSGIServer):
    """One thread per connection, at most MAX_CONNECTIONS at once and
    MAX_CONNECTIONS_PER_ADDRESS of one address; beyond, the oldest one still waiting for its
    request is shut down for the new one (the module's docstring); with an ``ssl_context``,
    each thread does its connection's TLS handshake first."""

    daemon_threads = True
    ssl_context: ssl.SSLContext | None = None
    read_timeout_s = READ_TIMEOUT_S

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # Connections holding a slot, oldest first; under _conns_lock.
        self._conns: list[_Conn] = []
        self._conns_lock = threading.Lock()
        self._current = threading.local()
        self.refused_connections = 0
        self.failed_handshakes = 0
        # CPU seconds the connections' threads took (handshake, families of other
        # collectors, the text, the writes), added as each connection ends.
        self.serve_cpu_s = 0.0
        self._cpu_lock = threading.Lock()
        super().__init__(*args, **kwargs)

    def process_request(self, request: Any, client_address: Any) -> None:
        conn = self._admit(request, client_address)
        if conn is None:
            self.refused_connections += 1
            self.shutdown_request(request)
            return
        thread = threading.Thread(
            target=self._serve_one, args=(request, client_address, conn), daemon=True
        )
        thread.start()

    def _admit(self, request: socket.socket, client_address: Any) -> _Conn | None:
        """The new connection's slot, freed from a waiting one if need be; None: every slot
        it could take serves a request."""
        address = str(client_address[0]) if isinstance(client_address, tuple) else ""
        with self._conns_lock:
            mine = [c for c in self._conns if c.address == address]
            if len(mine) >= MAX_CONNECTIONS_PER_ADDRESS:
                if not self._evict_oldest_waiting(mine):
                    return None
            elif len(self._conns) >= MAX_CONNECTIONS and not self._evict_oldest_waiting(
                self._conns
            ):
                return None
            conn = _Conn(address, request.fileno(), request.family)
            self._conns.append(conn)
            assert len(self._conns) <= MAX_CONNECTIONS
            return conn

    def _evict_oldest_waiting(self, among: list[_Conn]) -> bool:
        """Shut down the oldest of ``among`` whose request has not arrived (its thread ends
        at once); whether there was one. Called under _conns_lock."""
        victim = next((c for c in among if not c.requested), None)
        if victim is None:
            return False
        self._conns.remove(victim)
        self.refused_connections += 1
        try:
            # A duplicate of the descriptor: shutting the connection down wakes its thread's
            # read (the thread closes its own socket); the duplicate is closed here.
            with socket.fromfd(victim.fd, victim.family, socket.SOCK_STREAM) as dup:
                dup.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass  # it just ended by itself
        return True

    def request_arrived(self) -> None:
        """Called by the connection's thread once its request line and headers are read."""
        conn = getattr(self._current, "conn", None)
        if conn is not None:
            with self._conns_lock:
                conn.requested = True

    def _release(self, conn: _Conn) -> None:
        with self._conns_lock:
            if conn in self._conns:
                self._conns.remove(conn)

    def _serve_one(self, request: Any, client_address: Any, conn: _Conn) -> None:
        started_s = time.thread_time()
        self._current.conn = conn
        try:
            if self.ssl_context is not None:
                try:
                    request = _handshake(request, self.ssl_context, self.read_timeout_s)
                except (OSError, ValueError):  # silent, not TLS, or a TLS error: closed
                    self.failed_handshakes += 1
                    logger.debug("metrics TLS handshake from %s failed", client_address)
                    return
            self.finish_request(request, client_address)
        except Exception:
            self.handle_error(request, client_address)
        finally:
            # The slot first: the descriptor is never shut down for another once closed here.
            self._release(conn)
            self.shutdown_request(request)
            with self._cpu_lock:
                self.serve_cpu_s += time.thread_time() - started_s

    def handle_error(self, request: Any, client_address: Any) -> None:
        logger.debug("metrics request from %s failed", client_address, exc_info=True)


class _EndpointCollector(Collector):
    """The endpoint's own counters, read from its server (not from the event loop: they are
    there even when the loop is too busy to build the state's families)."""

    def __init__(self, server: _BoundedServer, collectors: Sequence[Collector]) -> None:
        self._server = server
        self._loop_collectors = [c for c in collectors if isinstance(c, LoopCollector)]

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterable[Metric]:
        yield CounterMetricFamily(
            "raftmq_metrics_refused_connections",
            "Connections to /metrics closed unserved: every slot they could take was serving "
            "a request, or they were waiting for theirs when a newer connection needed the slot",
            value=self._server.refused_connections,
        )
        yield CounterMetricFamily(
            "raftmq_metrics_failed_handshakes",
            "HTTPS connections to /metrics closed because their TLS handshake failed or did "
            "not finish within the read timeout",
            value=self._server.failed_handshakes,
        )
        cpu = CounterMetricFamily(
            "raftmq_metrics_cpu_seconds",
            "CPU seconds the metrics themselves cost, by part: collect (reading the state on the "
            "event loop), serve (the connections' threads: TLS, text, writes)",
            labels=["part"],
        )
        cpu.add_metric(["collect"], sum(c.collect_cpu_s for c in self._loop_collectors))
        cpu.add_metric(["serve"], self._server.serve_cpu_s)
        yield cpu


# Constant labels at most (cluster, broker, node and room to spare) and their values' length:
# they come from the process's own config, which bounds them already; an assertion guards it.
MAX_CONST_LABELS = 8
MAX_CONST_LABEL_VALUE_CHARS = 256
_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")


def check_const_labels(labels: Mapping[str, str]) -> dict[str, str]:
    """``labels`` as a plain dict; ValueError on a name Prometheus refuses (or one of its
    reserved ``__`` names), an overlong value or too many labels."""
    if len(labels) > MAX_CONST_LABELS:
        raise ValueError(f"{len(labels)} constant labels, at most {MAX_CONST_LABELS}")
    for name, value in labels.items():
        if not _LABEL_NAME.fullmatch(name) or name.startswith("__"):
            raise ValueError(f"constant label name {name!r} is not a Prometheus label name")
        if len(value) > MAX_CONST_LABEL_VALUE_CHARS:
            raise ValueError(
                f"constant label {name}: value of {len(value)} characters, "
                f"at most {MAX_CONST_LABEL_VALUE_CHARS}"
            )
    return dict(labels)


class _Labelled(Collector):
    """``inner``'s families with ``labels`` added to every sample; a sample's own label of the
    same name keeps its value."""

    def __init__(self, inner: Collector, labels: Mapping[str, str]) -> None:
        self._inner = inner
        self._labels = dict(labels)

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterable[Metric]:
        for family in self._inner.collect():
            out = Metric(family.name, family.documentation, family.type, family.unit)
            out.samples = [s._replace(labels={**self._labels, **s.labels}) for s in family.samples]
            yield out


def _server_class(host: str, port: int) -> type[_BoundedServer]:
    """A server class of the address family ``host`` resolves to (IPv4 or IPv6)."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    family = infos[0][0]

    class Server(_BoundedServer):
        address_family = family

    return Server


def _only_metrics(app: Callable[..., Any]) -> Callable[..., Any]:
    def guarded(environ: dict[str, Any], start_response: Callable[..., Any]) -> Any:
        if environ.get("PATH_INFO") != METRICS_PATH:
            start_response("404 Not Found", [("Content-Type", "text/plain")])
            return [f"only {METRICS_PATH} is served\n".encode()]
        return app(environ, start_response)

    return guarded


class MetricsServer:
    """``/metrics`` on ``host:port``: bound by the constructor (a busy port fails there, before
    the process touches anything else), served from :meth:`start` in a daemon thread. With
    ``tls`` (a server context holding the process's certificate) over HTTPS, else plain HTTP;
    ``const_labels`` are added to every sample served (`check_const_labels`)."""

    def __init__(
        self,
        host: str,
        port: int,
        collectors: Sequence[Collector],
        *,
        tls: ssl.SSLContext | None = None,
        read_timeout_s: float = READ_TIMEOUT_S,
        const_labels: Mapping[str, str] | None = None,
    ) -> None:
        labels = check_const_labels(const_labels or {})
        self.const_labels = labels

        def labelled(c: Collector) -> Collector:
            return _Labelled(c, labels) if labels else c

        self.registry = CollectorRegistry(auto_describe=False)
        for c in collectors:
            self.registry.register(labelled(c))
        app = _only_metrics(make_wsgi_app(self.registry))
        self._httpd = make_server(host, port, app, _server_class(host, port), _Handler)
        server = self._httpd
        assert isinstance(server, _BoundedServer)
        server.ssl_context = tls
        server.read_timeout_s = read_timeout_s
        self.registry.register(labelled(_EndpointCollector(server, collectors)))
        self._thread: threading.Thread | None = None

    @property
    def scheme(self) -> str:
        """``https`` or ``http``."""
        server = self._httpd
        assert isinstance(server, _BoundedServer)
        return "https" if server.ssl_context is not None else "http"

    @property
    def failed_handshakes(self) -> int:
        """Connections closed because their TLS handshake failed or timed out."""
        server = self._httpd
        assert isinstance(server, _BoundedServer)
        return server.failed_handshakes

    @property
    def port(self) -> int:
        return int(self._httpd.server_address[1])

    @property
    def refused_connections(self) -> int:
        server = self._httpd
        assert isinstance(server, _BoundedServer)
        return server.refused_connections

    def start(self) -> None:
        assert self._thread is None
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, name="metrics-http", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        if self._thread is not None:
            self._httpd.shutdown()
            self._thread.join()
            self._thread = None
        self._httpd.server_close()
