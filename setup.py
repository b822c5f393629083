"""The build hook of the distribution (everything else is in pyproject.toml).

A wheel, built from the tree or from the sdist (``pip install .``, ``pip wheel .``,
``python -m build``), carries the ``apache.rocketmq.v2`` server stubs that
``broker/frontends/v2/stubs.py`` loads: ``build_py`` downloads the pinned npm tarball
``rocketmq-client-nodejs@1.0.8`` from the npm registry (no npm needed; its sha512 checked
against the pin in ``protos/rmq5_deps.py``) and generates the stubs from its two ``.proto``
files into ``broker/frontends/v2/_v2/`` of the build. The upstream files are never in the repository
nor in the sdist. An editable install (``make venv``) is left alone: there the stubs come from
``build/rmq5/python`` (``protos/rmq5_deps.py``).
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent
# Where the packaged stubs live inside the ``broker`` package (broker/frontends/v2/stubs.py looks
# there).
STUBS_SUBDIR = Path("broker") / "frontends" / "v2" / "_v2"


class BuildPyWithStubs(build_py):  # type: ignore[misc]  # setuptools is untyped here
    """``build_py``, then the v2 stubs generated into the build directory."""

    def run(self) -> None:
        super().run()
        if getattr(self, "editable_mode", False):
            return
        sys.path.insert(0, str(HERE / "protos"))
        try:
            import rmq5_deps  # protos/ is not a package
        finally:
            sys.path.pop(0)
        out = Path(self.build_lib) / STUBS_SUBDIR
        with tempfile.TemporaryDirectory() as tmp:
            try:
                proto_dir = rmq5_deps.fetch_protos(Path(tmp))
            except rmq5_deps.SetupError as exc:
                raise SystemExit(f"raftmq build: the RocketMQ 5 protos: {exc}") from None
            protos = [proto_dir / p for p in rmq5_deps.V2_PROTOS]
            rmq5_deps.generate_v2(out, proto_dir, protos)
        print(f"raftmq build: apache.rocketmq.v2 stubs generated into {out}")


setup(cmdclass={"build_py": BuildPyWithStubs})
