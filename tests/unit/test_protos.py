"""The committed stubs in gen/ must be exactly what protos/ generates."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "raftmq_generate", ROOT / "protos" / "generate.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_committed_stubs_match_protos(tmp_path: Path) -> None:
    gen = _generator()
    gen.generate(tmp_path)
    assert gen.diff(tmp_path, ROOT / "gen") == []


def test_check_detects_a_stale_stub(tmp_path: Path) -> None:
    gen = _generator()
    stale = tmp_path / "stale"
    gen.generate(stale)
    target = stale / "raftmq" / "dledger" / "v1" / "dledger_pb2.py"
    target.write_text(target.read_text() + "\n# hand edit\n")
    fresh = tmp_path / "fresh"
    gen.generate(fresh)
    assert gen.diff(fresh, stale) == ["differs: raftmq/dledger/v1/dledger_pb2.py"]
    assert gen.main(["--check", "--out", str(stale)]) == 1


def test_stubs_import_and_round_trip() -> None:
    from raftmq.dledger.v1 import dledger_pb2

    req = dledger_pb2.AppendRequest(
        term=3, prev_log_index=7, entries=[dledger_pb2.Entry(term=3, index=8, body=b"x")]
    )
    back = dledger_pb2.AppendRequest.FromString(req.SerializeToString())
    assert back.entries[0].body == b"x" and back.prev_log_index == 7


def _rmq5_deps() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "raftmq_rmq5_deps", ROOT / "protos" / "rmq5_deps.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_the_rmq5_lockfile_pins_the_client_and_a_swapped_one_is_refused(tmp_path: Path) -> None:
    """protos/rmq5_deps.py checks the lockfile's rocketmq-client-nodejs against the version
    and registry integrity it records before npm ci runs."""
    deps = _rmq5_deps()
    lock = ROOT / "protos" / "rmq5" / "package-lock.json"
    deps.check_lockfile(lock)  # the committed one passes
    swapped = tmp_path / "package-lock.json"
    swapped.write_text(lock.read_text().replace(deps.NODE_INTEGRITY, "sha512-AAAA"))
    with pytest.raises(deps.SetupError, match="integrity"):
        deps.check_lockfile(swapped)


def _ons_deps() -> ModuleType:
    spec = importlib.util.spec_from_file_location("ons_deps", ROOT / "protos" / "ons_deps.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_the_ons_lockfile_pins_ali_ons_and_a_swapped_one_is_refused(tmp_path: Path) -> None:
    """protos/ons_deps.py checks the lockfile's ali-ons (the 4.x client the remoting tests
    drive) against the version and registry integrity it records before npm ci runs."""
    deps = _ons_deps()
    lock = ROOT / "protos" / "ons" / "package-lock.json"
    deps.check_lockfile(lock)  # the committed one passes
    swaps = ((deps.INTEGRITY, "sha512-AAAA"), ('"version": "3.12.0"', '"version": "3.12.1"'))
    for old, new in swaps:
        swapped = tmp_path / "package-lock.json"
        swapped.write_text(lock.read_text().replace(old, new))
        with pytest.raises(deps.SetupError, match=r"must be 3\.12\.0"):
            deps.check_lockfile(swapped)
