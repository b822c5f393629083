"""Issue #33 item 8: the arrows between packages and layers (docs/ARCHITECTURE.md, "Import
rules"), checked over the source with ``ast``: nothing is imported, so a rule holds even for a
module whose import would fail or start something.

An import counts wherever it is written (module level, inside a function, under
``TYPE_CHECKING``), relative ones resolved; importing ``a.b.c`` also runs ``a`` and ``a.b``, so
a module's reach includes the packages above everything it imports. A rule is broken by what a
module reaches, not only by what it names: ``dledger.core`` importing a helper that imports
``asyncio`` breaks the core's rule. A failure names the chain.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Iterator, Mapping
from functools import cache
from pathlib import Path

import pytest
from source_tree import ROOT, product_packages

# The top-level names of gRPC and protobuf (``raftmq`` is the generated protobuf code, gen/).
GRPC_AND_PROTOBUF = frozenset({"grpc", "grpc_status", "google", "raftmq"})
# Packages that import no other package of the project, so anything may import them.
NEUTRAL = frozenset(
    {"mqcli", "mqsecurity", "mqmetrics", "mqerrors", "mqrelease", "prockit", "remoting"}
)
# The servers' packages: dledger (the Raft library), the broker over it, the NameServer beside.
SERVERS = frozenset({"broker", "dledger", "nameserver"})
# What dledger may not reach: the broker and everything built on it or on messages.
ABOVE_DLEDGER = frozenset(
    {"broker", "nameserver", "client", "msgcodec", "jepsen_like", "spark_audit", "bench"}
    | {"mqdashboard", "mqcluster"}
)


class ImportGraph:
    """The project's modules under ``roots`` and the modules each one imports. The generated
    code (gen/raftmq) is not scanned: it is a leaf, named ``raftmq``, that imports only
    protobuf and itself."""

    def __init__(self, *roots: Path) -> None:
        self.roots = roots

    @cache  # noqa: B019 (one graph per test run; the cache dies with it)
    def file(self, module: str) -> Path | None:
        for base in self.roots:
            path = base.joinpath(*module.split("."))
            if path.with_suffix(".py").is_file():
                return path.with_suffix(".py")
            if (path / "__init__.py").is_file():
                return path / "__init__.py"
        return None

    def modules_under(self, folder: str) -> list[str]:
        """Every module in the package folder ``folder`` (``dledger/core``), sorted."""
        out = []
        for path in sorted((self.roots[0] / folder).rglob("*.py")):
            parts = list(path.relative_to(self.roots[0]).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out.append(".".join(parts))
        return out

    @cache  # noqa: B019
    def imports(self, module: str) -> tuple[str, ...]:
        """The absolute names ``module`` imports (``from a import b``: ``a``, and ``a.b`` when
        that is a module)."""
        path = self.file(module)
        assert path is not None, module
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        out: list[str] = []
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                out += [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*up, base] if base else up)
                out.append(base)
                out += [f"{base}.{a.name}" for a in node.names if self.file(f"{base}.{a.name}")]
        return tuple(out)

    def reach(self, start: str, cut: Iterable[tuple[str, str]] = ()) -> dict[str, str]:
        """Every name ``start`` reaches -> the module that imported it (``start`` -> ""):
        project modules by full name, anything else by its top-level name. Edges in ``cut``
        (importer, imported) are not followed."""
        cut = set(cut)
        seen: dict[str, str] = {}
        todo = [(p, "") for p in _prefixes(start)]
        while todo:
            name, by = todo.pop()
            if name in seen:
                continue
            seen[name] = by
            for imported in self.imports(name):
                if (name, imported) in cut:
                    continue
                for prefix in _prefixes(imported):
                    if self.file(prefix) is not None:
                        todo.append((prefix, name))
                    elif prefix == imported.split(".")[0]:
                        seen.setdefault(prefix, name)
        return seen


def _prefixes(name: str) -> Iterator[str]:
    parts = name.split(".")
    for i in range(1, len(parts) + 1):
        yield ".".join(parts[:i])


def chain(reached: Mapping[str, str], name: str) -> str:
    """How ``name`` was reached: ``name <- importer <- ... <- start``."""
    out = [name]
    while reached.get(out[-1]):
        out.append(reached[out[-1]])
    return " <- ".join(out)


def broken(
    graph: ImportGraph,
    folder: str,
    forbidden: frozenset[str],
    cut: Iterable[tuple[str, str]] = (),
) -> list[str]:
    """For every module under ``folder``: each forbidden top-level package it reaches, with
    the chain (the first found per module and package)."""
    out = []
    for module in graph.modules_under(folder):
        reached = graph.reach(module, cut)
        tops = {name.split(".")[0]: name for name in reached}
        out += [chain(reached, tops[top]) for top in sorted(forbidden & tops.keys())]
    return out


@pytest.fixture(scope="module")
def graph() -> ImportGraph:
    return ImportGraph(ROOT)


# ------------------------------------------------------------------------- package rules


def test_the_raft_core_reaches_neither_grpc_nor_asyncio(graph: ImportGraph) -> None:
    """docs/RAFT.md: the core is pure (no I/O, no event loop), driven by the simulator and by
    dledger.server alike."""
    assert "dledger.core.raft" in graph.modules_under("dledger/core")
    found = broken(graph, "dledger/core", GRPC_AND_PROTOBUF | {"asyncio"})
    assert found == [], "\n".join(found)


def test_dledger_reaches_nothing_above_it(graph: ImportGraph) -> None:
    """broker -> dledger, never the reverse; dledger knows nothing of messages (msgcodec)."""
    assert set(product_packages()) >= ABOVE_DLEDGER  # the names are real packages
    found = broken(graph, "dledger", ABOVE_DLEDGER)
    assert found == [], "\n".join(found)


def test_the_client_reaches_no_server_package(graph: ImportGraph) -> None:
    """A client library for users' processes: the servers' packages are not its to load."""
    reached = graph.reach("client.route")
    assert {"mqsecurity", "grpc"} <= reached.keys()  # the scan sees what it must allow
    found = broken(graph, "client", SERVERS | {"jepsen_like", "spark_audit", "bench", "mqcluster"})
    assert found == [], "\n".join(found)


def test_the_dashboard_reaches_no_server_package(graph: ImportGraph) -> None:
    """A tool over the client library: it reads the cluster as any remote user would."""
    assert "client" in graph.reach("mqdashboard.reader")
    found = broken(graph, "mqdashboard", SERVERS | {"mqcluster"})
    assert found == [], "\n".join(found)


def test_the_neutral_packages_reach_nothing_of_the_project(graph: ImportGraph) -> None:
    """client/ and dledger/ may import mqsecurity, mqmetrics and mqcli only because these
    import no other project package."""
    assert "grpc" in graph.reach("mqsecurity.channels")
    project = frozenset(product_packages()) - {"raftmq"}
    for package in sorted(NEUTRAL):
        found = broken(graph, package, project - {package})
        assert found == [], "\n".join(found)


def test_the_remoting_protocol_stands_on_the_standard_library_only(graph: ImportGraph) -> None:
    """remoting/ (RocketMQ's 4.x protocol: frames, server, client) is under the NameServer's and
    the broker's front ends, the tests and mqbench: it reaches no project package, and neither
    gRPC nor protobuf (it is plain asyncio)."""
    assert "asyncio" in graph.reach("remoting.server")  # the scan sees what it must allow
    project = frozenset(product_packages()) - {"remoting"}
    found = broken(graph, "remoting", project | GRPC_AND_PROTOBUF)
    assert found == [], "\n".join(found)


def test_the_shared_rpc_plumbing_stands_on_the_neutral_packages_only(graph: ImportGraph) -> None:
    """rpckit (the error contract, the call and decode guards, port binding) serves dledger,
    the broker and the NameServer alike: it reaches none of them, nor anything above them, so
    no server borrows another's package for its gRPC plumbing."""
    assert {"mqsecurity", "grpc"} <= graph.reach("rpckit.serving").keys()
    assert "mqerrors" in graph.reach("rpckit.decodeguard")  # the scan sees what it must allow
    project = frozenset(product_packages()) - {"raftmq"}
    found = broken(graph, "rpckit", project - NEUTRAL - {"rpckit"})
    assert found == [], "\n".join(found)


def test_the_nameserver_reaches_neither_dledger_nor_the_broker(graph: ImportGraph) -> None:
    """The NameServer is a peer of the broker groups, not built on them: its config file,
    process life and gRPC plumbing come from prockit and rpckit, not from dledger."""
    reached = graph.reach("nameserver.__main__")
    assert {"prockit", "rpckit", "grpc"} <= reached.keys()
    found = broken(graph, "nameserver", SERVERS - {"nameserver"})
    assert found == [], "\n".join(found)


# ------------------------------------------------------------------------- broker layers
# broker/ is cut by layer, one folder each (docs/ARCHITECTURE.md, "Where things live"), lowest
# first: the replicated state (broker/state: what apply builds, its records, stores and tables),
# the leader-side components over it (broker/components: sends, offsets, topics, POP, timers,
# ...), the protocol front ends (broker/frontends: v1, v2, the call guard) and, at the top level,
# the process wiring (BROKER_PROCESS). A layer imports only layers below it; state and components
# are driven through plain Python calls and know nothing of gRPC or protobuf.
BROKER_LAYERS = ("broker/state", "broker/components", "broker/frontends")
# The process wiring: the package, the composition root and what the process serves besides the
# front ends. A new top-level module says here that it is one; anything else goes in a folder.
BROKER_PROCESS = frozenset(
    {
        "broker",
        "broker.__main__",
        "broker.app",
        "broker.config",
        "broker.configdocs",
        "broker.configkeys",
        "broker.configview",
        "broker.liveconfig",
        "broker.metrics",
        "broker.registration",
    }
)


def broker_layer(graph: ImportGraph, folder: str) -> frozenset[str]:
    return frozenset(graph.modules_under(folder))


# Imports by which broker components reach gRPC today, as (importer, imported): each one a
# debt, never a place to add to. The list may only shrink: an entry that no longer is an
# import, or no longer brings gRPC, fails test_the_allowed_grpc_edges_are_still_needed.
ALLOWED_GRPC_EDGES: dict[tuple[str, str], str] = {
    # ProposalLostError: importing it runs dledger/server/__init__.py, which imports the node.
    ("broker.components.sending", "dledger.server.errors"): "ProposalLostError",
}


def test_every_broker_module_is_in_one_layer(graph: ImportGraph) -> None:
    """A new module under broker/ says where it belongs (and so which rules hold it)."""
    modules = set(graph.modules_under("broker"))
    layered = set().union(*(broker_layer(graph, folder) for folder in BROKER_LAYERS))
    assert {"broker.state.machine", "broker.components.sending"} <= layered
    assert sorted(modules - layered - BROKER_PROCESS) == [], "a module outside the layers"
    assert sorted(BROKER_PROCESS - modules) == [], "listed, gone"


def test_broker_layers_import_only_the_layers_below(graph: ImportGraph) -> None:
    """The replicated state imports no component, front end or process wiring; the components
    import no front end or process wiring (the package ``broker`` itself, run by every import,
    only sets gRPC's log level)."""
    above = {"broker/state": ("broker.components", "broker.frontends")}
    above["broker/components"] = ("broker.frontends",)
    found = []
    for folder, forbidden in above.items():
        for module in graph.modules_under(folder):
            reached = graph.reach(module)
            found += [
                chain(reached, name)
                for name in sorted(reached)
                if name.startswith(forbidden) or (name in BROKER_PROCESS and name != "broker")
            ]
    assert found == [], "\n".join(found)


def test_broker_components_reach_no_grpc_or_protobuf(graph: ImportGraph) -> None:
    found = []
    components = broker_layer(graph, "broker/state") | broker_layer(graph, "broker/components")
    for module in sorted(components):
        reached = graph.reach(module, ALLOWED_GRPC_EDGES)
        tops = {name.split(".")[0]: name for name in reached}
        found += [chain(reached, tops[t]) for t in sorted(GRPC_AND_PROTOBUF & tops.keys())]
    assert found == [], "\n".join(found)


def test_the_allowed_grpc_edges_are_still_needed(graph: ImportGraph) -> None:
    components = broker_layer(graph, "broker/state") | broker_layer(graph, "broker/components")
    for importer, imported in ALLOWED_GRPC_EDGES:
        assert importer in components
        assert imported in graph.imports(importer), f"{importer} no longer imports {imported}"
        assert GRPC_AND_PROTOBUF & {n.split(".")[0] for n in graph.reach(imported)}, (
            f"{imported} no longer brings gRPC: drop the entry"
        )


def test_the_v2_front_end_reaches_nothing_of_the_v1_protocol(graph: ImportGraph) -> None:
    """The RocketMQ 5 front end is a peer of v1 over the same components: its leader-only work
    goes through the leader operations and their one forwarder (raftmq.broker.internal.v1),
    never as raftmq.broker.v1 calls or messages (docs/ARCHITECTURE.md, "Leader operations and
    the forwarder")."""
    # The port takes the composition root's Broker bundle (a type-only import, under
    # TYPE_CHECKING), which holds the v1 servicer too: not followed.
    bundle = [("broker.frontends.v2.server", "broker.app")]
    found = []
    for module in graph.modules_under("broker/frontends/v2"):
        reached = graph.reach(module, bundle)
        for name in sorted(n for n in reached if graph.file(n) is not None):
            found += [
                f"{imported} <- {chain(reached, name)}"
                for imported in graph.imports(name)
                if imported.startswith("raftmq.broker.v1")
                or imported == "broker.frontends.v1.service"
            ]
    assert found == [], "\n".join(found)
    assert "broker.frontends.internal.forwarder" in graph.reach("broker.frontends.v2.service")


# ------------------------------------------------------------------------- the scan itself


def test_the_scan_has_teeth(tmp_path: Path) -> None:
    """Relative imports, imports inside functions and under TYPE_CHECKING, ``from a import
    module``, and the packages a deep import runs all count."""
    files = {
        "core/__init__.py": "",
        "core/pure.py": "from . import helper\n",
        "core/helper.py": "def f():\n    from ..side import deep\n",
        "side/__init__.py": "import asyncio\n",
        "side/deep.py": "",
        "top/__init__.py": "",
        "top/a.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import grpc\n",
        "top/b.py": "import side.deep\n",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    g = ImportGraph(tmp_path)
    assert broken(g, "core", frozenset({"asyncio"})) == [
        "asyncio <- side <- core.helper",
        "asyncio <- side <- core.helper <- core.pure",
    ]
    assert broken(g, "top", frozenset({"grpc", "side"})) == ["grpc <- top.a", "side <- top.b"]
    assert broken(g, "top", frozenset({"side"}), [("top.b", "side.deep")]) == []
