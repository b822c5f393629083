"""The admin component behind CreateUser ... ListAcl (`admin`); the replicated users and rules are
in :mod:`broker.state.auth`, the call guard in :mod:`broker.frontends.authguard`.
"""
