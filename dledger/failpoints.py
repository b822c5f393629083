"""Failpoints: named places where a test can make a real process fail on purpose.

In the manner of etcd's gofail: production code calls :func:`hit` at a few named points
(``apply``, ...); it costs one dict lookup that finds nothing unless the process was started
with the environment variable ``RAFTMQ_FAILPOINTS`` set, e.g.::

    RAFTMQ_FAILPOINTS="apply=raise"              # raise FailpointError at every hit
    RAFTMQ_FAILPOINTS="apply=raise@3"            # ... from the 3rd hit on
    RAFTMQ_FAILPOINTS="apply=raise@3,flush=raise"

Only tests set it; the variable is read once at import. The names in use are listed in
:data:`KNOWN` so that a misspelt failpoint is an error instead of a test that cannot fail.
"""

from __future__ import annotations

import os

from dledger.log import ConfigError, DLedgerError
from mqerrors import codes as E

ENV = "RAFTMQ_FAILPOINTS"
# Every failpoint the code hits, with where it is.
KNOWN: dict[str, str] = {
    "apply": "the broker state machine, before it applies a batch of committed entries",
    "ready": "the node's ready loop, at the top of each round",
    "flush": "the log store's flush (fsync) of appended entries",
}


class FailpointError(DLedgerError, RuntimeError):
    """Raised at an armed failpoint."""

    code = E.FAILPOINT


def _parse(spec: str) -> dict[str, int]:
    armed: dict[str, int] = {}
    for part in filter(None, (p.strip() for p in spec.split(","))):
        name, _, action = part.partition("=")
        kind, _, after = action.partition("@")
        if name not in KNOWN or kind != "raise":
            raise ConfigError(
                f"{ENV}: unknown failpoint or action {part!r} (known: {sorted(KNOWN)})"
            )
        armed[name] = int(after) if after else 1
    return armed


_armed: dict[str, int] = _parse(os.environ.get(ENV, ""))
_hits: dict[str, int] = {}


def hit(name: str) -> None:
    """Raise :class:`FailpointError` if ``name`` is armed and has been hit often enough."""
    if not _armed:
        return
    at = _armed.get(name)
    if at is None:
        return
    n = _hits[name] = _hits.get(name, 0) + 1
    if n >= at:
        raise FailpointError(f"failpoint {name} (hit {n})")
