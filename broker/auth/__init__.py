"""Users and permissions (RocketMQ 5.3 ACL 2.0): the model and rule matcher (`model`), the
replicated records (`records`) and table (`table`), secrets sealed at rest (`secrets`), the
per-RPC resource table (`rpcmap`), the call guard on the client port (`guard`) and the admin
component behind CreateUser ... ListAcl (`admin`). docs/SECURITY.md, "Users and permissions".
"""
