"""The command-line options and environment variables every raftmq tool reads to reach a secure
group: one spelling for ``mqadmin``, ``mqbench``, ``mqjepsen``, ``mqaudit --connect`` and the
demo (docs/SECURITY.md, "Tools").

    --tls-ca FILE         trust this CA (turns TLS on)          env RAFTMQ_TLS_CA
    --tls                 TLS, trusting the system's CAs
    --tls-cert FILE       present this client certificate (with --tls-key)
    --tls-key FILE        its key (mode 0600)
    --tls-server-name N   check the servers' certificates against N, not the dialled host
    --credentials FILE    {"accessKey": .., "secretKey": ..}, mode 0600  env RAFTMQ_CREDENTIALS
    --access-key AK       with --secret-key: the same, on the command line

Only long options: the tools' short letters are taken by their commands (``-s`` is a
timestamp or a tag expression in mqadmin, ``-a`` will be createAcl's actions).
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping
from typing import Any

from mqsecurity.channels import PLAINTEXT, ClientSecurity
from mqsecurity.credentials import Credentials, load_credentials
from mqsecurity.errors import SecurityError
from mqsecurity.tls import TlsFiles, channel_credentials

ENV_CREDENTIALS = "RAFTMQ_CREDENTIALS"
ENV_TLS_CA = "RAFTMQ_TLS_CA"

# (flags, add_argument keyword arguments); every default is None: "not given", so that a
# tool can tell an explicit choice from its own default (e.g. the local group's files).
OPTION_SPECS: tuple[tuple[tuple[str, ...], dict[str, Any]], ...] = (
    (
        ("--tls-ca",),
        {"metavar": "FILE", "help": f"CA certificate to trust; turns TLS on (env {ENV_TLS_CA})"},
    ),
    (("--tls",), {"action": "store_true", "default": None, "help": "TLS with the system's CAs"}),
    (("--tls-cert",), {"metavar": "FILE", "help": "client certificate to present (mutual TLS)"}),
    (("--tls-key",), {"metavar": "FILE", "help": "the client certificate's key (mode 0600)"}),
    (
        ("--tls-server-name",),
        {"metavar": "NAME", "help": "name the servers' certificates must carry"},
    ),
    (
        ("--credentials",),
        {
            "metavar": "FILE",
            "help": 'JSON {"accessKey": .., "secretKey": ..}, mode 0600, that signs every call '
            f"(env {ENV_CREDENTIALS})",
        },
    ),
    (("--access-key",), {"metavar": "AK", "help": "user name (AccessKey), with --secret-key"}),
    (
        ("--secret-key",),
        {
            "metavar": "SK",
            "help": "the user's SecretKey (visible to other local users in ps: prefer "
            "--credentials)",
        },
    ),
)
_DESTS: tuple[str, ...] = ("tls_ca", "tls", "tls_cert", "tls_key", "tls_server_name")
_DESTS += ("credentials", "access_key", "secret_key")


def add_security_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the options above to a plain argparse parser (one group in ``--help``)."""
    group = parser.add_argument_group("security (TLS and credentials, docs/SECURITY.md)")
    for flags, kwargs in OPTION_SPECS:
        group.add_argument(*flags, **kwargs)


def _given(args: argparse.Namespace) -> dict[str, Any]:
    return {d: getattr(args, d, None) for d in _DESTS if getattr(args, d, None) not in (None, "")}


def _tls(given: Mapping[str, Any], environ: Mapping[str, str]) -> TlsFiles | None:
    ca = given.get("tls_ca") or environ.get(ENV_TLS_CA) or None
    cert, key = given.get("tls_cert"), given.get("tls_key")
    if (cert is None) != (key is None):
        raise SecurityError("--tls-cert and --tls-key go together")
    if ca is None and cert is None and not given.get("tls"):
        if "tls_server_name" in given:
            raise SecurityError("--tls-server-name needs TLS (--tls-ca, --tls or --tls-cert)")
        return None
    files = TlsFiles(cert_path=cert, key_path=key, ca_path=ca)
    channel_credentials(files)  # every file readable, the key 0600: say so now, not per call
    return files


def _credentials(given: Mapping[str, Any], environ: Mapping[str, str]) -> Credentials | None:
    access_key, secret_key = given.get("access_key"), given.get("secret_key")
    if (access_key is None) != (secret_key is None):
        raise SecurityError("--access-key and --secret-key go together")
    path = given.get("credentials")
    if access_key is not None and secret_key is not None:
        if path is not None:
            raise SecurityError("give --credentials or --access-key/--secret-key, not both")
        return Credentials(access_key, secret_key)
    path = path or environ.get(ENV_CREDENTIALS) or None
    return load_credentials(path) if path is not None else None


def security_from_args(
    args: argparse.Namespace,
    environ: Mapping[str, str] | None = None,
    fallback: ClientSecurity = PLAINTEXT,
) -> ClientSecurity:
    """The security the options (then the environment) ask for. When neither names any TLS
    or credentials setting, ``fallback`` (a tool's default, e.g. the local group's files).
    `SecurityError` with the reason for a contradiction, a missing file or a credentials or
    key file that group or others can read."""
    env = os.environ if environ is None else environ
    given = _given(args)
    if not given and not env.get(ENV_TLS_CA) and not env.get(ENV_CREDENTIALS):
        return fallback
    return ClientSecurity(
        tls=_tls(given, env),
        credentials=_credentials(given, env),
        server_name=given.get("tls_server_name"),
    )


def security_argv(
    tls: TlsFiles | None, credentials_path: str | None, server_name: str | None = None
) -> list[str]:
    """The options that make another tool process (a load generator) reach a group the same
    way: the credentials travel as a file path, never as a secret on a command line."""
    argv: list[str] = []
    if tls is not None:
        argv += ["--tls-ca", tls.ca_path] if tls.ca_path is not None else ["--tls"]
        if tls.cert_path is not None and tls.key_path is not None:
            argv += ["--tls-cert", tls.cert_path, "--tls-key", tls.key_path]
    if server_name is not None:
        argv += ["--tls-server-name", server_name]
    if credentials_path is not None:
        argv += ["--credentials", credentials_path]
    return argv
