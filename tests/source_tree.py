"""The project's source tree as the structure tests read it (test_import_rules,
test_function_length): where it is, and which packages are the product."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def product_packages(root: Path = ROOT) -> tuple[str, ...]:
    """The Makefile's ``PACKAGES`` (what ``make typecheck`` checks): the product's packages, so
    a package added there is held by the structure tests too."""
    found = re.search(r"^PACKAGES\s*:?=\s*(.+)$", (root / "Makefile").read_text(), re.M)
    assert found, "Makefile has no PACKAGES line"
    return tuple(found.group(1).split())
