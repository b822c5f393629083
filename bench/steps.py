"""Steps per message on each node (issue 36): ``python -m bench.steps`` (``make bench-steps``).

Starts a fresh insecure 3-node group per flush mode whose brokers carry the counting hook
(``bench/stepshook``, ``raftmq_stepcount``; nothing else loads it), keeps the real client's
closed-loop load on it (``bench.__main__.produce_case``) and, inside the load, opens windows on
every node in turn:

- ``plain``: CPU per message of each node (``/proc/PID/stat``) and of its event loop's thread,
  the loop thread's voluntary context switches (each is a sleep in ``epoll_wait`` and a wake-up:
  the event loop's wake-ups), and the read/write system calls of ``/proc/PID/io``;
- ``profile``: cProfile's call counts on the event loop's thread (Readys, advances, peer
  messages encoded and decoded, core steps, applies, and the persist jobs, ``pwrite`` and
  ``fdatasync`` that run there: ASYNC_FLUSH's appends; SYNC_FLUSH's run in the flush thread);
- ``strace``: ``strace -c -f`` attached to each node for the window (every system call by
  name, every thread), when strace is installed;
- ``copies`` (for bodies of ``COPIES_MIN_BYTES`` or more; ``--no-copies`` skips it): where
  the event loop's thread made Python objects of a message's size or more
  (``raftmq_stepcount``), at one message in flight.

Every figure is divided by the messages the leader's send path proposed in the same window.
Counts do not depend on the machine's speed the way rates do (a loaded machine batches more
at 16 in flight, so compare runs made the same minutes). Writes
``bench/results/steps-<UTC>.json`` and ``.md``; ``--compare DIR`` runs the same cases on brokers
of another checkout (its code, the same hook and load), alternating, into one table.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from bench import CLK_TCK, cpu_s
from bench.__main__ import local_group, produce_case
from bench.sweep import create_work_dir, sweep_stale

RESULTS = Path(__file__).parent / "results"
HOOK_DIR = Path(__file__).parent / "stepshook"
# bench/stepshook/raftmq_stepcount.py's names (it is loaded by the brokers, not imported here).
ENV_DIR = "RAFTMQ_STEPS_DIR"
WINDOW_FILE = "window.json"
# A window opens this long after the leader is seen busy (routes found, Readys at their pace).
WARMUP_S = 1.0
# The load generators start and find their routes within this (a loaded machine takes seconds
# to start a Python process): their run is this much longer than the window.
LOAD_START_S = 10.0
# The leader counts as busy once it wrote this many messages' bytes (log and both peers) in
# one LOAD_POLL_S: idle, it writes heartbeats of about a hundred bytes a few times a second.
BUSY_MESSAGES = 4
LOAD_POLL_S = 0.25
# Longest wait for a node to write its window's counts after SIGUSR2.
DUMP_WAIT_S = 20.0
MODES = ("plain", "profile", "strace")
# The copies window runs for bodies at least this large: below it, other allocations of the
# same size (a regex match, a dict) are counted as copies too.
COPIES_MIN_BYTES = 8192

# Call counts reported per message (cProfile keys "file:function"): the label and the keys
# summed. Names, not lines: they survive code moving between modules, and
# tests/unit/test_bench_steps.py checks that each still names a function of the code (a key
# whose function moved counts 0 silently). The profile is the event loop's thread's only:
# what runs in the flush thread (SYNC_FLUSH's persist jobs, their pwrite and fdatasync) is
# in the strace window, not here.
# Keys of functions only older trees have (``--compare`` with a checkout from before a move).
OLDER_TREE_KEYS = frozenset({"node.py:_persist_job"})
# Keys of the standard library's functions (the hand-off of a job to a thread before the
# flush thread had its own, dledger.server.flushthread).
STDLIB_KEYS = frozenset({"thread.py:submit", "futures.py:_chain_future"})
# The row of every call the profile saw (Python functions and C functions called from Python).
ALL_CALLS = "Python and C calls, all (cProfile)"
CALLS: list[tuple[str, tuple[str, ...]]] = [
    ("Readys", ("raft.py:ready",)),
    ("advances", ("raft.py:advance",)),
    # node.py before the persister had a module of its own (a --compare base can be older).
    (
        "persist jobs on the loop thread (ASYNC_FLUSH appends)",
        ("persister.py:_persist_job", "node.py:_persist_job"),
    ),
    ("applies", ("node.py:_apply",)),
    # A large append on the peer socket is read in place (decode_append), the rest by the
    # runtime and from_pb.
    ("peer messages in (decoded)", ("convert.py:from_pb", "peerwire.py:decode_append")),
    # Every kind but appends; an append for the gRPC stream; one for the peer socket (its
    # head: the entries are shared).
    (
        "peer messages out (encoded)",
        ("convert.py:fill_pb", "peerwire.py:encode_append", "peerwire.py:append_head"),
    ),
    # Once per run of entries however many followers get it (peerwire.EntriesCache).
    ("entries encoded for peers", ("peerwire.py:_entry_fields",)),
    ("core steps", ("raft.py:step",)),
    ("store appends", ("store.py:_append_locked",)),
    (
        "pwrite and pwritev on the loop thread",
        ("<built-in method posix.pwrite>", "<built-in method posix.pwritev>"),
    ),
    (
        "fdatasync and fsync on the loop thread",
        ("<built-in method posix.fdatasync>", "<built-in method posix.fsync>"),
    ),
    ("asyncio futures made", ("<method 'create_future' of 'uvloop.Loop' objects>",)),
    (
        "SerializeToString (Python callers)",
        ("<method 'SerializeToString' of 'google._upb._message.Message' objects>",),
    ),
    # A job handed to a thread: the flush thread's own queue, or an executor's submit (the
    # flush jobs before, and the default executor's rarer jobs); the second row counts the
    # futures chained back to the loop by run_in_executor.
    ("jobs handed to a thread", ("flushthread.py:run", "thread.py:submit")),
    ("executor futures chained to the loop", ("futures.py:_chain_future",)),
]
# The plain window's figures (keys of the JSON, kept for comparing runs) as the table shows
# them: what each measures, from /proc (docs/PERFORMANCE.md "Steps per message").
PLAIN_LABELS = {
    "cpu_us": "CPU us, all threads",
    "loop_cpu_us": "CPU us, event loop's thread",
    "loop_wakeups": "loop thread wake-ups (voluntary context switches)",
    "loop_preempted": "loop thread preemptions (involuntary context switches)",
    "syscr": "read system calls (/proc io syscr, all threads)",
    "syscw": "write system calls (/proc io syscw, all threads)",
    "msg/s": "msg/s of the load (a rate, not per message)",
}


def _status(path: str) -> dict[str, int]:
    out: dict[str, int] = {}
    try:
        text = Path(path).read_text()
    except OSError:
        return out
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key in ("voluntary_ctxt_switches", "nonvoluntary_ctxt_switches"):
            out[key] = int(value)
    return out


def _thread_cpu_s(pid: int) -> float:
    try:
        fields = Path(f"/proc/{pid}/task/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def _io(pid: int) -> dict[str, int]:
    out: dict[str, int] = {}
    try:
        for line in Path(f"/proc/{pid}/io").read_text().splitlines():
            key, _, value = line.partition(":")
            out[key] = int(value)
    except OSError:
        pass
    return out


def proc_counters(pid: int) -> dict[str, float]:
    """What /proc says of ``pid`` now: CPU seconds (all threads; the main thread), its main
    thread's context switches, and its read/write system calls."""
    main = _status(f"/proc/{pid}/task/{pid}/status")
    io = _io(pid)
    return {
        "cpu_s": cpu_s(pid),
        "loop_cpu_s": _thread_cpu_s(pid),
        "loop_wakeups": main.get("voluntary_ctxt_switches", 0),
        "loop_preempted": main.get("nonvoluntary_ctxt_switches", 0),
        "syscr": io.get("syscr", 0),
        "syscw": io.get("syscw", 0),
    }


