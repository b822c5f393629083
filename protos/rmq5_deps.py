"""Fetch the pinned RocketMQ 5 packages and generate the ``apache.rocketmq.v2`` server stubs.

The upstream definitions are never copied into the repository. This step (``make venv`` runs
it, so ``make test``, ``make demo`` and CI do) takes them from the npm package
``rocketmq-client-nodejs@1.0.8``, which ships ``proto/apache/rocketmq/v2/*.proto``, and writes
into ``build/rmq5/`` (ignored, never committed):

- ``node/``: ``npm ci`` of ``protos/rmq5/package-lock.json`` (every package's sha512 checked by
  npm); the Node.js client the tests run, and the ``.proto`` files.
- ``python/``: the Python stubs of ``service.proto`` and ``definition.proto`` that
  :mod:`broker.frontends.v2` imports (made by ``protos/generate.py``'s generator).
- ``pyclient/``: a venv holding the official Python client ``rocketmq-python-client==5.1.2``
  (its wheel checked against the sha256 in ``protos/rmq5/python-client.txt``) and its pinned
  dependencies. A venv of its own: the client bundles its own ``apache.rocketmq.v2`` stubs,
  which cannot be loaded in one process with the server's.

Any failure (no npm, registry unreachable, a hash that does not match) ends the step with a
non-zero status and one line naming what failed: nothing is skipped silently.

Usage: python protos/rmq5_deps.py [--out DIR]
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from generate import ROOT, generate  # protos/ is not a package: its directory on the path

PINS_DIR = ROOT / "protos" / "rmq5"
DEFAULT_OUT = ROOT / "build" / "rmq5"
NODE_PACKAGE = "rocketmq-client-nodejs"
NODE_VERSION = "1.0.8"
# The registry's integrity of the tarball (``npm view rocketmq-client-nodejs@1.0.8 dist``):
# checked here against the lockfile too, so an edited lockfile cannot swap the package.
NODE_INTEGRITY = (
    "sha512-qSzgN9/oFy+iqGIbXoAdY4L/hcAGDq1PqOk4/zXs3Jz6bxsGRL3GA5QSOFS1nVUtFzGTiPyHEz4f/"
    "ITloCWEJg=="
)
V2_PROTOS = ("apache/rocketmq/v2/definition.proto", "apache/rocketmq/v2/service.proto")
# A fresh npm ci or pip install over the network; generous, but never unbounded.
STEP_TIMEOUT_S = 900
# The npm registry the build hook downloads the pinned tarball from (``setup.py``, a wheel
# built without ``make``): npm's own setting when set, else the public registry.
REGISTRY_ENV = ("RAFTMQ_NPM_REGISTRY", "npm_config_registry")
DEFAULT_REGISTRY = "https://registry.npmjs.org"
# The tarball is 235 KB; a registry answering more is not the pinned package.
MAX_TARBALL_BYTES = 8 << 20
# Each .proto read from it: the two are about 30 KB.
MAX_PROTO_BYTES = 1 << 20
FETCH_TIMEOUT_S = 120


class SetupError(Exception):
    """One step failed; the message says which and why."""


def _run(argv: list[str], cwd: Path | None = None, env: dict[str, str] | None = None) -> None:
    try:
        done = subprocess.run(
            argv,
            cwd=cwd,
            env=env,
            capture_output=True,
            text=True,
            timeout=STEP_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise SetupError(f"{' '.join(argv)}: {exc}") from None
    if done.returncode != 0:
        tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-15:])
        raise SetupError(f"{' '.join(argv)} failed (exit {done.returncode}):\n{tail}")


def check_pinned(lock_path: Path, package: str, version: str, integrity: str) -> None:
    """The lockfile pins ``package`` at ``version`` with the registry's ``integrity``."""
    lock = json.loads(lock_path.read_text())
    entry = lock.get("packages", {}).get(f"node_modules/{package}", {})
    if entry.get("version") != version or entry.get("integrity") != integrity:
        raise SetupError(
            f"{lock_path}: {package} must be {version} with integrity "
            f"{integrity} (found {entry.get('version')} {entry.get('integrity')})"
        )


def check_lockfile(lock_path: Path) -> None:
    """The lockfile pins the client at ``NODE_VERSION`` with the registry's integrity."""
    check_pinned(lock_path, NODE_PACKAGE, NODE_VERSION, NODE_INTEGRITY)


def npm_ci(pins_dir: Path, node_dir: Path) -> None:
    """``npm ci`` of ``pins_dir``'s package.json and package-lock.json into a fresh
    ``node_dir``: exactly the lockfile, each tarball's integrity checked, no install scripts."""
    npm = shutil.which("npm")
    if npm is None:
        raise SetupError("npm not found: node 20 and npm are needed (apt-get install nodejs npm)")
    shutil.rmtree(node_dir, ignore_errors=True)
    node_dir.mkdir(parents=True)
    for name in ("package.json", "package-lock.json"):
        shutil.copy(pins_dir / name, node_dir / name)
    _run([npm, "ci", "--ignore-scripts", "--no-audit", "--no-fund"], cwd=node_dir)


