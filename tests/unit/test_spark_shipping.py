"""Spark's executors run the audit from the zip the driver ships (``spark_audit.job``
``SHIPPED_PACKAGES``), not from the checkout: a project package the executor-side code imports
but the zip lacks fails only on a real cluster (local runs inherit the driver's path). The
executors unpickle ``job.TaskRunner``, so they import ``spark_audit.job`` and what it reaches."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from spark_audit.job import SHIPPED_PACKAGES

ROOT = Path(__file__).resolve().parents[2]
IMPORT_TIMEOUT_S = 60
# A fresh interpreter (-I: no PYTHONPATH, no user site) with only the checkout and gen/ added;
# the venv (inside the checkout on a CI box: make venv) holds no project package;
# prints the top-level packages of every module it loaded from the checkout.
PROBE = """
import json, sys
from pathlib import Path
root = Path(sys.argv[1])
sys.path[:0] = [str(root), str(root / "gen")]
import spark_audit.job
files = (getattr(m, "__file__", None) for m in list(sys.modules.values()))
venv = Path(sys.prefix).resolve()  # third-party packages: a venv may sit in the checkout
mine = {Path(f).resolve() for f in files if f}
mine = {p for p in mine if p.is_relative_to(root) and not p.is_relative_to(venv)}
print(json.dumps(sorted({p.relative_to(root).parts[0] for p in mine})))
"""


def test_the_executors_get_every_project_package_the_job_imports() -> None:
    done = subprocess.run(
        [sys.executable, "-I", "-c", PROBE, str(ROOT)],
        capture_output=True,
        text=True,
        timeout=IMPORT_TIMEOUT_S,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    loaded = set(json.loads(done.stdout.splitlines()[-1]))
    assert {"spark_audit", "dledger"} <= loaded  # the probe sees the project's packages
    assert not loaded - set(SHIPPED_PACKAGES), f"imported but not shipped: {loaded}"