_STRACE_ROW = re.compile(r"^\s*[\d.]+\s+[\d.]+\s+\d+\s+(\d+)\s+(?:\d+\s+)?(\w+)\s*$")


def parse_strace(text: str) -> dict[str, int]:
    """``strace -c`` summary rows -> {syscall: calls}."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        m = _STRACE_ROW.match(line)
        if m and m.group(2) != "total":
            out[m.group(2)] = out.get(m.group(2), 0) + int(m.group(1))
    return out


def per_message(window: dict[str, Any], messages: int) -> dict[str, float]:
    """The counts of one node's window divided by the window's messages."""
    out: dict[str, float] = {}
    if messages <= 0:
        return out
    for key in ("cpu_s", "loop_cpu_s"):
        if key in window:
            out[f"{key[:-2]}_us"] = window[key] * 1e6 / messages
    for key in ("loop_wakeups", "loop_preempted", "syscr", "syscw"):
        if key in window:
            out[key] = window[key] / messages
    calls = window.get("calls") or {}
    for label, keys in CALLS:
        n = sum(calls.get(k, 0) for k in keys)
        if calls:
            out[label] = n / messages
    if calls:
        out[ALL_CALLS] = sum(calls.values()) / messages
    for name, n in (window.get("syscalls") or {}).items():
        out[f"sys {name}"] = n / messages
    copies = window.get("copies")
    if copies is not None:
        out["copies of a body (Python objects)"] = sum(copies.values()) / messages
    return out


def _wait_busy(pid: int | None, bytes_per_poll: int) -> bool:
    """Wait until ``pid`` writes ``bytes_per_poll`` bytes within one LOAD_POLL_S (the load has
    reached it); False after LOAD_START_S without."""
    if pid is None:
        return False
    deadline = time.monotonic() + LOAD_START_S
    before = _io(pid).get("wchar", 0)
    while time.monotonic() < deadline:
        time.sleep(LOAD_POLL_S)
        now = _io(pid).get("wchar", 0)
        if now - before >= bytes_per_poll:
            return True
        before = now
    return False


# A key row of ``mqbroker --help``'s "broker.conf keys:" list: two spaces, the key, its text.
_HELP_KEY_ROW = re.compile(r"^  ([a-z][A-Za-z0-9.]*)\s")
# ``mqbroker --help`` of another checkout returns within this (an import of the broker).
HELP_TIMEOUT_S = 60.0


def broker_keys(code_root: Path) -> frozenset[str]:
    """The broker.conf keys ``code_root``'s broker knows (its ``mqbroker --help`` lists them):
    a checkout older than this one refuses the keys added since, which this checkout's group
    set-up writes."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(code_root), str(code_root / "gen")]))
    done = subprocess.run(
        [sys.executable, "-m", "broker", "--help"],
        cwd=tempfile.gettempdir(),  # not this checkout: PYTHONPATH decides whose broker runs
        env=env,
        capture_output=True,
        text=True,
        timeout=HELP_TIMEOUT_S,
        check=True,
    )
    _, _, keys_part = done.stdout.partition("broker.conf keys:")
    keys = frozenset(m.group(1) for m in map(_HELP_KEY_ROW.match, keys_part.splitlines()) if m)
    assert "dLegerPeers" in keys, f"{code_root}: no broker.conf keys in mqbroker --help"
    return keys