def install_node(out: Path) -> Path:
    """``npm ci`` the pinned packages into ``out/node``; the directory holding the protos."""
    check_lockfile(PINS_DIR / "package-lock.json")
    node_dir = out / "node"
    npm_ci(PINS_DIR, node_dir)
    proto_dir = node_dir / "node_modules" / NODE_PACKAGE / "proto"
    missing = [p for p in V2_PROTOS if not (proto_dir / p).is_file()]
    if missing:
        raise SetupError(f"{NODE_PACKAGE}@{NODE_VERSION} ships no {missing} under {proto_dir}")
    return proto_dir


def registry_tarball_url() -> str:
    base = next((os.environ[k] for k in REGISTRY_ENV if os.environ.get(k)), DEFAULT_REGISTRY)
    name = f"{NODE_PACKAGE}-{NODE_VERSION}.tgz"
    return f"{base.rstrip('/')}/{NODE_PACKAGE}/-/{name}"


def check_integrity(data: bytes) -> None:
    """``data`` is the tarball the pin names (npm's ``sha512-<base64>`` integrity)."""
    digest = "sha512-" + base64.b64encode(hashlib.sha512(data).digest()).decode()
    if digest != NODE_INTEGRITY:
        raise SetupError(f"{NODE_PACKAGE}@{NODE_VERSION}: integrity {digest}, want the pin's")


def fetch_protos(dest: Path) -> Path:
    """Download the pinned npm tarball (no npm needed), check its integrity and write its two
    v2 ``.proto`` files under ``dest``; the include directory for protoc. What the build
    hook (``setup.py``) uses: a wheel built from the sdist or the tree needs only Python and
    the registry."""
    url = registry_tarball_url()
    try:
        with urllib.request.urlopen(url, timeout=FETCH_TIMEOUT_S) as answer:
            data = answer.read(MAX_TARBALL_BYTES + 1)
    except OSError as exc:
        raise SetupError(f"download {url}: {exc}") from None
    if len(data) > MAX_TARBALL_BYTES:
        raise SetupError(f"{url}: over {MAX_TARBALL_BYTES} bytes: not the pinned package")
    check_integrity(data)
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        for rel in V2_PROTOS:
            try:
                member = tar.extractfile(f"package/proto/{rel}")
            except KeyError:
                member = None
            if member is None:
                raise SetupError(f"{url}: package/proto/{rel} is not a file")
            text = member.read(MAX_PROTO_BYTES + 1)
            if len(text) > MAX_PROTO_BYTES:
                raise SetupError(f"{url}: {rel} over {MAX_PROTO_BYTES} bytes")
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            (dest / rel).write_bytes(text)
    return dest


def generate_v2(out: Path, proto_dir: Path, protos: list[Path]) -> None:
    """The v2 stubs without their gRPC types (the build hook's: no mypy-protobuf there)."""
    generate(out, proto_dir, protos, grpc_types=False)


def generate_stubs(proto_dir: Path, out: Path) -> None:
    """The server's ``apache.rocketmq.v2`` stubs in ``out/python``."""
    py_dir = out / "python"
    shutil.rmtree(py_dir, ignore_errors=True)
    generate(py_dir, proto_dir, [proto_dir / p for p in V2_PROTOS])


def install_python_client(out: Path) -> None:
    """The official Python client in its own venv ``out/pyclient``."""
    venv = out / "pyclient"
    shutil.rmtree(venv, ignore_errors=True)
    _run([sys.executable, "-m", "venv", str(venv)])
    pip = [str(venv / "bin" / "python"), "-m", "pip", "--disable-pip-version-check"]
    client = str(PINS_DIR / "python-client.txt")
    _run([*pip, "install", "--no-deps", "--require-hashes", "-r", client])
    _run([*pip, "install", "-r", str(PINS_DIR / "python-client-deps.txt")])
    _run([*pip, "check"])
    # The client makes ~/logs/rocketmq_python on import: a HOME of its own for the check.
    with tempfile.TemporaryDirectory() as home:
        check_env = {"PATH": os.environ.get("PATH", ""), "HOME": home}
        _run([str(venv / "bin" / "python"), "-c", "import rocketmq.v5.producer"], env=check_env)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="default build/rmq5")
    ns = parser.parse_args(argv)
    out: Path = ns.out.resolve()
    try:
        proto_dir = install_node(out)
        generate_stubs(proto_dir, out)
        install_python_client(out)
    except SetupError as exc:
        print(f"rmq5_deps: {exc}", file=sys.stderr)
        return 1
    print(f"rmq5_deps: {NODE_PACKAGE}@{NODE_VERSION}, v2 stubs and the Python client in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
