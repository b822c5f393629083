"""Where the generated ``apache.rocketmq.v2`` stubs come from.

They are never committed: ``make venv`` (``protos/rmq5_deps.py``) generates them from the
pinned npm package ``rocketmq-client-nodejs`` into ``build/rmq5/python``. :func:`load` puts that
directory (or ``$RAFTMQ_RMQ5_STUBS``) on ``sys.path`` once and imports the modules; a checkout
whose set-up did not run gets one clear error naming the command.
"""

from __future__ import annotations

import importlib
import os
import sys
from pathlib import Path
from types import ModuleType

from broker.errors import BrokerError

STUBS_ENV = "RAFTMQ_RMQ5_STUBS"
DEFAULT_STUBS_DIR = Path(__file__).resolve().parents[2] / "build" / "rmq5" / "python"


class StubsMissingError(BrokerError, ImportError):
    """The v2 stubs were not generated."""

    code = "RMQ5_STUBS_MISSING"


def stubs_dir() -> Path:
    return Path(os.environ.get(STUBS_ENV) or DEFAULT_STUBS_DIR)


def load() -> tuple[ModuleType, ModuleType, ModuleType]:
    """``(definition_pb2, service_pb2, service_pb2_grpc)`` of ``apache.rocketmq.v2``."""
    where = stubs_dir()
    if not (where / "apache" / "rocketmq" / "v2" / "service_pb2.py").is_file():
        raise StubsMissingError(
            f"apache.rocketmq.v2 stubs not found in {where}: run 'make venv' "
            "(protos/rmq5_deps.py generates them from the pinned rocketmq-client-nodejs)"
        )
    if str(where) not in sys.path:
        sys.path.append(str(where))
    names = ("definition_pb2", "service_pb2", "service_pb2_grpc")
    mods = [importlib.import_module(f"apache.rocketmq.v2.{n}") for n in names]
    return mods[0], mods[1], mods[2]