class Steps:
    """One group with the hook: windows opened on every node while the load runs."""

    def __init__(self, flush: str, work: Path, code_root: Path) -> None:
        self.flush = flush
        self.work = work
        self.code_root = code_root
        self.dir = create_work_dir("raftmq-steps-")
        this_tree = Path(__file__).resolve().parent.parent
        # Another checkout's brokers get only the keys they know (None: this checkout's, all).
        self.broker_keys = None if code_root == this_tree else broker_keys(code_root)

    @contextmanager
    def group(self) -> Iterator[Any]:
        env = {
            ENV_DIR: str(self.dir),
            # The brokers run ``code_root``'s code (this checkout, or --compare's).
            "PYTHONPATH": os.pathsep.join(
                [str(HOOK_DIR), str(self.code_root), str(self.code_root / "gen")]
            ),
        }
        # ``python -m broker`` puts its working directory first on sys.path: a neutral one, so
        # that PYTHONPATH decides whose code the brokers run.
        cwd = os.getcwd()
        os.chdir(self.work)
        try:
            with local_group(
                self.work,
                self.flush,
                False,
                metrics=False,
                node_env=env,
                broker_keys=self.broker_keys,
            ) as c:
                yield c
        finally:
            os.chdir(cwd)
            shutil.rmtree(self.dir, ignore_errors=True)

    def window(
        self, cluster: Any, size: int, in_flight: int, mode: str, seconds: float, copy_bytes: int
    ) -> dict[str, Any]:
        leader = cluster.wait_leader()
        pids = {n.node_id: cluster.pid(n) for n in cluster.nodes}
        load: dict[str, Any] = {}
        runner = threading.Thread(
            target=lambda: load.update(
                produce_case(cluster, size, in_flight, seconds + LOAD_START_S)
            )
        )
        runner.start()
        busy = _wait_busy(pids[leader], 3 * size * BUSY_MESSAGES)
        time.sleep(WARMUP_S)
        for old in self.dir.glob("*.json"):
            old.unlink()
        hook_mode = "plain" if mode == "strace" else mode
        (self.dir / WINDOW_FILE).write_text(
            json.dumps({"mode": hook_mode, "copy_bytes": copy_bytes})
        )
        before = {k: proc_counters(p) for k, p in pids.items() if p}
        tracers = self._strace(pids) if mode == "strace" else {}
        for p in pids.values():
            if p:
                os.kill(p, signal.SIGUSR1)
        time.sleep(seconds)
        for p in pids.values():
            if p:
                os.kill(p, signal.SIGUSR2)
        after = {k: proc_counters(p) for k, p in pids.items() if p}
        covered = busy and runner.is_alive()  # the load ran through the whole window
        traced = {k: self._strace_done(t) for k, t in tracers.items()}
        runner.join()
        nodes = {}
        for node_id, pid in pids.items():
            if not pid:
                continue
            dump = self._dump(pid)
            dump.update({k: after[node_id][k] - before[node_id][k] for k in after[node_id]})
            if node_id in traced:
                dump["syscalls"] = traced[node_id]
            nodes[node_id] = dump
        # The node whose send path proposed: the leader seen before the window, unless the
        # leadership moved since (a loaded machine holds elections); then the one that did.
        proposer = max(nodes, key=lambda k: int(nodes[k].get("messages", 0)))
        if int(nodes[proposer].get("messages", 0)) > int(nodes[leader].get("messages", 0)):
            leader = proposer
        messages = int(nodes[leader].get("messages", 0))
        return {
            "mode": mode,
            "size": size,
            "in_flight": in_flight,
            "leader": leader,
            "messages": messages,
            "load_covered_window": covered,
            "load": {k: load.get(k) for k in ("messages_per_s", "p50_ms", "p99_ms")},
            "nodes": nodes,
            "per_message": {
                ("leader" if k == leader else f"follower {k}"): per_message(v, messages)
                for k, v in nodes.items()
            },
        }

    def _strace(self, pids: dict[str, int | None]) -> dict[str, tuple[subprocess.Popen[str], Path]]:
        out: dict[str, tuple[subprocess.Popen[str], Path]] = {}
        if shutil.which("strace") is None:
            return out
        for node_id, pid in pids.items():
            if pid:
                path = self.dir / f"strace-{node_id}.txt"
                argv = ["strace", "-c", "-f", "-o", str(path), "-p", str(pid)]
                out[node_id] = (subprocess.Popen(argv, stderr=subprocess.DEVNULL, text=True), path)
        time.sleep(0.3)  # attached to every thread before the window's counters start
        return out

    @staticmethod
    def _strace_done(tracer: tuple[subprocess.Popen[str], Path]) -> dict[str, int]:
        proc, path = tracer
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=DUMP_WAIT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        try:
            return parse_strace(path.read_text())
        except OSError:
            return {}

    def _dump(self, pid: int) -> dict[str, Any]:
        path = self.dir / f"{pid}.json"
        deadline = time.monotonic() + DUMP_WAIT_S
        while time.monotonic() < deadline:
            if path.exists():
                return dict(json.loads(path.read_text()))
            time.sleep(0.05)
        return {"error": "no counts written"}


