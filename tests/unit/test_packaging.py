"""The distribution (README, "Install"): an sdist of the tree, and a wheel built from that sdist
as ``pip install .`` and ``python -m build`` do, carry what the broker, NameServer, clients and
CLI need to run: the ``apache.rocketmq.v2`` stubs generated at build time (setup.py's hook
downloads the pinned npm package: this test needs the npm registry, as CI has), no upstream
``.proto`` file, and Spark, pyarrow and pandas only behind the ``audit`` extra. The entry
points' modules, imported from the unpacked wheel alone (not the checkout) with pyspark, pyarrow,
pandas and numpy made unimportable, load, and so do the packaged stubs.

About 15-40 s: the wheel is built without build isolation (the project's venv has setuptools
and grpcio-tools), so only the npm tarball is downloaded."""

from __future__ import annotations

import json
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BUILD_TIMEOUT_S = 240
IMPORT_TIMEOUT_S = 60
STUBS = "broker/frontends/v2/_v2/apache/rocketmq/v2/"
# What the audit extra holds: never a dependency of the broker's install.
AUDIT_ONLY = ("pyspark", "pyarrow", "pandas", "numpy")
# The modules of the console scripts an operator runs without the extras.
CORE_SCRIPTS = ("mqbroker", "mqnamesrv", "mqadmin", "mqcluster", "mqdashboard", "mqcert")
# The venv's setuptools and grpcio-tools build it: only the npm tarball is downloaded.
PIP_WHEEL = (sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q")

# Run in a fresh interpreter whose sys.path holds the unpacked wheel and the venv's
# site-packages, never the checkout: every module of CORE_SCRIPTS (and the v2 port, which loads
# the stubs) imports with the audit extra's packages refused.
IMPORT_CHECK = r"""
import importlib, importlib.abc, json, sys
BLOCKED = set(sys.argv[2].split(","))

class NoAudit(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ImportError(f"{name} is in the audit extra only")
        return None

sys.meta_path.insert(0, NoAudit())
found = {}
for module in json.loads(sys.argv[1]) + ["broker.frontends.v2.server"]:
    found[module] = importlib.import_module(module).__file__
from broker.frontends.v2 import stubs
v2 = stubs.load()[0]
found["stubs"] = v2.__file__
print(json.dumps(found))
"""


def _tree(dest: Path) -> Path:
    """The checkout's files (tracked and new, not ignored) copied to ``dest``: the build
    writes its build/ and *.egg-info there, never in the checkout."""
    listed = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard", "-z"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    )
    for rel in listed.stdout.decode().split("\0"):
        src = ROOT / rel
        if rel and src.is_file() and not src.is_symlink():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            (dest / rel).write_bytes(src.read_bytes())
    return dest


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(the sdist, the wheel built from it)."""
    work = tmp_path_factory.mktemp("dist")
    src = _tree(work / "src")
    sdist_dir = work / "sdist"
    make_sdist = "from setuptools import build_meta as b; import sys; b.build_sdist(sys.argv[1])"
    subprocess.run(
        [sys.executable, "-c", make_sdist, str(sdist_dir)],
        cwd=src,
        capture_output=True,
        check=True,
        timeout=BUILD_TIMEOUT_S,
    )
    (sdist,) = sdist_dir.glob("raftmq-*.tar.gz")
    wheel_dir = work / "wheel"
    done = subprocess.run(
        [*PIP_WHEEL, "-w", str(wheel_dir), str(sdist)],
        cwd=work,
        capture_output=True,
        text=True,
        timeout=BUILD_TIMEOUT_S,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (wheel,) = wheel_dir.glob("raftmq-*.whl")
    return sdist, wheel


def test_the_sdist_has_the_hook_and_pins_but_no_upstream_proto(built: tuple[Path, Path]) -> None:
    with tarfile.open(built[0]) as tar:
        names = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
    assert {"setup.py", "protos/rmq5_deps.py", "protos/rmq5/package-lock.json"} <= names
    assert not [n for n in names if "apache" in n or n.startswith("build/")]


def test_the_wheel_carries_the_v2_stubs_and_spark_only_as_an_extra(
    built: tuple[Path, Path],
) -> None:
    with zipfile.ZipFile(built[1]) as whl:
        names = set(whl.namelist())
        meta = next(whl.read(n).decode() for n in names if n.endswith(".dist-info/METADATA"))
    for module in ("definition_pb2.py", "service_pb2.py", "service_pb2_grpc.py"):
        assert STUBS + module in names
    assert not [n for n in names if n.endswith(".proto") and "apache" in n]
    requires = [
        line.split(":", 1)[1].strip() for line in meta.splitlines() if "Requires-Dist" in line
    ]
    for name in AUDIT_ONLY:
        mine = [r for r in requires if r.lower().startswith(name)]
        assert mine and all('extra == "audit"' in r for r in mine), (name, mine)
    assert {"audit", "bench", "test"} <= {
        line.split(":", 1)[1].strip() for line in meta.splitlines() if "Provides-Extra" in line
    }


def test_the_installed_entry_points_import_without_spark(
    built: tuple[Path, Path], tmp_path: Path
) -> None:
    site = tmp_path / "site"
    with zipfile.ZipFile(built[1]) as whl:
        whl.extractall(site)
        points = next(n for n in whl.namelist() if n.endswith(".dist-info/entry_points.txt"))
        scripts = dict(
            line.replace(" ", "").split("=", 1)
            for line in whl.read(points).decode().splitlines()
            if "=" in line
        )
    modules = [scripts[name].split(":")[0] for name in CORE_SCRIPTS]
    venv_site = [p for p in sys.path if p.endswith("site-packages")]
    env = {"PYTHONPATH": ":".join([str(site), *venv_site]), "PATH": "/usr/bin:/bin"}
    python_check = [sys.executable, "-I", "-c", _with_path(IMPORT_CHECK)]
    done = subprocess.run(
        [*python_check, json.dumps(modules), ",".join(AUDIT_ONLY), env["PYTHONPATH"]],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=IMPORT_TIMEOUT_S,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.splitlines()[-1])
    outside = {m: f for m, f in found.items() if not Path(f).is_relative_to(site)}
    assert not outside, f"imported from outside the wheel: {outside}"
    assert Path(found["stubs"]).is_relative_to(site / STUBS)


def _with_path(script: str) -> str:
    """``-I`` ignores PYTHONPATH (and the checkout as the current directory): the script puts
    the paths given as its last argument first itself."""
    return "import sys; sys.path[:0] = sys.argv[3].split(':')\n" + script
