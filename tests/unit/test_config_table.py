"""The table of broker.conf keys (broker.configkeys.KEYS): every key parses its default, integer
bounds are refused naming the key and the bound, each default is written once (the field a key
goes to keeps it), the configs built from a broker.conf carry every key's value, and the docs
agree with the table."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any

import pytest

from broker import configdocs, configkeys
from broker.config import (
    ConfigError,
    node_config,
    parse_config,
    service_config,
    settings_for,
    v2_settings,
)
from broker.configkeys import INHERITED, KEYS, QUOTAS, TARGET_TYPES, IntIn, Into

ROOT = Path(__file__).resolve().parents[2]
BASE = "dLegerPeers=n0-127.0.0.1:40911;n1-127.0.0.1:40912\ndLegerSelfId=n0\n"
INT_KEYS = sorted(name for name, key in KEYS.items() if isinstance(key.parse, IntIn))

# A value other than the default for every key that goes to a field, all valid together.
NON_DEFAULTS = """\
dLegerGroup=g7
dLegerPeerClientAddrs=n0-127.0.0.1:1911;n1-127.0.0.1:1912
dLegerJoinAddr=127.0.0.1:5000
dLegerPromisePath=/tmp/x.promise
preferredLeaderId=n1
listenPort=10999
brokerIP1=127.0.0.2
brokerName=bb
grpcServerPort=18081
autoCreateTopicEnable=true
slaveReadEnable=true
defaultTopicQueueNums=3
maxMessageSize=1000
accessMessageInMemoryMaxRatio=33
consumerOffsetCommitIntervalMs=77
popMaxDeliveryAttempts=5
subscriptionGroupsPerUser=11
popWaitersPerUser=12
longPollsPerUser=13
consumersPerUser=14
producersPerUser=25
queueLocksPerUser=15
pendingOffsetsPerUser=16
topicsPerUser=17
offsetGroupsPerUser=18
grpcClientsPerUser=19
popMinInvisibleTimeMs=2000
transactionTimeOut=1234
transactionCheckInterval=2345
transactionCheckMax=3
timerMaxDelaySec=100
popAutoRenewInvisibleMs=5000
popAutoRenewMaxMs=50000
retentionCheckIntervalMs=1500
raftTickMs=10
raftHeartbeatIntervalMs=20
raftElectionTimeoutMs=300
rpcTimeoutMs=999
flushDiskType=ASYNC_FLUSH
flushIntervalCommitLog=7
diskSpaceReserveBytes=0
fileReservedTime=100
deleteWhen=05
maxLagRetentionHours=3
scrubBytesPerSec=0
chainCheckIntervalMs=0
snapshotTransferBytesPerSec=2097152
advertisedClientAddr=127.0.0.1:7777
unsafeAckBeforeReplication=true
mappedFileSizeCommitLog=1048576
mappedFileSizeEntryIndex=131072
"""


def _v2_config_type() -> type:
    """V2Config, whose module loads the RocketMQ 5 stubs (build/rmq5, make venv)."""
    stubs = pytest.importorskip("broker.frontends.v2.stubs")
    try:
        stubs.load()
    except stubs.StubsMissingError as exc:
        pytest.skip(str(exc))
    from broker.frontends.v2.service import V2Config

    return V2Config


def _target_type(target: str) -> type:
    return _v2_config_type() if target == "v2" else TARGET_TYPES[target]


def _field_default(cls: type, name: str) -> Any:
    (spec,) = (f for f in dataclasses.fields(cls) if f.name == name)
    if spec.default_factory is not dataclasses.MISSING:
        return spec.default_factory()
    return spec.default


def test_every_key_parses_its_default() -> None:
    for name, key in KEYS.items():
        if key.default is None:
            continue
        assert isinstance(key.default, str), name
        key.parse(key.default)  # raises on a default its own parser refuses
    assert parse_config(BASE).dLegerSelfId == "n0"


@pytest.mark.parametrize("name", INT_KEYS)
def test_integer_bounds_are_refused_naming_the_key_and_the_bound(name: str) -> None:
    parse = KEYS[name].parse
    assert isinstance(parse, IntIn)
    assert parse(str(parse.low)) == parse.low and parse(str(parse.high)) == parse.high
    below = parse.low - 1
    if parse.off and below == 0:
        below = -1  # 0 turns it off: accepted
    for bad, bound in ((below, parse.low), (parse.high + 1, parse.high)):
        with pytest.raises(ConfigError) as err:
            parse_config(BASE + f"{name}={bad}\n")
        message = str(err.value)
        assert f"key '{name}'" in message and str(bound) in message, message


def test_an_off_switch_accepts_zero_and_says_so_below_its_minimum() -> None:
    assert parse_config(BASE + "scrubBytesPerSec=0\n").scrubBytesPerSec == 0
    with pytest.raises(ConfigError, match=r"scrubBytesPerSec.*below 65536 \(0 turns the scr"):
        parse_config(BASE + "scrubBytesPerSec=1\n")


def test_a_default_is_written_once() -> None:
    """A key whose value goes, unconverted, to a field with a default takes that default
    (INHERITED) instead of writing it again; a converted or v2 one names a constant, and
    equals the field's default through the conversion (checked below)."""
    for name, raw in configkeys._TABLE.items():
        for into in raw.to[:1]:
            if into.target not in TARGET_TYPES or into.convert is not None:
                continue
            field_default = _field_default(TARGET_TYPES[into.target], into.field)
            if field_default is not dataclasses.MISSING:
                assert raw.default is INHERITED, f"{name}: write its default on {into}"


