"""Hostile bytes to the peer sockets of a live 3-node group (docs/RAFT.md "Peer sockets",
docs/FORMAT.md "Peer socket"), in the manner of tests/integration/test_remoting_fuzz.py:

- hellos built by hypothesis: any version, group and sender (unicode, empty, over-long, a
  member's id, this node's own), followed by frames of random bytes and of random
  ``PeerMessage``-looking payloads, with lengths that lie;
- raw bytes on a fresh connection: no frame, a cut frame, a length over the bound.

Checked for every connection: the node answers with a well-formed answer (accepted, refused or
version) or closes, and never holds a connection open past the handshake deadline once the
sender is done. Afterwards: no process exited, the RSS of every node grew less than
:data:`RSS_GROWTH_BOUND_MIB`, what was written before is read back unchanged, and the group
still commits. Hypothesis runs derandomized with no example database.
"""

from __future__ import annotations

import struct
from collections import Counter
from collections.abc import Iterator

import pytest
from conftest import TEST_INDEX_FILE_BYTES, TEST_SEGMENT_BYTES
from fuzz_support import assert_group_survived, group_rss_mib, raw_exchange
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from dledger.server.peersock import (
    ANSWER_ACCEPTED,
    ANSWER_REFUSED,
    ANSWER_VERSION,
    FRAME_HEADER,
    HELLO_MAGIC,
    FrameError,
    decode_answer,
    frame,
)
from mqcluster.cluster import LocalCluster

pytestmark = [pytest.mark.integration]

HELLO_EXAMPLES = 250
RAW_EXAMPLES = 80
# Over the handshake deadline (3 s): a connection the node still holds after this, with the
# sender done (its write side shut), is held open.
CALL_TIMEOUT_S = 6.0
RSS_GROWTH_BOUND_MIB = 100
SEED = [f"seed-{i}".encode() for i in range(20)]
# LocalCluster's group (broker-a): hellos naming it and a member-like id are accepted.
GROUP = "broker-a"
ANSWERS = frozenset({ANSWER_ACCEPTED, ANSWER_REFUSED, ANSWER_VERSION})

NAMES = st.one_of(
    st.sampled_from([GROUP, "g", "n0", "n1", "n2", "n9", "", "x" * 255]),
    st.text(max_size=40),
)
PAYLOADS = st.one_of(
    st.binary(max_size=300),
    # PeerMessage-looking: a valid first key (fields 1..6, length-delimited), then noise.
    st.tuples(st.sampled_from([0x0A, 0x12, 0x1A, 0x22, 0x2A, 0x32]), st.binary(max_size=200)).map(
        lambda kv: bytes([kv[0], len(kv[1]) & 0x7F]) + kv[1]
    ),
)


def _name(text: str) -> bytes:
    raw = text.encode()[:255]
    return bytes((len(raw),)) + raw


@st.composite
def hellos(draw: st.DrawFn) -> tuple[bytes, int]:
    """A hello (maybe a lying one) and frames after it; the node it goes to."""
    if draw(st.booleans()):  # one the node accepts (an unknown member's id is served too)
        version, group, sender = 1, GROUP, draw(st.sampled_from(["n1", "n3", "n9"]))
    else:
        version = draw(st.sampled_from([0, 1, 2, 65535]))
        group = draw(NAMES)
        sender = draw(NAMES)
    hello = HELLO_MAGIC + struct.pack(">H", version) + _name(group) + _name(sender)
    frames = [frame(p) for p in draw(st.lists(PAYLOADS, max_size=4))]
    if draw(st.booleans()):
        size = draw(st.sampled_from([0xFFFFFFFF, 81 << 20, 1 << 20]))
        frames.append(FRAME_HEADER.pack(size) + draw(st.binary(max_size=16)))
    return frame(hello) + b"".join(frames), draw(st.integers(0, 2))


