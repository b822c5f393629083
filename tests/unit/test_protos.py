"""The committed stubs in gen/ must be exactly what protos/ generates."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

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
