"""Security building blocks shared by every raftmq process and tool (issue #18).

This package imports nothing of the project (like `mqcli` and `msgcodec`), so servers, the
bundled clients and the tools all use the same copy:

- `mqsecurity.credentials`: an AccessKey / SecretKey pair and its JSON file.
- `mqsecurity.signing`: RocketMQ 5's request signature (``authorization: MQv2-HMAC-SHA1
  Credential=..., SignedHeaders=x-mq-date-time, Signature=...``): made by clients, parsed and
  checked by servers.
- `mqsecurity.tls`: certificate, key and CA files, and the gRPC credentials made from them.
- `mqsecurity.pki`: a local certificate authority and the certificates of a group's members
  (identity ``raftmq://member/<group>/<node-id>`` in the subject alternative name) and of tools.
- `mqsecurity.channels`: one way to open a client channel, plaintext or TLS, signing every call
  when credentials are given.
"""

from mqsecurity.errors import (
    CertificateError,
    SecurityError,
    SignatureError,
    SignatureMismatchError,
)

__all__ = ["CertificateError", "SecurityError", "SignatureError", "SignatureMismatchError"]
