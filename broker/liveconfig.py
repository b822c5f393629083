"""Live broker.conf changes: ``UpdateBrokerConfig`` (mqadmin updateBrokerConfig) sets or
clears a key that can change while the group runs, through the Raft log, so every member of the
broker group takes the same value (docs/CONFIG.md, "Live keys").

The leader decides (broker.configkeys marks the live keys; the value goes through the key's
parser and the cross-key checks of broker.conf, against the leader's broker.conf with the
group's overrides laid over it) and proposes one ``ENTRY_BROKER_CONFIG`` record
(broker.state.brokerconf), once the group's feature level allows it (broker/state/features.py).
Every member keeps the group's overrides in its state (and snapshots), and lays them over its
own broker.conf: an override wins until it is cleared. The components read their settings at
each use (``NodeContext.cfg``), so the new value takes effect at the next use on every member.
"""

from __future__ import annotations

import dataclasses
import difflib
import logging
from collections.abc import Mapping
from typing import Any

from broker.components.applied import NodeContext, require_leader
from broker.components.settings import ServiceConfig
from broker.config import BrokerConfig, ConfigError, check_value_rules
from broker.configkeys import KEYS, LIVE_KEYS
from broker.configview import config_view
from broker.state import brokerconf, features
from broker.state.errors import FeatureLevelTooLowError, InvalidRequestError
from broker.state.records import ENTRY_BROKER_CONFIG
from prockit.livekeys import RESTART_HINT

logger = logging.getLogger(__name__)

# Where GetBrokerConfig says a value comes from.
SOURCE_LIVE = "live"
SOURCE_FILE = "broker.conf"
# Close matches an unknown key's refusal suggests.
MAX_SUGGESTIONS = 3


def _text(value: object) -> str:
    """A live key's value as broker.conf spells it (the live keys are numbers and booleans)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    assert isinstance(value, int | str), f"a live key of another kind: {value!r}"
    return str(value)


def check_key(key: str) -> None:
    """InvalidRequestError unless ``key`` is a broker.conf key that can change live: an
    unknown key with close matches suggested, a key read at start with what to do instead."""
    if key not in KEYS:
        near = difflib.get_close_matches(key, list(KEYS), n=MAX_SUGGESTIONS)
        hint = f"; did you mean {', '.join(near)}?" if near else " (docs/CONFIG.md lists them)"
        raise InvalidRequestError(f"unknown broker.conf key {key!r:.80}{hint}")
    if key not in LIVE_KEYS:
        raise InvalidRequestError(
            f"key {key!r} {RESTART_HINT} and restart the nodes one at a time (docs/CONFIG.md); "
            f"the keys that change live: {', '.join(sorted(LIVE_KEYS))}"
        )


def parsed_overrides(overrides: Mapping[str, str]) -> dict[str, Any]:
    """The group's overrides this release can take (key -> parsed value): a live key whose
    value its parser takes. Anything else (a record of a later release's key; the leader never
    proposes one) is left out with a warning, the same on every member of this release."""
    out: dict[str, Any] = {}
    for key, text in sorted(overrides.items()):
        try:
            check_key(key)
            out[key] = KEYS[key].parse(text)
        except (InvalidRequestError, ValueError) as exc:
            logger.warning("broker config override %s=%.80r left out: %.200s", key, text, exc)
    return out


def effective_config(cfg: BrokerConfig, overrides: Mapping[str, str]) -> BrokerConfig:
    """``cfg`` (the node's broker.conf) with the group's live overrides laid over it."""
    return dataclasses.replace(cfg, **parsed_overrides(overrides))


def service_overlay(base: ServiceConfig, overrides: Mapping[str, str]) -> ServiceConfig:
    """The service settings ``base`` with the overrides laid over it (each live key's value
    goes where its table row says: ServiceConfig fields only)."""
    fields: dict[str, Any] = {}
    for key, parsed in parsed_overrides(overrides).items():
        for into in KEYS[key].to:
            assert into.target == "service", (key, into)
            fields[into.field] = into.value_of(parsed)
    return dataclasses.replace(base, **fields)


def check_update(cfg: BrokerConfig, key: str, value: str) -> str:
    """The value of a change of ``key`` as broker.conf spells it, once the key can change
    live, its parser takes ``value`` and the cross-key checks pass against ``cfg`` (the
    effective config) with the change; InvalidRequestError otherwise."""
    check_key(key)
    try:
        parsed = KEYS[key].parse(value)
    except ValueError as exc:
        raise InvalidRequestError(f"key {key!r}: {value!r:.80} {exc}") from None
    values = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg)}
    values[key] = parsed
    try:
        # Every key counts as set: the node's broker.conf and the overrides give them all.
        check_value_rules(values, dict.fromkeys(values, ""), "UpdateBrokerConfig")
    except ConfigError as exc:
        raise InvalidRequestError(str(exc)) from None
    text = _text(parsed)
    brokerconf.check_entry(key, text)
    return text


class LiveConfig:
    """A node's broker.conf with the group's live overrides: what GetBrokerConfig shows and
    UpdateBrokerConfig changes (on the leader)."""

    def __init__(self, ctx: NodeContext, cfg: BrokerConfig | None) -> None:
        self.ctx = ctx
        self.cfg = cfg  # None: a broker built without a broker.conf (tests): no keys

    def effective(self) -> BrokerConfig | None:
        if self.cfg is None:
            return None
        return effective_config(self.cfg, self.ctx.sm.config_overrides)

    def view(self) -> tuple[dict[str, str], dict[str, str]]:
        """Every key's effective value (broker.configview) and where it comes from
        (:data:`SOURCE_LIVE` or :data:`SOURCE_FILE`: broker.conf or its default)."""
        cfg = self.effective()
        if cfg is None:
            return {}, {}
        live = parsed_overrides(self.ctx.sm.config_overrides)
        values = config_view(cfg)
        return values, {k: SOURCE_LIVE if k in live else SOURCE_FILE for k in values}

    async def update(self, key: str, value: str, clear: bool) -> tuple[str, int]:
        """Set ``key`` to ``value`` (or clear its override: the node's broker.conf value
        again) on every member; the value now in effect here and the record's index."""
        require_leader(self.ctx.node)
        check_key(key)
        level = self.ctx.node.feature_level()
        if not features.allowed(features.BROKER_CONFIG_RECORD, level):
            needed = features.GATES[features.BROKER_CONFIG_RECORD]
            raise FeatureLevelTooLowError(
                f"the group's feature level is {level}; live broker config changes need level "
                f"{needed}: upgrade every member, then raise the level (docs/UPGRADE.md), or "
                f"edit broker.conf on every node and restart them one at a time"
            )
        cfg = self.effective()
        if cfg is None:
            raise InvalidRequestError("this node runs without a broker.conf")
        if clear:
            record = brokerconf.encode_record(brokerconf.OP_CLEAR, key)
        else:
            record = brokerconf.encode_record(brokerconf.OP_SET, key, check_update(cfg, key, value))
        first, _, _ = await self.ctx.node.propose([record], ENTRY_BROKER_CONFIG)
        now = self.effective()
        assert now is not None
        return config_view(now)[key], first
