"""The previous release, built from the repository's own history for the upgrade tests
(issue #38; the design's section 2c "How CI gets the previous release").

The release is pinned by its commit, not only by its tag: a clone may lack tags (CI's checkout
is made outside the tree), and a tag can be moved. When the tag is there it must name the pinned
commit. A clone without the commit (a shallow one) fails with one line saying what CI needs: the
rules forbid skipping silently.

The old tree is ``git archive <sha> | tar -x`` into a temporary directory (no worktree, nothing
written into ``.git``; about 6 MB). Its ``gen/`` is committed, so no protoc runs. Its processes
run with this venv's interpreter and ``PYTHONPATH=<old>:<old>/gen``, which shadows the editable
install: :meth:`OldTree.check_imports` proves they import the old code.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from broker.frontends.v2 import stubs

ROOT = Path(__file__).resolve().parents[1]
# The release before this tree: (tag, commit). Cutting a release updates it (docs/UPGRADE.md).
PREVIOUS_RELEASE = ("v0.2.0", "0918e8ff1701021cec47a3595ec2e3950ad7f364")
# What the previous release's mqrelease.RELEASE says (its tag without the "v").
PREVIOUS_RELEASE_NAME = PREVIOUS_RELEASE[0].removeprefix("v")
# Seconds for one git command of the build (archive of ~6 MB: 0.25 s measured).
GIT_TIMEOUT_S = 60.0
# Seconds for the old tree's import check (a cold interpreter importing grpc and the broker).
IMPORT_CHECK_TIMEOUT_S = 60.0
# Modules whose files must come from the old tree: the node's and the tools' entry points.
OLD_MODULES = ("mqrelease", "dledger", "broker.__main__", "nameserver", "mqcluster.cluster")


# The variables :meth:`OldTree.env` sets.
OLD_ENV_KEYS = ("PYTHONPATH", "PYTHONSAFEPATH", stubs.STUBS_ENV)


class PreviousReleaseMissing(AssertionError):
    """The pinned commit is not in this clone, or its tag names another commit."""


def _git(*args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        ["git", "-C", str(ROOT), *args],
        input=stdin,
        capture_output=True,
        timeout=GIT_TIMEOUT_S,
        check=False,
    )


def check_previous_release() -> str:
    """The pinned commit, after checking that this clone has it and that the tag, when this
    clone has tags, names it."""
    tag, sha = PREVIOUS_RELEASE
    if _git("cat-file", "-e", f"{sha}^{{commit}}").returncode != 0:
        raise PreviousReleaseMissing(
            f"the previous release {sha} ({tag}) is not in this clone: CI needs a full clone "
            f"(git fetch --unshallow --tags)"
        )
    tagged = _git("rev-parse", "-q", "--verify", f"refs/tags/{tag}^{{commit}}")
    if tagged.returncode == 0:
        named = tagged.stdout.decode().strip()
        if named != sha:
            raise PreviousReleaseMissing(
                f"tag {tag} names {named}, but tests/upgrade_support.py pins {sha}: "
                f"update PREVIOUS_RELEASE or the tag"
            )
    return sha


@dataclass(frozen=True)
class OldTree:
    """The previous release's source tree, extracted at ``root``."""

    root: Path
    sha: str

    def env(self, base: dict[str, str] | None = None) -> dict[str, str]:
        """``base`` (default: this process's environment) with PYTHONPATH naming the old tree
        and its generated stubs only, and the RocketMQ 5 stubs this checkout generated (they
        are never committed; both releases read them from RAFTMQ_RMQ5_STUBS)."""
        env = dict(os.environ if base is None else base)
        env["PYTHONPATH"] = f"{self.root}{os.pathsep}{self.root / 'gen'}"
        # `python -m` and `-c` put the working directory first on sys.path: run from a
        # checkout of the current tree (as the tests are), an old node would import the
        # current code. PYTHONSAFEPATH (Python 3.11) leaves it out.
        env["PYTHONSAFEPATH"] = "1"
        env[stubs.STUBS_ENV] = str(stubs.stubs_dir())
        return env

    def node_env(self) -> dict[str, str]:
        """What ``LocalCluster.node_env`` takes to start a node from the old tree."""
        return {k: v for k, v in self.env().items() if k in OLD_ENV_KEYS}

    def run(self, argv: list[str], timeout_s: float) -> subprocess.CompletedProcess[str]:
        """``python ARGV`` (this venv's interpreter) under the old tree's environment."""
        return subprocess.run(
            [sys.executable, *argv],
            env=self.env(),
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )

    def check_imports(self) -> None:
        """Step 0: a process under :meth:`env` imports every module of ``OLD_MODULES`` from
        the old tree, and it is the previous release."""
        probe = (
            "import importlib, json, sys\n"
            f"mods = {OLD_MODULES!r}\n"
            "files = {m: importlib.import_module(m).__file__ for m in mods}\n"
            "import mqrelease\n"
            "json.dump({'files': files, 'release': mqrelease.RELEASE}, sys.stdout)\n"
        )
        done = self.run(["-c", probe], IMPORT_CHECK_TIMEOUT_S)
        assert done.returncode == 0, f"the old tree does not import: {done.stderr[-3000:]}"
        seen = json.loads(done.stdout)
        elsewhere = {
            m: f
            for m, f in seen["files"].items()
            if not Path(f).resolve().is_relative_to(self.root)
        }
        assert not elsewhere, f"modules imported from outside the old tree {self.root}: {elsewhere}"
        assert seen["release"] == PREVIOUS_RELEASE_NAME, seen


def build_previous_release(dest: Path) -> OldTree:
    """Extract the previous release's tree into ``dest`` (created; must not exist)."""
    sha = check_previous_release()
    dest.mkdir(parents=True)
    archive = _git("archive", "--format=tar", sha)
    assert archive.returncode == 0, archive.stderr.decode()
    untar = subprocess.run(
        ["tar", "-x", "-C", str(dest)],
        input=archive.stdout,
        capture_output=True,
        timeout=GIT_TIMEOUT_S,
        check=False,
    )
    assert untar.returncode == 0, untar.stderr.decode()
    assert (dest / "gen").is_dir(), f"{sha} has no committed gen/"
    return OldTree(dest.resolve(), sha)
