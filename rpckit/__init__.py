"""The gRPC plumbing every raftmq server shares (the DLedger node's two ports, the broker's v1
and v2 front ends, the NameServer), in one copy each:

- :mod:`rpckit.status`: the error contract: a failure is a gRPC status, a text detail starting
  with a stable code and a structured ``ErrorInfo``; writing it (``abort``) and reading it
  (``read_error``).
- :mod:`rpckit.callguard`: the hook an application plugs in to admit or refuse each call
  (``CallGuard``, ``GuardInterceptor``); health and reflection stay open.
- :mod:`rpckit.decodeguard`: undecodable request bytes answered ``INVALID_ARGUMENT
  BAD_REQUEST`` instead of ``UNKNOWN`` and a traceback (``add_servicer``).
- :mod:`rpckit.serving`: binding a server's port (one clear start error) and the standard
  health and reflection services.

It imports nothing of the project but ``mqerrors`` (the codes) and ``mqsecurity`` (TLS), so
dledger, the broker and the NameServer all stand on it and none on another for it.
"""
