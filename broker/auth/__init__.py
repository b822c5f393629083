"""Users and permissions (RocketMQ 5.3 ACL 2.0): the model and rule matcher (`model`), the
replicated records (`records`) and table (`table`), secrets sealed at rest (`secrets`) and the
admin component behind CreateUser ... ListAcl (`admin`); the call guard and the per-RPC resource
table are the front ends' (:mod:`broker.frontends.authguard`, :mod:`broker.frontends.rpcmap`).
docs/SECURITY.md, "Users and permissions".
"""
