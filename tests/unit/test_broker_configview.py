"""GetBrokerConfig's view of a node's broker.conf (broker/configview.py): every key, spelled as
broker.conf takes it (the view parses back to the same config), credentials never shown."""

from __future__ import annotations

import json

from broker.config import parse_config
from broker.configkeys import KEYS
from broker.configview import SECRET_SET, config_view, runtime_info
from dledger.core import Role
from mqrelease import RELEASE

PASSWORD = "view-secret-password-1"
CONF = f"""\
brokerClusterName=ViewCluster
brokerName=view-a
enableDLegerCommitLog=true
dLegerPeers=n0-127.0.0.1:40911;n1-127.0.0.1:40912
dLegerSelfId=n1
listenPort=10921
storePathRootDir=/tmp/raftmq-view
flushDiskType=SYNC_FLUSH
aclEncryptionKeyPath=/tmp/raftmq-view/acl.key
authenticationEnabled=true
initAuthenticationUser={json.dumps({"username": "root", "password": PASSWORD})}
"""


def test_every_key_shown_and_no_secret() -> None:
    view = config_view(parse_config(CONF))
    # every key but enableDLegerCommitLog (always true, not kept)
    assert set(view) == set(KEYS) - {"enableDLegerCommitLog"}
    assert view["initAuthenticationUser"] == SECRET_SET
    assert all(PASSWORD not in v for v in view.values())
    assert view["dLegerPeers"] == "n0-127.0.0.1:40911;n1-127.0.0.1:40912"
    assert (view["flushDiskType"], view["authenticationEnabled"]) == ("SYNC_FLUSH", "true")
    assert view["dLegerGroup"] == "view-a"  # the default filled in


def test_the_view_parses_back_to_the_same_config() -> None:
    cfg = parse_config(CONF)
    view = config_view(cfg)
    shown = {k: v for k, v in view.items() if v != SECRET_SET}
    text = "enableDLegerCommitLog=true\n" + "".join(f"{k}={v}\n" for k, v in shown.items())
    again = parse_config(text)
    assert again.initAuthenticationUser is None  # the secret was not in the view
    assert config_view(again) == {**view, "initAuthenticationUser": ""}


class _Store:
    write_position = 4096

    def first_index(self) -> int:
        return 3


class _Node:
    role = Role.LEADER
    term = 7
    leader_id = "n1"
    last_index = 42
    store = _Store()


def test_runtime_info_names_the_node_and_its_log() -> None:
    info = runtime_info(_Node(), boot_ms=1_000, now_ms=61_000)  # type: ignore[arg-type]
    assert info == {
        "brokerVersionDesc": f"raftmq {RELEASE}",
        "bootTimestamp": "1000",
        "runtimeMs": "60000",
        "raftRole": "LEADER",
        "raftTerm": "7",
        "raftLeaderId": "n1",
        "raftFirstIndex": "3",
        "raftLastIndex": "42",
        "commitLogMaxOffset": "4096",
    }
