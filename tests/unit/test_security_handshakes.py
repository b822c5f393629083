"""mqsecurity.handshakes: counting gRPC's failed-TLS-handshake lines on a server's stderr without
changing what the operator's log shows, and without losing what a dying process wrote last."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from mqsecurity import handshakes
from mqsecurity.handshakes import (
    MAX_LINE_BYTES,
    LineFilter,
    _config_says_tls,
    handshake_reason,
    shown,
)

# As grpcio 1.85.1 writes them (checked against a real refused handshake by
# tests/integration/test_security_transport.py).
NO_CERT = (
    b"I1124 22:40:54.830304    2257 ssl_transport_security.cc:2563] Handshake failed with error "
    b"SSL_ERROR_SSL: error:100000c0:SSL routines:OPENSSL_internal:"
    b"PEER_DID_NOT_RETURN_A_CERTIFICATE: Invalid certificate verification context\n"
)
OTHER_CA = (
    b"I1124 22:45:18.189509    4155 ssl_transport_security.cc:2563] Handshake failed with error "
    b"SSL_ERROR_SSL: error:1000007d:SSL routines:OPENSSL_internal:CERTIFICATE_VERIFY_FAILED: "
    b"unable to get local issuer certificate\n"
)
INFO_WARNING = (
    b"W1124 22:45:18.055928    4099 log.cc:102] Log level INFO is not suitable for production.\n"
)
GRPC_ERROR = b"E1124 22:45:19.000001    4099 server.cc:10] something broke\n"
ERROR_LEVEL = 2
INFO_LEVEL = 0


def test_the_handshake_line_names_its_tls_error() -> None:
    assert handshake_reason(NO_CERT) == "PEER_DID_NOT_RETURN_A_CERTIFICATE"
    assert handshake_reason(OTHER_CA) == "CERTIFICATE_VERIFY_FAILED"
    assert handshake_reason(GRPC_ERROR) is None
    assert handshake_reason(b"a Python line saying Handshake failed with error x\n") is None


def test_grpc_lines_below_the_operators_verbosity_are_not_shown() -> None:
    for line in (NO_CERT, INFO_WARNING):
        assert not shown(line, ERROR_LEVEL)
        assert shown(line, INFO_LEVEL)
    assert shown(GRPC_ERROR, ERROR_LEVEL)
    assert shown(b"I am a Python log line\n", ERROR_LEVEL)


def test_the_filter_counts_across_chunks_and_passes_other_bytes_unchanged() -> None:
    python_lines = b"2026-11-24 INFO raftmq: started\nTraceback (most recent call last):\n"
    stream = INFO_WARNING + python_lines + NO_CERT + GRPC_ERROR + OTHER_CA + b"no newline"
    lines = LineFilter(ERROR_LEVEL)
    out, reasons = b"", []
    for at in range(0, len(stream), 7):  # chunk borders fall inside lines
        data, found = lines.feed(stream[at : at + 7])
        out += data
        reasons += found
    out += lines.flush()
    assert reasons == ["PEER_DID_NOT_RETURN_A_CERTIFICATE", "CERTIFICATE_VERIFY_FAILED"]
    assert out == python_lines + GRPC_ERROR + b"no newline"


def test_a_line_longer_than_the_bound_is_passed_on_unexamined() -> None:
    lines = LineFilter(ERROR_LEVEL)
    long_line = b"x" * (MAX_LINE_BYTES + 10) + NO_CERT
    out, reasons = lines.feed(long_line[: MAX_LINE_BYTES + 5])
    assert out == long_line[: MAX_LINE_BYTES + 5]  # memory stays bounded
    rest, reasons2 = lines.feed(long_line[MAX_LINE_BYTES + 5 :] + NO_CERT)
    assert out + rest == long_line  # the long line whole; the next one counted, hidden
    assert reasons == [] and reasons2 == ["PEER_DID_NOT_RETURN_A_CERTIFICATE"]


def test_the_tap_process_forwards_filters_and_reports() -> None:
    count_r, count_w = os.pipe()
    child = subprocess.Popen(
        [sys.executable, "-m", "mqsecurity.handshakes", str(ERROR_LEVEL), str(count_w)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        pass_fds=(count_w,),
    )
    os.close(count_w)
    out, _ = child.communicate(b"python line\n" + NO_CERT + NO_CERT + OTHER_CA, timeout=20)
    with os.fdopen(count_r, "rb") as reports:
        assert reports.read().split() == [
            b"PEER_DID_NOT_RETURN_A_CERTIFICATE",
            b"PEER_DID_NOT_RETURN_A_CERTIFICATE",
            b"CERTIFICATE_VERIFY_FAILED",
        ]
    assert child.returncode == 0 and out == b"python line\n"


def test_install_counts_and_loses_nothing_a_dying_process_wrote() -> None:
    """A process that installs the tap, has gRPC-style lines written to its fd 2, counts them,
    and ends with os._exit right after its last words: every line it showed reaches the real
    stderr."""
    code = textwrap.dedent(
        f"""
        import os, sys, time
        from mqsecurity import handshakes
        got = []
        handshakes.install(got.append)
        assert os.environ["GRPC_VERBOSITY"] == "INFO"
        os.write(2, {NO_CERT!r} + {OTHER_CA!r})
        deadline = time.monotonic() + 10
        while len(got) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        print("counted", got, file=sys.stderr, flush=True)
        os.write(2, b"FATAL last words\\n")
        os._exit(70)
        """
    )
    env = {k: v for k, v in os.environ.items() if k != "GRPC_VERBOSITY"}
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, timeout=30, env=env, check=False
    )
    assert done.returncode == 70
    assert done.stderr.decode().splitlines() == [
        "counted ['PEER_DID_NOT_RETURN_A_CERTIFICATE', 'CERTIFICATE_VERIFY_FAILED']",
        "FATAL last words",
    ]
    assert handshakes.DEFAULT_VERBOSITY == "ERROR"


def test_the_quick_look_at_the_config_file_finds_tls(tmp_path: Path) -> None:
    conf = tmp_path / "broker.conf"
    conf.write_text("brokerName=a\n  tlsEnable = TRUE \n")
    assert _config_says_tls(["-c", str(conf)]) and _config_says_tls([f"--config={conf}"])
    conf.write_text("tlsEnable=false\n# tlsEnable=true\n")
    assert not _config_says_tls(["-c", str(conf)])
    assert not _config_says_tls(["-c", str(tmp_path / "missing.conf")]) and not _config_says_tls([])
