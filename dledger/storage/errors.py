"""The store's own errors (re-exported by ``dledger.storage`` and ``dledger.storage.store``)."""

from __future__ import annotations

from dledger.log import DLedgerError
from mqerrors import codes as E

# Characters of a path kept in an error message (messages become RPC details: bounded).
PATH_MAX_CHARS = 200


class StoreLockedError(DLedgerError):
    """Another process (or another open store in this process) holds the store's lock."""

    code = E.STORE_LOCKED


class StoreClosedError(DLedgerError):
    code = E.STORE_CLOSED


class DiskFullError(DLedgerError):
    """The file system holding the store has no space for a write. Nothing of the refused
    write is in the log (an append is all or nothing); retry once space returns."""

    code = E.DISK_FULL


def short_path(path: object) -> str:
    """``path`` as text of at most PATH_MAX_CHARS characters (the tail, which names it)."""
    text = str(path)
    return text if len(text) <= PATH_MAX_CHARS else "..." + text[-(PATH_MAX_CHARS - 3) :]
