"""A remoting request's custom header, read field by field: every field is text on the wire
(``extFields``), each one bounded and parsed here; a missing or malformed one refuses the
request with :class:`Refused` (a response code and a remark naming the field)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from broker.state.errors import InvalidRequestError
from remoting.codes import ResponseCode

INT32_MIN = -(1 << 31)
INT32_MAX = (1 << 31) - 1
INT64_MIN = -(1 << 63)
INT64_MAX = (1 << 63) - 1
# A text field beyond the names it carries (topics 127, groups 255, client ids 255, a
# subscription 4096, a properties string 32767): the remoting codec bounds values at 64 KiB.
MAX_TEXT_CHARS = 32_767
# A JSON body (a heartbeat, a lock request): its subscriptions and queues are bounded by the
# components (1024 subscriptions, 4096 queues); a few hundred bytes each.
MAX_JSON_BODY_BYTES = 4 << 20


class Refused(InvalidRequestError):
    """A request refused before anything changed: answered ``response_code`` (a remoting
    response code) with ``remark``."""

    def __init__(self, response_code: int, remark: str) -> None:
        super().__init__(remark)
        self.response_code = response_code
        self.remark = remark


def _bad(name: str, why: str) -> Refused:
    return Refused(ResponseCode.SYSTEM_ERROR, f"header field {name!r} {why}")


def text(
    fields: Mapping[str, str], name: str, default: str | None = None, max_chars: int = 255
) -> str:
    """Field ``name`` (``default`` when absent; absent without one: refused)."""
    value = fields.get(name)
    if value is None or value == "null":
        if default is None:
            raise _bad(name, "is missing")
        return default
    if len(value) > max_chars:
        raise _bad(name, f"is {len(value)} characters, more than {max_chars}")
    return value


def integer(
    fields: Mapping[str, str],
    name: str,
    low: int,
    high: int,
    default: int | None = None,
) -> int:
    """Field ``name`` as an integer in [low, high] (``default`` when absent or ``null``)."""
    value = fields.get(name)
    if value is None or value in ("", "null"):
        if default is None:
            raise _bad(name, "is missing")
        return default
    if len(value) > 20:
        raise _bad(name, "is not an integer")
    try:
        number = int(value)
    except ValueError:
        raise _bad(name, "is not an integer") from None
    if not low <= number <= high:
        raise _bad(name, f"is {number}, outside [{low}, {high}]")
    return number


def boolean(fields: Mapping[str, str], name: str, default: bool = False) -> bool:
    """Field ``name`` as Java writes a boolean (``true``/``false``)."""
    value = fields.get(name)
    if value is None or value in ("", "null"):
        return default
    lowered = value.lower()
    if lowered not in ("true", "false"):
        raise _bad(name, "is neither true nor false")
    return lowered == "true"


def json_body(body: bytes, what: str) -> dict[str, Any]:
    """A request's JSON body (an object), bounded; refused when it is not one."""
    if len(body) > MAX_JSON_BODY_BYTES:
        raise Refused(
            ResponseCode.SYSTEM_ERROR,
            f"{what} body of {len(body)} bytes, more than {MAX_JSON_BODY_BYTES}",
        )
    try:
        value = json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise Refused(ResponseCode.SYSTEM_ERROR, f"{what} body is not JSON") from None
    if not isinstance(value, dict):
        raise Refused(ResponseCode.SYSTEM_ERROR, f"{what} body is not a JSON object")
    return value


def json_list(value: object, what: str, max_items: int) -> list[Any]:
    """A JSON array inside a body (absent or null: empty), at most ``max_items`` long."""
    if value is None:
        return []
    if not isinstance(value, list):
        raise Refused(ResponseCode.SYSTEM_ERROR, f"{what} is not a JSON array")
    if len(value) > max_items:
        raise Refused(
            ResponseCode.SYSTEM_ERROR, f"{what} has {len(value)} items, more than {max_items}"
        )
    return value


def json_text(obj: object, name: str, what: str, max_chars: int = 255) -> str:
    """A string member of a JSON object in a body."""
    if not isinstance(obj, dict):
        raise Refused(ResponseCode.SYSTEM_ERROR, f"{what} is not a JSON object")
    value = obj.get(name)
    if not isinstance(value, str):
        raise Refused(ResponseCode.SYSTEM_ERROR, f"{what}.{name} is not a string")
    if len(value) > max_chars:
        raise Refused(
            ResponseCode.SYSTEM_ERROR,
            f"{what}.{name} is {len(value)} characters, more than {max_chars}",
        )
    return value


def json_int(obj: object, name: str, what: str, low: int, high: int) -> int:
    """An integer member of a JSON object in a body, in [low, high]."""
    value = obj.get(name) if isinstance(obj, dict) else None
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise Refused(
            ResponseCode.SYSTEM_ERROR, f"{what}.{name} is not an integer in [{low}, {high}]"
        )
    return value
