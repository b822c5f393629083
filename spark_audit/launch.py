"""``mqaudit``'s console script. The audit needs the ``[audit]`` extra (pyspark, pyarrow,
pandas, numpy: about 740 MB, and Java 17 for Spark), which an install of the broker leaves
out (README, "Install"): without it, one line says what is missing and how to add it, instead
of a traceback of the first import that fails."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Sequence

PROG = "mqaudit"
# The [audit] extra's top-level modules (pyproject.toml, optional-dependencies.audit).
AUDIT_EXTRA_MODULES = ("pyspark", "pyarrow", "pandas", "numpy")
# spark_audit.report.EXIT_USAGE (that module needs numpy): a usage or input error.
EXIT_USAGE = 2


def missing_modules() -> list[str]:
    """The [audit] extra's modules this Python cannot import."""
    return [m for m in AUDIT_EXTRA_MODULES if importlib.util.find_spec(m) is None]


def main(argv: Sequence[str] | None = None) -> int:
    missing = missing_modules()
    if missing:
        print(
            f"{PROG}: needs the [audit] extra, and {', '.join(missing)} "
            f"{'is' if len(missing) == 1 else 'are'} not installed: "
            "pip install 'raftmq[audit]' (about 740 MB; Spark also needs Java 17)",
            file=sys.stderr,
        )
        return EXIT_USAGE
    from spark_audit.__main__ import main as audit_main

    return audit_main(argv)