def run_cases(
    code_root: Path,
    flushes: Sequence[str],
    cases: Sequence[tuple[int, int]],
    seconds: float,
    modes: Sequence[str],
    copies: bool,
) -> list[dict[str, Any]]:
    out = []
    work = create_work_dir("raftmq-steps-group-")
    try:
        for flush in flushes:
            steps = Steps(flush, work, code_root)
            with steps.group() as cluster:
                for size, in_flight in cases:
                    for mode in modes:
                        w = steps.window(cluster, size, in_flight, mode, seconds, 0)
                        out.append({"flush": flush, **w})
                    if copies and size >= COPIES_MIN_BYTES:
                        # One in flight: the hook slows a node tenfold, and with one message
                        # per entry every copy is a copy of that message's body.
                        w = steps.window(cluster, size, 1, "copies", 2 * seconds, size)
                        out.append({"flush": flush, **w})
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return out


# Which window's figures a row takes: /proc's from the plain one (the profiler and strace slow
# a node down), calls from the profile, system calls from strace, copies from their own.
_FROM_MODE = {
    "plain": ("_us", "loop_", "syscr", "syscw"),
    "profile": (*(c[0] for c in CALLS), ALL_CALLS),
    "strace": ("sys ",),
    "copies": ("copies",),
}


def merge(windows: Sequence[dict[str, Any]]) -> dict[tuple[str, int, int, str], dict[str, float]]:
    """Per case and role: each figure from the window of the mode that measures it (followers:
    the mean of both; several rounds: the mean of the rounds)."""
    sums: dict[tuple[str, int, int, str], dict[str, list[float]]] = {}
    for w in windows:
        prefixes = _FROM_MODE.get(w["mode"], ())
        key3 = (w["flush"], w["size"], w["in_flight"])
        for node, figures in w["per_message"].items():
            row = sums.setdefault((*key3, "leader" if node == "leader" else "follower"), {})
            for name, value in figures.items():
                if any(name.startswith(p) or name.endswith(p) for p in prefixes):
                    row.setdefault(name, []).append(value)
        if w["mode"] == "plain":
            sums.setdefault((*key3, "leader"), {}).setdefault("msg/s", []).append(
                w["load"].get("messages_per_s") or 0.0
            )
    return {k: {n: sum(v) / len(v) for n, v in row.items()} for k, row in sums.items()}


