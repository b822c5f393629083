"""The systemd units shipped in deploy/systemd (docs/DEPLOY.md): each ExecStart runs a console
script of the distribution with options its parser accepts (log options included, checked as
the process checks them), and ``systemd-analyze verify`` finds nothing to say about the unit
(skipped, saying so, where systemd-analyze is missing)."""

from __future__ import annotations

import configparser
import shlex
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from broker.__main__ import build_parser as broker_parser
from mqcli.logs import check_log_arguments
from nameserver.__main__ import build_parser as namesrv_parser

ROOT = Path(__file__).resolve().parents[2]
UNITS = ROOT / "deploy" / "systemd"
PARSERS = {"mqbroker": broker_parser, "mqnamesrv": namesrv_parser}
INSTANCE = "broker-a-n0"
VERIFY_TIMEOUT_S = 30


def _units() -> list[Path]:
    return sorted(UNITS.glob("*.service"))


def _exec_start(unit: Path) -> list[str]:
    parser = configparser.ConfigParser(interpolation=None, strict=True)
    parser.optionxform = str  # type: ignore[assignment,method-assign]  # keys are case-sensitive
    parser.read(unit)
    return shlex.split(parser["Service"]["ExecStart"].replace("%i", INSTANCE))


def test_there_is_a_unit_per_process_kind() -> None:
    programs = {Path(_exec_start(u)[0]).name for u in _units()}
    assert programs == set(PARSERS)


@pytest.mark.parametrize("unit", _units(), ids=lambda p: p.name)
def test_exec_start_is_a_console_script_with_accepted_options(unit: Path, tmp_path: Path) -> None:
    argv = _exec_start(unit)
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    program = Path(argv[0]).name
    assert program in scripts and argv[0] == f"/opt/raftmq/bin/{program}"
    parser = PARSERS[program]()
    ns = parser.parse_args([a.replace("/var/log/raftmq", str(tmp_path)) for a in argv[1:]])
    check_log_arguments(parser, ns)  # the process's own check, with the log directory present
    assert ns.config.startswith("/etc/raftmq/") and ns.log_file


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="no systemd-analyze here")
@pytest.mark.parametrize("unit", _units(), ids=lambda p: p.name)
def test_systemd_analyze_verifies_the_unit(unit: Path, tmp_path: Path) -> None:
    """The unit as shipped, but for ExecStart's program: this venv's, which exists."""
    program = Path(_exec_start(unit)[0]).name
    here = Path(sys.executable).parent / program
    if not here.exists():
        pytest.skip(f"{here} is not installed (pip install -e .)")
    name = unit.name.replace("@.", f"@{INSTANCE}.")
    copy = tmp_path / name
    copy.write_text(unit.read_text().replace(f"/opt/raftmq/bin/{program}", str(here)))
    done = subprocess.run(
        ["systemd-analyze", "verify", str(copy)],
        capture_output=True,
        text=True,
        timeout=VERIFY_TIMEOUT_S,
        check=False,
    )
    assert done.returncode == 0 and not done.stderr.strip(), done.stderr
