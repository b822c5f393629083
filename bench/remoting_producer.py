"""The remoting producer case of ``mqbench``: SEND_MESSAGE_V2 (310) requests, as a RocketMQ 4.x
producer sends them, over one connection of the ``remoting`` package's asyncio client.

Run by ``bench/__main__.py`` as its own process (the project's Python), so that the load
generator does not share a core's event loop with the harness. Keeps ``IN_FLIGHT`` coroutines
each sending one message and awaiting its answer back to back on one connection (a 4.x client
multiplexes its sends on one connection per broker the same way) for ``SECONDS`` after a
warm-up of ``WARMUP_S``, the queue ids taken in turn, and prints one JSON object as
``bench/closedloop.py`` does: messages sent, failures (an answer other than SUCCESS, a timeout,
a closed connection) and every measured send's latency in microseconds.

Security from the environment: ``REMOTING_TLS_CA`` (a CA file: TLS, verifying the server; unset:
plaintext) and ``REMOTING_ACCESS_KEY`` / ``REMOTING_SECRET_KEY`` (RocketMQ's ACL signature on
every request; unset: unsigned).

Usage: python -m bench.remoting_producer HOST:PORT TOPIC QUEUES SIZE_BYTES IN_FLIGHT SECONDS
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import itertools
import json
import os
import ssl
import sys
import time

from remoting.client import RemotingClient
from remoting.codes import RequestCode, ResponseCode
from remoting.connection import RemotingError
from remoting.protocol import RemotingCommand

# Bounds of the arguments: a typo must not start a million coroutines or an hour-long case.
MAX_IN_FLIGHT = 1024
MAX_QUEUES = 1024
MAX_SECONDS = 600.0
MAX_SIZE_BYTES = 4 << 20  # RocketMQ's default maxMessageSize
# Sends before the measured window starts (the connection and the broker's paths warm), as
# bench/closedloop.py's WARMUP_S.
WARMUP_S = 0.5
# One send's deadline (RocketMQ's sendMsgTimeout default).
SEND_TIMEOUT_S = 3.0
# At most this many latency samples per coroutine are kept (as bench/closedloop.py).
MAX_SAMPLES_PER_SENDER = 200_000
PRODUCER_GROUP = "BenchRemotingProducer"


def signed(fields: dict[str, str], body: bytes, access_key: str, secret_key: str) -> dict[str, str]:
    """``fields`` with RocketMQ's ACL signature: HmacSHA1 under the secret of every field's
    value (AccessKey included) in key order, then the body; base64."""
    out = {**fields, "AccessKey": access_key}
    material = "".join(out[k] for k in sorted(out)).encode() + body
    digest = hmac.new(secret_key.encode(), material, hashlib.sha1).digest()
    out["Signature"] = base64.b64encode(digest).decode()
    return out


def send_fields(topic: str, queue_id: int, queues: int) -> dict[str, str]:
    """SEND_MESSAGE_V2's short header names (SendMessageRequestHeaderV2) for one message."""
    return {
        "a": PRODUCER_GROUP,
        "b": topic,
        "c": "TBW102",
        "d": str(queues),
        "e": str(queue_id),
        "f": "0",
        "g": str(int(time.time() * 1000)),
        "h": "0",
        "i": "",
        "j": "0",
        "k": "false",
    }


async def run(
    client: RemotingClient, topic: str, queues: int, size: int, in_flight: int, seconds: float
) -> dict[str, object]:
    body = os.urandom(size)
    access_key = os.environ.get("REMOTING_ACCESS_KEY", "")
    secret_key = os.environ.get("REMOTING_SECRET_KEY", "")
    turn = itertools.count()
    start_at = time.monotonic() + WARMUP_S
    stop_at = start_at + seconds
    sent = [0] * in_flight
    failed = [0] * in_flight
    lat_us: list[list[int]] = [[] for _ in range(in_flight)]

    async def sender(i: int) -> None:
        mine = lat_us[i]
        while (t0 := time.monotonic()) < stop_at:
            fields = send_fields(topic, next(turn) % queues, queues)
            if access_key:
                fields = signed(fields, body, access_key, secret_key)
            cmd = RemotingCommand(RequestCode.SEND_MESSAGE_V2, 0, ext_fields=fields, body=body)
            try:
                answer = await client.request(cmd, SEND_TIMEOUT_S)
                ok = answer.code == ResponseCode.SUCCESS
            except (RemotingError, OSError):
                ok = False
            if t0 < start_at:
                continue
            if not ok:
                failed[i] += 1
                continue
            sent[i] += 1
            if len(mine) < MAX_SAMPLES_PER_SENDER:
                mine.append(int((time.monotonic() - t0) * 1e6))

    await asyncio.gather(*(sender(i) for i in range(in_flight)))
    return {
        "sent": sum(sent),
        "failed": sum(failed),
        "seconds": seconds,
        "latencies_us": [x for xs in lat_us for x in xs],
    }


async def _main(
    addr: str, topic: str, queues: int, size: int, in_flight: int, seconds: float
) -> dict[str, object]:
    host, _, port = addr.rpartition(":")
    ca = os.environ.get("REMOTING_TLS_CA", "")
    context = ssl.create_default_context(cafile=ca) if ca else None
    client = await RemotingClient.connect(host, int(port), ssl_context=context)
    try:
        return await run(client, topic, queues, size, in_flight, seconds)
    finally:
        await client.close()


def _usage(text: str) -> int:
    print(f"remoting_producer: {text}", file=sys.stderr)
    return 2


def main(argv: list[str]) -> int:
    if len(argv) != 6:
        return _usage((__doc__ or "").strip().splitlines()[-1])
    addr, topic = argv[0], argv[1]
    try:
        queues, size, in_flight = int(argv[2]), int(argv[3]), int(argv[4])
        seconds = float(argv[5])
    except ValueError:
        return _usage("QUEUES, SIZE_BYTES and IN_FLIGHT are integers, SECONDS a number")
    if not (0 < queues <= MAX_QUEUES and 0 < size <= MAX_SIZE_BYTES):
        return _usage(f"queues in (0, {MAX_QUEUES}], size in (0, {MAX_SIZE_BYTES}]")
    if not (0 < in_flight <= MAX_IN_FLIGHT and 0 < seconds <= MAX_SECONDS):
        return _usage(f"in-flight in (0, {MAX_IN_FLIGHT}], seconds in (0, {MAX_SECONDS}]")
    if ":" not in addr:
        return _usage(f"{addr!r} is not HOST:PORT")
    json.dump(asyncio.run(_main(addr, topic, queues, size, in_flight, seconds)), sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
