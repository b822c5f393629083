"""Stored messages as a raw pull answer carries them (docs/FORMAT.md, "Broker: Message").

The broker sends the stored bytes of the messages back to back; the stored layout is read by
the shared codec (:mod:`msgcodec`, which depends on neither broker nor client). The broker
checked every message's CRC before sending it, so this reads without it; any inconsistency
(a cut message, a field that overruns, counts that do not match) raises
``MQClientError("BAD_RESPONSE")``.
"""

from __future__ import annotations

from collections.abc import Sequence

from client.errors import MQClientError
from client.message import MessageExt
from mqerrors import codes as E
from msgcodec import OFFSET_MSG_ID_PREFIX_CHARS, CorruptMessageError, decode_rows


def _bad(why: str) -> MQClientError:
    return MQClientError.local(E.BAD_RESPONSE, f"raw pull answer: {why}")


def decode_messages(
    raw: bytes,
    queue_offsets: Sequence[int],
    positions: Sequence[int],
    offset_msg_id_prefix: str,
    broker_name: str,
) -> list[MessageExt]:
    """Every message of ``raw`` (stored messages back to back), with its queue offset and
    commitlog position."""
    if len(queue_offsets) != len(positions):
        raise _bad(f"{len(queue_offsets)} queue offsets for {len(positions)} positions")
    if len(offset_msg_id_prefix) != OFFSET_MSG_ID_PREFIX_CHARS:
        raise _bad(
            f"offset_msg_id_prefix {offset_msg_id_prefix!r} is not"
            f" {OFFSET_MSG_ID_PREFIX_CHARS} characters"
        )
    try:
        rows = decode_rows(raw, 0, len(positions), verify_crc=False)
    except CorruptMessageError as exc:
        raise _bad(str(exc)) from None
    out: list[MessageExt] = []
    append, shown = out.append, MessageExt.shown
    at = 0
    for row, queue_offset, position in zip(rows, queue_offsets, positions, strict=True):
        (size, topic, queue_id, body, tags, keys, properties, _host, born_ts, store_ts, _group,
         uniq_id, reconsume_times, _flag, _sys_flag) = row  # fmt: skip
        append(
            shown(
                topic,
                uniq_id,
                properties,
                body,
                tags,
                keys,
                f"{offset_msg_id_prefix}{position:016X}",
                broker_name,
                queue_id,
                queue_offset,
                position,
                born_ts,
                store_ts,
                reconsume_times,
            )
        )
        at += size
    if at != len(raw):
        raise _bad(f"{len(raw) - at} bytes after the last message")
    return out
