"""What the RocketMQ 5 integration tests share: where the official clients are, how to run one
of their scripts (:class:`ClientProcess`), and the generated stubs' helpers to make a topic
every node routes, read a status, find a follower."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import grpc
from support import create_topic_on, wait_for

from broker.frontends.v2 import stubs
from mqcluster.cluster import LocalCluster

v2, v2_service, v2_grpc = stubs.load()

ROOT = Path(__file__).resolve().parents[1]
RMQ5 = ROOT / "build" / "rmq5"
SCRIPTS = ROOT / "tests" / "rmq5"
PYTHON = RMQ5 / "pyclient" / "bin" / "python"
NODE_MODULES = RMQ5 / "node" / "node_modules"
# Small commitlog and log index files (each allocated in full at start: 1 MiB, not 32, per
# node), and disk marks a shared test machine's disk never reaches.
GROUP_CONF = {
    "mappedFileSizeCommitLog": str(8 << 20),
    "mappedFileSizeEntryIndex": str(1 << 20),
    "diskSpaceWarningLevelRatio": "99",
    "diskSpaceResumeRatio": "98",
}


# Numbers the clients' output files (several clients of one script share a HOME).
_CLIENT_SEQ = itertools.count(1)
# How often a test looks at a client's output file while it waits for a line.
_POLL_S = 0.05


def client_env(home: Path, node: bool = False, **extra: str) -> dict[str, str]:
    """A client script's environment: HOME is the test's directory (both clients write their
    logs under it), NODE_PATH the Node.js client's modules for ``node``."""
    env = {"PATH": os.environ.get("PATH", ""), "HOME": str(home), **extra}
    return {**env, "NODE_PATH": str(NODE_MODULES)} if node else env


class ClientProcess:
    """An official client's script in its own process, whose stdout and stderr go to files in
    ``home`` (``<name>.out``, ``<name>.err``), never to pipes. A pipe nobody reads fills up
    (64 KiB: about 280 of the consumers' lines), and the client then blocks on its next print
    while its budget and its messages' invisible times run on: two consumers whose pipes were
    read one after the other once ended with 512 of 1,000 messages. A file never blocks, can
    be read at any time (:meth:`lines`, :meth:`wait_lines`) and its end goes into every
    failure message. Its stdin is a pipe with ``stdin=True`` (:meth:`say`, :meth:`close`),
    else ``/dev/null``."""

    def __init__(
        self,
        argv: list[str],
        home: Path,
        env: Mapping[str, str],
        name: str = "",
        stdin: bool = False,
    ) -> None:
        self.argv = argv
        stem = name or f"{Path(argv[1]).stem}-{next(_CLIENT_SEQ)}"
        self.out_path, self.err_path = home / f"{stem}.out", home / f"{stem}.err"
        with self.out_path.open("w") as out, self.err_path.open("w") as err:
            self.proc = subprocess.Popen(
                argv,
                stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                text=True,
                env=dict(env),
            )

    def __enter__(self) -> ClientProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.kill()

    def lines(self) -> list[Any]:
        """The JSON lines the script printed so far (a line still being written excluded)."""
        text = self.out_path.read_text(errors="replace")
        complete = text[: text.rfind("\n") + 1]
        return [json.loads(line) for line in complete.splitlines() if line.startswith("{")]

    def tail(self, limit: int = 2000) -> str:
        """The ends of its stdout and stderr files, for a failure message."""
        out = self.out_path.read_text(errors="replace")[-limit:]
        err = self.err_path.read_text(errors="replace")[-limit:]
        return (
            f"{self.argv[:3]}\nstdout ({self.out_path}):\n{out}\nstderr ({self.err_path}):\n{err}"
        )

    def wait_lines(self, until: Callable[[list[Any]], bool], timeout_s: float) -> list[Any]:
        """Its lines, once ``until`` holds for them; fails if it ends or the time is up first."""
        deadline = time.monotonic() + timeout_s
        while True:
            ended = self.proc.poll() is not None
            lines = self.lines()  # read after the poll: an ended script's file is complete
            if until(lines):
                return lines
            assert not ended, (
                f"the script ended early (exit {self.proc.returncode}):\n{self.tail()}"
            )
            assert time.monotonic() < deadline, f"not within {timeout_s} s:\n{self.tail()}"
            time.sleep(_POLL_S)

    def say(self, text: str) -> None:
        assert self.proc.stdin is not None, "started without stdin=True"
        self.proc.stdin.write(text)
        self.proc.stdin.flush()

    def close(self) -> None:
        """Close its stdin (the scripts that wait for its end then finish)."""
        if self.proc.stdin is not None and not self.proc.stdin.closed:
            self.proc.stdin.close()

    def wait(self, timeout_s: float) -> int:
        """Its exit code; killed (and the test failed) if it runs longer than ``timeout_s``."""
        try:
            return self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"still running after {timeout_s} s:\n{self.tail()}") from None

    def finish(self, timeout_s: float) -> list[Any]:
        """Wait for its end: it must exit 0 and print its ``{"done": ...}`` line last; every
        line but that one."""
        self.close()
        code = self.wait(timeout_s)
        assert code == 0, f"exit {code}:\n{self.tail()}"
        lines = self.lines()
        assert lines and "done" in lines[-1], self.tail()
        return lines[:-1]

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.close()


@contextmanager
def running_group(root: Path, extra: Mapping[str, str]) -> Iterator[LocalCluster]:
    """A 3-node group with v2 ports (``extra``: more broker.conf keys), up until the end."""
    cluster = LocalCluster(root)
    cluster.configure(3, auto_ports=True, extra={**GROUP_CONF, **extra})
    try:
        cluster.up()
        yield cluster
    finally:
        cluster.down(grace_s=5.0)


def topic_on_every_node(cluster: LocalCluster, name: str, queues: int) -> str:
    """Create ``name``; return once every member routes it (any node may then be asked)."""
    create_topic_on([cluster], [], name, queues)
    for n in cluster.nodes:
        with grpc.insecure_channel(n.grpc_addr) as ch:
            stub = v2_grpc.MessagingServiceStub(ch)
            ask = v2_service.QueryRouteRequest(topic=v2.Resource(name=name))
            wait_for(lambda s=stub, a=ask: _route_ok(s, a), 10, f"{name} on {n.node_id}")
    return name


def _route_ok(stub: Any, ask: Any) -> bool:
    try:
        return code(stub.QueryRoute(ask, timeout=5).status) == "OK"
    except grpc.RpcError:
        return False


def code(status: Any) -> str:
    """The name of a body status's code."""
    return str(v2.Code.Name(status.code))


def follower_v2_addr(cluster: LocalCluster) -> str:
    leader = cluster.wait_leader()
    return next(n.grpc_addr for n in cluster.nodes if n.node_id != leader)


ROUTE_WAIT_S = 10


def v2_code(status: Any) -> str:
    """The name of a body status's ``apache.rocketmq.v2.Code``."""
    return code(status)


def wait_v2_routes(cluster: LocalCluster, topic: str) -> None:
    """Wait until every member's v2 port routes ``topic`` (each applied its creation)."""
    ask = v2_service.QueryRouteRequest(topic=v2.Resource(name=topic))
    for n in cluster.nodes:
        with grpc.insecure_channel(n.grpc_addr) as ch:
            stub = v2_grpc.MessagingServiceStub(ch)
            wait_for(
                lambda s=stub: _route_ok(s, ask), ROUTE_WAIT_S, f"{topic} routed by {n.node_id}"
            )
