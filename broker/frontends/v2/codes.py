"""The mapping from the error contract's stable codes to ``apache.rocketmq.v2.Code`` names,
read from the one error table (``mqerrors/errors.json``, column ``v2_code``). RocketMQ 5
clients read errors from the body's ``Status``, never from the gRPC status, so every failure of
the v2 front end passes here.
"""

from __future__ import annotations

from collections.abc import Mapping

from mqerrors.table import TABLE, v2_code_name

V2_CODE_BY_ERROR: Mapping[str, str] = {code: row.v2_code for code, row in TABLE.items()}

__all__ = ["V2_CODE_BY_ERROR", "v2_code_name"]