RAW = st.one_of(
    st.binary(max_size=400),
    st.binary(max_size=16).map(lambda b: FRAME_HEADER.pack(0xFFFFFFFF) + b),
    st.binary(min_size=1, max_size=64).map(lambda b: FRAME_HEADER.pack(len(b) + 10) + b),
    st.binary(max_size=64).map(frame),
)


@pytest.fixture(scope="module")
def group(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    cluster = LocalCluster(tmp_path_factory.mktemp("sockfuzz"))
    # Small segments and index files: the defaults (1 GiB, ~420 MB) are for production.
    small = {
        "mappedFileSizeCommitLog": str(TEST_SEGMENT_BYTES),
        "mappedFileSizeEntryIndex": str(TEST_INDEX_FILE_BYTES),
    }
    cluster.configure(3, auto_ports=True, extra=small)
    try:
        cluster.up()
        yield cluster
    finally:
        cluster.down(grace_s=5.0)
        cluster.purge()


class Fuzzer:
    def __init__(self, cluster: LocalCluster) -> None:
        self.ports = [n.socket_port for n in cluster.nodes]
        assert all(self.ports), "every node offers dLegerPeerSocketPort"
        self.answers: Counter[str] = Counter()
        self.bad: list[str] = []

    def send(self, node: int, data: bytes) -> None:
        """``data`` on a fresh connection, then our side shut: the node answers well-formed
        (or not at all) and closes within CALL_TIMEOUT_S."""
        received = raw_exchange(self.ports[node], data, CALL_TIMEOUT_S)
        if received is None:
            self.bad.append(f"{data[:40]!r}: the connection was held open")
            return
        self._check_answer(data, received)

    def _check_answer(self, data: bytes, received: bytes) -> None:
        if not received:
            self.answers["closed"] += 1
            return
        if len(received) < FRAME_HEADER.size:
            self.bad.append(f"{data[:40]!r}: a cut answer {received!r}")
            return
        (size,) = FRAME_HEADER.unpack_from(received)
        try:
            answer = decode_answer(received[FRAME_HEADER.size : FRAME_HEADER.size + size])
        except FrameError as exc:
            self.bad.append(f"{data[:40]!r}: a malformed answer ({exc}) {received[:40]!r}")
            return
        if answer.code not in ANSWERS:
            self.bad.append(f"{data[:40]!r}: answer code {answer.code}")
        self.answers[f"code {answer.code}"] += 1


def test_fuzz_peer_sockets(group: LocalCluster) -> None:
    f = Fuzzer(group)
    with group.client() as client:
        first = client.append(SEED)
        rss_before = group_rss_mib(group)

        @settings(max_examples=HELLO_EXAMPLES, derandomize=True, database=None, deadline=None,
                  phases=[Phase.generate], suppress_health_check=list(HealthCheck))  # fmt: skip
        @given(hellos())
        def fuzz_hellos(case: tuple[bytes, int]) -> None:
            data, node = case
            f.send(node, data)

        @settings(max_examples=RAW_EXAMPLES, derandomize=True, database=None, deadline=None,
                  phases=[Phase.generate], suppress_health_check=list(HealthCheck))  # fmt: skip
        @given(RAW, st.integers(0, 2))
        def fuzz_raw(data: bytes, node: int) -> None:
            f.send(node, data)

        fuzz_hellos()
        fuzz_raw()
        print(f"answers: {dict(f.answers)}")
        assert_group_survived(group, rss_before, RSS_GROWTH_BOUND_MIB)
        assert not f.bad, "\n".join(f.bad[:20])
        assert f.answers["code 0"] and f.answers["code 1"] and f.answers["code 2"], f.answers
        after = client.append([b"after"])
        for addr in group.client_addrs:
            entries = client.read_all(addr)
            got = {e.index: e.body for e in entries}
            assert [got.get(i) for i in range(first.first_index, first.last_index + 1)] == SEED
            assert got.get(after.first_index) in (b"after", None)
