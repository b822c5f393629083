"""The release this tree is: one constant every package may import (it imports nothing of the
project), so that an error naming a stored format can say which release refused it.

``RELEASE`` must equal ``pyproject.toml``'s ``version`` (tests/unit/test_release.py checks it):
change both together when a release is cut.
"""

from __future__ import annotations

RELEASE = "0.3.0.dev0"

# The group feature level (docs/RAFT.md "Feature level"): one integer per group, carried in its
# CONFIG entries, raised by an operator once every member runs a release that supports it and
# never lowered. What each level lets the group write is listed in dledger/features.py and
# broker/state/features.py.
# The highest level this release supports (and proposes when asked for "this release's").
FEATURE_LEVEL = 2
# The level of a group that never raised one: what raftmq 0.2.0 reads and writes, and what a
# peer that reports no level (0: a release before feature levels) is taken to support.
BASELINE_LEVEL = 1


def too_new_message(what: str, path: object, found: int, newest: int) -> str:
    """The one line every reader refusing a newer stored format says (error ``FORMAT_TOO_NEW``):
    the file, the version found and the newest this release reads."""
    assert found > newest, (found, newest)
    return (
        f"{what} {path}: format version {found} is newer than {newest}, the newest raftmq "
        f"{RELEASE} reads (written by a newer release: run that release, docs/FORMAT.md)"
    )
