"""Install the pinned RocketMQ 4.x remoting-protocol client the broker's remoting tests drive.

``make venv`` runs this step (so ``make test`` and CI do): ``npm ci`` of
``protos/ons/package-lock.json`` into ``build/ons/node`` (ignored, never committed), every
package's sha512 checked by npm, no install scripts run. The client is the npm package
``ali-ons`` (RocketMQ's remoting protocol, taking a NameServer address), used unmodified by
``tests/remoting/*.js`` (docs/REMOTING.md).

A directory of its own beside ``build/rmq5``: neither install touches the other's packages.
Any failure (no npm, registry unreachable, a hash that does not match, a lockfile that names
another version) ends the step with a non-zero status and one line naming what failed.

Usage: python protos/ons_deps.py [--out DIR]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
# protos/ is not a package: its directory on the path. The npm steps are rmq5_deps's.
from rmq5_deps import SetupError, check_pinned, npm_ci

ROOT = Path(__file__).resolve().parent.parent
PINS_DIR = ROOT / "protos" / "ons"
DEFAULT_OUT = ROOT / "build" / "ons"
PACKAGE = "ali-ons"
VERSION = "3.12.0"
# The registry's integrity of the tarball (``npm view ali-ons@3.12.0 dist.integrity``): checked
# against the lockfile too, so an edited lockfile cannot swap the package.
INTEGRITY = (
    "sha512-U/xWeHU5in6Ihtu7HhfAnpluYMgjv1zdMniNSrgYZ8kxlGiYz4jP+SywhqcZ/"
    "un/P561xvLZ/u6Kb01zELYxMQ=="
)


def check_lockfile(lock_path: Path) -> None:
    """The lockfile pins the client at :data:`VERSION` with the registry's integrity."""
    check_pinned(lock_path, PACKAGE, VERSION, INTEGRITY)


def install(out: Path) -> Path:
    """``npm ci`` the pinned packages into ``out/node``; the ``node_modules`` directory."""
    check_lockfile(PINS_DIR / "package-lock.json")
    node_dir = out / "node"
    npm_ci(PINS_DIR, node_dir)
    modules = node_dir / "node_modules"
    if not (modules / PACKAGE / "lib" / "index.js").is_file():
        raise SetupError(f"{PACKAGE}@{VERSION} has no lib/index.js under {modules}")
    return modules


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="default build/ons")
    ns = parser.parse_args(argv)
    try:
        modules = install(ns.out.resolve())
    except SetupError as exc:
        print(f"ons_deps: {exc}", file=sys.stderr)
        return 1
    print(f"ons_deps: {PACKAGE}@{VERSION} in {modules}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