def markdown(results: dict[str, list[dict[str, Any]]], copies_detail: bool = True) -> str:
    """One table per case: each figure per message, a column per tree and role."""
    merged = {tree: merge(ws) for tree, ws in results.items()}
    gaps = [
        f"{t} {w['mode']} {w['size']} B x {w['in_flight']}"
        for t, ws in results.items()
        for w in ws
        if not w.get("load_covered_window", True) or not w.get("messages", 1)
    ]
    trees = list(results)
    cases = sorted({k[:3] for m in merged.values() for k in m})
    lines = ["# Steps per message (bench.steps)", ""]
    if gaps:
        lines += [
            "Windows the load did not cover throughout (their figures are less exact): "
            + "; ".join(gaps),
            "",
        ]
    for flush, size, in_flight in cases:
        lines += [f"## {flush}, {size} B, {in_flight} in flight", ""]
        cols = [(t, r) for r in ("leader", "follower") for t in trees]
        lines.append("| per message | " + " | ".join(f"{r}, {t}" for t, r in cols) + " |")
        lines.append("| --- |" + " ---: |" * len(cols))
        names: list[str] = []
        for t, r in cols:
            for name in merged[t].get((flush, size, in_flight, r), {}):
                if name not in names:
                    names.append(name)
        for name in names:
            cells = []
            for t, r in cols:
                v = merged[t].get((flush, size, in_flight, r), {}).get(name)
                cells.append("" if v is None else f"{v:,.2f}" if v < 1000 else f"{v:,.0f}")
            lines.append(f"| {PLAIN_LABELS.get(name, name)} | " + " | ".join(cells) + " |")
        lines.append("")
    if copies_detail:
        for tree, ws in results.items():
            for w in ws:
                if w["mode"] != "copies":
                    continue
                lines += [
                    f"### Copy sites, {tree}, {w['flush']} {w['size']} B x {w['in_flight']}"
                    f" ({w['messages']} messages)",
                    "",
                ]
                for node, data in w["nodes"].items():
                    role = "leader" if node == w["leader"] else f"follower {node}"
                    for site, n in sorted((data.get("copies") or {}).items(), key=lambda x: -x[1]):
                        if w["messages"] and n / w["messages"] >= 0.05:
                            lines.append(f"- {role}: {n / w['messages']:.2f} per message: `{site}`")
                lines.append("")
    return "\n".join(lines)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench.steps", description=__doc__.splitlines()[0])
    p.add_argument("--flush", default="SYNC_FLUSH,ASYNC_FLUSH")
    p.add_argument("--cases", default="1024x1,1024x16,16384x256", help="SIZExIN_FLIGHT,...")
    p.add_argument("--seconds", type=float, default=4.0, help="each window")
    p.add_argument("--modes", default=",".join(MODES))
    p.add_argument("--no-copies", action="store_true", help="skip the copies window")
    p.add_argument(
        "--compare", default="", help="another checkout, whose brokers alternate with ours"
    )
    p.add_argument("--rounds", type=int, default=1, help="rounds of each tree (alternating)")
    p.add_argument("--out", default="", help="the .md (default bench/results/steps-<UTC>.md)")
    return p


def _cases(text: str) -> list[tuple[int, int]]:
    out = []
    for part in text.split(","):
        size, _, n = part.partition("x")
        out.append((int(size), int(n)))
    return out


def main(argv: list[str] | None = None) -> int:
    a = _parser().parse_args(argv)
    sweep_stale()  # groups a killed run left behind (bench.sweep)
    flushes = [f for f in a.flush.split(",") if f]
    cases = _cases(a.cases)
    modes = [m for m in a.modes.split(",") if m]
    results: dict[str, list[dict[str, Any]]] = {}
    trees = [("this", Path(__file__).resolve().parent.parent)]
    if a.compare:
        trees.append(("base", Path(a.compare).resolve()))
    for r in range(a.rounds):
        for name, root in trees if r % 2 == 0 else trees[::-1]:
            ws = run_cases(root, flushes, cases, a.seconds, modes, not a.no_copies)
            results.setdefault(name, []).extend(ws)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    RESULTS.mkdir(exist_ok=True)
    out = Path(a.out) if a.out else RESULTS / f"steps-{stamp}.md"
    out.with_suffix(".json").write_text(json.dumps(results, indent=1))
    out.write_text(markdown(results))
    print(out.read_text())
    print(f"written: {out} and {out.with_suffix('.json')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
