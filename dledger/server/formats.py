"""The start's first look at the store (docs/FORMAT.md, "Format versions"): every file of the
node's whose format has a version is read, and one written by a newer release stops the start
(FormatTooNewError) before anything is opened, finished, cut, recovered or rewritten. A file
that does not decode is left to its own reader, which knows what damage means for it."""

from __future__ import annotations

import contextlib
from pathlib import Path

from dledger.log import ConfigError, DLedgerError, FormatTooNewError
from dledger.server.membership import load_conf
from dledger.server.snapshots import INSTALL_MARKER, STAGING_DIR, staged_header
from dledger.storage import codec
from dledger.storage.meta import CHECKPOINT_FILE, META_FILE

# The largest checkpoint or meta file read here: both are well under 2 KiB (a meta holds a
# vote of at most MAX_VOTED_FOR_BYTES); only the header is looked at.
MAX_META_READ_BYTES = 4096


def check_store_formats(store_dir: str, node_id: str) -> None:
    """FormatTooNewError (naming the file and both versions) when the checkpoint, ``meta``,
    ``membership.json`` or the header of a snapshot install to finish was written by a
    newer release. Reads only."""
    root = Path(store_dir)
    for name, decode in (
        (CHECKPOINT_FILE, codec.decode_checkpoint),
        (META_FILE, codec.decode_hard_state),
    ):
        path = root / name
        try:
            with path.open("rb") as f:
                data = f.read(MAX_META_READ_BYTES)
        except FileNotFoundError:
            continue
        with contextlib.suppress(codec.RecordError):
            decode(data, str(path))
    with contextlib.suppress(ConfigError):
        load_conf(store_dir, node_id)
    staging = root / STAGING_DIR
    if (staging / INSTALL_MARKER).exists():
        try:
            staged_header(staging / "ready")
        except FormatTooNewError:
            raise
        except (OSError, ValueError, DLedgerError):
            pass  # finish_install's to report
