"""The wire and the configuration files evolve only by adding (docs/UPGRADE.md, "For
developers"): during a rolling upgrade the previous release's nodes, NameServers, clients and
config files meet this tree's.

The previous release's ``.proto`` files, compiled with ``grpc_tools.protoc --descriptor_set_out
--include_imports`` when the release was cut, are committed as
``tests/fixtures/formats/<tag>.protoset`` (tests/fixtures/make_formats.py), so this test needs
no git history. The current ``protos/raftmq`` are compiled the same way and compared: no
message, field, enum value or RPC removed; no field number given another name, type, label or
message type; no RPC given other request or response types or streaming. Added ones pass.

The previous release's ``broker.conf`` and NameServer keys (``<tag>.configkeys.json``) must all
still be accepted: a node's config file outlives the binary it was written for.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from fixtures.make_formats import PREVIOUS_RELEASE, compile_protoset
from google.protobuf import descriptor_pb2 as d

from broker.configkeys import KEYS as BROKER_KEYS
from nameserver.config import KEYS as NAMESERVER_KEYS

ROOT = Path(__file__).resolve().parents[2]
FORMATS = ROOT / "tests" / "fixtures" / "formats"
# The project's own protos: google/protobuf's well-known types come with the compiler.
OWN_PACKAGE = "raftmq."

Shapes = dict[str, object]


def load(path: Path) -> d.FileDescriptorSet:
    fds = d.FileDescriptorSet()
    fds.ParseFromString(path.read_bytes())
    return fds


def _messages(
    prefix: str, messages: list[d.DescriptorProto]
) -> Iterator[tuple[str, d.DescriptorProto]]:
    for m in messages:
        name = f"{prefix}.{m.name}"
        yield name, m
        yield from _messages(name, list(m.nested_type))


def _enums(
    prefix: str, fd_or_msg: d.FileDescriptorProto | d.DescriptorProto
) -> Iterator[tuple[str, d.EnumDescriptorProto]]:
    for e in fd_or_msg.enum_type:
        yield f"{prefix}.{e.name}", e


def shapes(fds: d.FileDescriptorSet) -> Shapes:
    """Every message field, enum value and RPC of the project's files, by full name:
    ``message M`` -> {number: (name, type, label, type name, proto3 optional)},
    ``enum E`` -> {value name: number}, ``service S`` -> {method: (in, out, streaming)}."""
    out: Shapes = {}
    for fd in fds.file:
        if not fd.package.startswith(OWN_PACKAGE.rstrip(".")):
            continue
        top = f".{fd.package}"
        enums = list(_enums(top, fd))
        for name, m in _messages(top, list(fd.message_type)):
            out[f"message {name}"] = {
                f.number: (f.name, f.type, f.label, f.type_name, f.proto3_optional) for f in m.field
            }
            enums += list(_enums(name, m))
        for name, e in enums:
            out[f"enum {name}"] = {v.name: v.number for v in e.value}
        for s in fd.service:
            out[f"service {top}.{s.name}"] = {
                rpc.name: (
                    rpc.input_type,
                    rpc.output_type,
                    rpc.client_streaming,
                    rpc.server_streaming,
                )
                for rpc in s.method
            }
    return out


def incompatible(old: Shapes, new: Shapes) -> list[str]:
    """What a peer of the old release would misread or miss in the new shapes."""
    problems = []
    for what, old_members in old.items():
        new_members = new.get(what)
        if new_members is None:
            problems.append(f"{what} removed")
            continue
        assert isinstance(old_members, dict) and isinstance(new_members, dict)
        for key, old_shape in old_members.items():
            if key not in new_members:
                problems.append(f"{what}: {key} {old_shape} removed")
            elif new_members[key] != old_shape:
                problems.append(f"{what}: {key} was {old_shape}, is {new_members[key]}")
    return problems


@pytest.fixture(scope="module")
def current(tmp_path_factory: pytest.TempPathFactory) -> Shapes:
    dest = tmp_path_factory.mktemp("protoset") / "current.protoset"
    compile_protoset(ROOT / "protos" / "raftmq", dest)
    return shapes(load(dest))


@pytest.fixture(scope="module")
def previous() -> Shapes:
    return shapes(load(FORMATS / f"{PREVIOUS_RELEASE}.protoset"))


def test_previous_protoset_holds_the_project_services(previous: Shapes) -> None:
    services = {k for k in previous if k.startswith("service ")}
    assert {
        "service .raftmq.dledger.v1.DLedgerPeer",
        "service .raftmq.dledger.v1.DLedgerClient",
        "service .raftmq.broker.v1.Broker",
        "service .raftmq.nameserver.v1.NameServer",
    } <= services
    assert len(previous) > 100  # every message of the release, not one file


def test_protos_only_add_to_the_previous_release(previous: Shapes, current: Shapes) -> None:
    assert incompatible(previous, current) == []


def test_the_comparison_catches_each_kind_of_break(previous: Shapes) -> None:
    """Each change a previous release's peer would misread is reported."""
    msg = "message .raftmq.dledger.v1.AppendRequest"
    fields = previous[msg]
    assert isinstance(fields, dict)
    number, (name, ftype, label, tname, opt) = min(fields.items())
    broken: list[tuple[str, Shapes]] = [
        ("removed message", {k: v for k, v in previous.items() if k != msg}),
        ("removed field", {**previous, msg: {k: v for k, v in fields.items() if k != number}}),
        ("renamed", {**previous, msg: {**fields, number: (name + "x", ftype, label, tname, opt)}}),
        ("retyped", {**previous, msg: {**fields, number: (name, ftype + 1, label, tname, opt)}}),
        ("relabeled", {**previous, msg: {**fields, number: (name, ftype, 3, tname, opt)}}),
    ]
    enum = next(k for k in previous if k.startswith("enum "))
    values = previous[enum]
    assert isinstance(values, dict)
    first = next(iter(values))
    broken.append(
        ("enum value removed", {**previous, enum: {k: v for k, v in values.items() if k != first}})
    )
    broken.append(("enum value renumbered", {**previous, enum: {**values, first: 999}}))
    service = "service .raftmq.dledger.v1.DLedgerClient"
    rpcs = previous[service]
    assert isinstance(rpcs, dict)
    rpc = next(iter(rpcs))
    broken.append(
        ("rpc removed", {**previous, service: {k: v for k, v in rpcs.items() if k != rpc}})
    )
    for what, shapes_after in broken:
        assert incompatible(previous, shapes_after), what
    added = {
        **previous,
        msg: {**fields, 999: ("new_field", 13, 1, "", False)},
        "message .x.New": {},
    }
    assert incompatible(previous, added) == []


def test_config_keys_of_the_previous_release_are_still_accepted() -> None:
    old = json.loads((FORMATS / f"{PREVIOUS_RELEASE}.configkeys.json").read_text())
    assert len(old["broker"]) > 50 and len(old["nameserver"]) > 5
    assert sorted(set(old["broker"]) - set(BROKER_KEYS)) == []
    assert sorted(set(old["nameserver"]) - set(NAMESERVER_KEYS)) == []