@pytest.mark.parametrize("target", ["node", "store", "service", "v2"])
def test_table_defaults_equal_the_fields_defaults(target: str) -> None:
    cls = _target_type(target)
    names = {f.name for f in dataclasses.fields(cls)}
    checked = 0
    for name, key in KEYS.items():
        for into in key.to:
            if into.target != target:
                continue
            assert into.field in names, f"{name} goes to a missing field {cls.__name__}.{into}"
            expected = _field_default(cls, into.field)
            if key.default is None or expected is dataclasses.MISSING:
                continue
            assert isinstance(key.default, str)
            assert into.value_of(key.parse(key.default)) == expected, (name, into)
            checked += 1
    assert checked, target


def test_every_keys_value_reaches_its_field() -> None:
    cfg = parse_config(BASE + NON_DEFAULTS)
    built: dict[str, Any] = {
        "node": node_config(cfg),
        "service": service_config(cfg),
    }
    built["store"] = built["node"].store
    v2 = v2_settings(cfg)
    for name, key in KEYS.items():
        for into in key.to:
            value = into.value_of(getattr(cfg, name))
            got = v2[into.field] if into.target == "v2" else getattr(built[into.target], into.field)
            assert got == value, (name, into)
            if key.default is not None and f"{name}=" in NON_DEFAULTS:
                assert isinstance(key.default, str)
                assert value != into.value_of(key.parse(key.default)), f"{name}: pick another"
    assert built["service"].delay_levels_ms == cfg.delay_levels_ms


@pytest.mark.parametrize("target", ["service", "v2"])
def test_every_field_of_the_brokers_configs_comes_from_a_key(target: str) -> None:
    """A field no key reaches would silently keep its default whatever broker.conf says."""
    reached = {into.field for key in KEYS.values() for into in key.to if into.target == target}
    made_of_several_keys = {"delay_levels_ms"} if target == "service" else set()
    fields = {f.name for f in dataclasses.fields(_target_type(target))}
    assert fields == reached | made_of_several_keys


def test_two_keys_never_go_to_one_field() -> None:
    seen: dict[tuple[str, str], str] = {}
    for name, key in KEYS.items():
        for into in key.to:
            assert seen.setdefault((into.target, into.field), name) == name, into
    assert set(settings_for(parse_config(BASE), "node")) <= {
        f.name for f in dataclasses.fields(TARGET_TYPES["node"])
    }


def test_quota_bounds_are_their_tables_and_defaults_a_tenth() -> None:
    assert len(QUOTAS) == 10
    for name, quota in QUOTAS.items():
        parse = KEYS[name].parse
        assert isinstance(parse, IntIn) and (parse.low, parse.high) == (1, quota.table_size)
        default = KEYS[name].default
        assert isinstance(default, str) and int(default) == quota.table_size // 10, name


def test_an_into_names_a_known_target() -> None:
    with pytest.raises(AssertionError):
        Into("nowhere", "x")


def test_docs_key_table_is_current() -> None:
    current = configdocs.DOCS_FILE.read_text(encoding="utf-8")
    assert configdocs.docs_text(current, KEYS) == current, "run python -m broker.configdocs"
    for name in KEYS:
        assert f"| `{name}` |" in current


# The features' pages explain keys in tables "| key | default | meaning |" of their own: their
# default column must say what the table says.
_THEME_PAGES = ("CLUSTER.md", "SECURITY.md", "RMQ5.md")
_UNITS = {"KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}


def _documented_defaults(page: str) -> list[tuple[str, str]]:
    rows, in_table = [], False
    for line in (ROOT / "docs" / page).read_text(encoding="utf-8").splitlines():
        if re.match(r"\| key( \(broker\.conf\))? \| default \| meaning \|", line):
            in_table = True
        elif not line.startswith("|"):
            in_table = False
        elif in_table and (m := re.match(r"\| `(\w+)` \| ([^|]*) \|", line)):
            rows.append((m.group(1), m.group(2).strip()))
    return rows


def _agrees(documented: str, default: str | None) -> bool:
    if default == "":  # an empty default is told by what it means ("as `tlsEnable`", ...)
        return documented not in ("required",) and not re.match(r"`\d", documented)
    if documented == "required":
        return default is None
    if m := re.fullmatch(r"`([^`]*)`( \(.*\))?", documented):  # a comment may follow
        return m.group(1) == default
    if m := re.fullmatch(r"(\d+) (KiB|MiB|GiB)", documented):
        return str(int(m.group(1)) * _UNITS[m.group(2)]) == default
    return False


@pytest.mark.parametrize("page", _THEME_PAGES)
def test_the_features_pages_give_the_tables_defaults(page: str) -> None:
    rows = [(name, text) for name, text in _documented_defaults(page) if name in KEYS]
    assert rows, page
    wrong = [(n, t, KEYS[n].default) for n, t in rows if not _agrees(t, KEYS[n].default)]  # type: ignore[arg-type]
    assert not wrong, wrong
