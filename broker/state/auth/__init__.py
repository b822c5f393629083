"""Users and permissions (RocketMQ 5.3 ACL 2.0) as replicated state: the model and rule matcher
(`model`), the records (`records`) and the table every member applies them to (`table`), secrets
sealed at rest (`secrets`). The admin component behind CreateUser ... ListAcl and the call guard
are above this layer. docs/SECURITY.md, "Users and permissions".
"""
