"""Live broker.conf changes: ``UpdateBrokerConfig`` (mqadmin updateBrokerConfig) sets or
clears a key that can change while the group runs, through the Raft log, so every member of the
broker group takes the same value (docs/CONFIG.md, "Live keys").

The leader decides (broker.configkeys marks the live keys; the value goes through the key's
parser and the cross-key checks of broker.conf, against the leader's broker.conf with the
group's overrides laid over it) and proposes one ``ENTRY_BROKER_CONFIG`` record
(broker.state.brokerconf), once the group's feature level allows it (broker/state/features.py).
Every member keeps the group's overrides in its state (and snapshots), and lays them over its
own broker.conf: an override wins until it is cleared. The service's components read their
settings at each use (``NodeContext.cfg``), so the new value takes effect at the next use on
every member; the keys of ``APPLIED_LIVE_KEYS`` (disk marks, scrubber rates, dedup window) are
pushed to their components by :class:`LiveSettings` when a member applies the record (or loads
a snapshot holding the table).
"""

from __future__ import annotations

import dataclasses
import difflib
import logging
from collections.abc import Mapping
from typing import Any

from broker.components.applied import NodeContext, require_leader
from broker.components.disk import DiskGuard
from broker.components.raftnode import RaftNode
from broker.components.scrubber import Scrubber
from broker.components.settings import ServiceConfig
from broker.config import BrokerConfig, ConfigError, check_value_rules, resume_percent_for
from broker.configkeys import APPLIED_LIVE_KEYS, KEYS, LIVE_KEYS
from broker.configview import config_view
from broker.state import brokerconf, features
from broker.state.errors import FeatureLevelTooLowError, InvalidRequestError
from broker.state.machine import BrokerStateMachine
from broker.state.records import ENTRY_BROKER_CONFIG
from dledger.log import ConfigError as NodeConfigError
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
    """``cfg`` (the node's broker.conf) with the group's live overrides laid over it. A
    resume mark the file left out follows an overridden refusal mark, as it follows the
    file's (so lowering diskSpaceWarningLevelRatio live is one change, not two)."""
    values = parsed_overrides(overrides)
    mark = values.get("diskSpaceWarningLevelRatio")
    if mark is not None and "diskSpaceResumeRatio" not in cfg.file_keys:
        values.setdefault("diskSpaceResumeRatio", resume_percent_for(mark))
    return dataclasses.replace(cfg, **values)


def service_overlay(base: ServiceConfig, overrides: Mapping[str, str]) -> ServiceConfig:
    """The service settings ``base`` with the overrides laid over it (each live key's value
    goes where its table row says: ServiceConfig fields only)."""
    fields: dict[str, Any] = {}
    for key, parsed in parsed_overrides(overrides).items():
        if key in APPLIED_LIVE_KEYS:
            continue  # pushed to its component by LiveSettings
        for into in KEYS[key].to:
            assert into.target == "service", (key, into)
            fields[into.field] = into.value_of(parsed)
    return dataclasses.replace(base, **fields)


def check_update(
    cfg: BrokerConfig, key: str, value: str, overrides: Mapping[str, str] | None = None
) -> str:
    """The value of a change of ``key`` as broker.conf spells it, once the key can change
    live, its parser takes ``value`` and the cross-key checks pass against ``cfg`` (the node's
    broker.conf) with the group's ``overrides`` and the change laid over it;
    InvalidRequestError otherwise."""
    check_key(key)
    try:
        parsed = KEYS[key].parse(value)
    except ValueError as exc:
        raise InvalidRequestError(f"key {key!r}: {value!r:.80} {exc}") from None
    text = _text(parsed)
    _check_rules(cfg, {**(overrides or {}), key: text}, "")
    brokerconf.check_entry(key, text)
    return text


def check_clear(cfg: BrokerConfig, overrides: Mapping[str, str], key: str) -> None:
    """InvalidRequestError unless the cross-key checks pass once ``key``'s override is gone
    (``cfg``: the node's broker.conf; its value comes back, e.g. a refusal mark below a
    resume mark still overridden)."""
    check_key(key)
    _check_rules(cfg, {k: v for k, v in overrides.items() if k != key}, f"clearing {key}: ")


def _check_rules(cfg: BrokerConfig, overrides: Mapping[str, str], prefix: str) -> None:
    """The cross-key checks of ``cfg`` with ``overrides`` laid over it (InvalidRequestError)."""
    after = effective_config(cfg, overrides)
    values = {f.name: getattr(after, f.name) for f in dataclasses.fields(after)}
    # What the node's broker.conf set, or a live override: "set"; the rest: "default".
    given = set(overrides) | cfg.file_keys
    try:
        check_value_rules(values, dict.fromkeys(given, ""), "UpdateBrokerConfig")
    except ConfigError as exc:
        raise InvalidRequestError(f"{prefix}{exc}") from None


class LiveSettings:
    """Pushes the live keys whose readers are not the service's (``APPLIED_LIVE_KEYS``) to
    them, each time the group's override table changes on this member: the state machine
    calls :meth:`apply` as it applies a broker config record or loads a snapshot, so every
    member takes the new value at the same index (the dedup window decides what apply stores).
    A combination a component refuses (a member whose broker.conf differs) keeps that
    component's previous settings, with a warning."""

    def __init__(
        self,
        cfg: BrokerConfig,
        sm: BrokerStateMachine,
        node: RaftNode,
        disk_guard: DiskGuard,
        scrubber: Scrubber,
    ) -> None:
        self.cfg, self.sm, self.node = cfg, sm, node
        self.disk_guard, self.scrubber = disk_guard, scrubber

    def apply(self, overrides: Mapping[str, str]) -> None:
        eff = effective_config(self.cfg, overrides)
        self.sm.set_dedup_window(eff.dedupWindowSeconds * 1000, eff.dedupWindowMaxIds)
        self.scrubber.set_rate(eff.scrubRecordsPerSecond)
        try:
            self.disk_guard.retune(eff.disk_watermarks)
        except ConfigError as exc:
            logger.warning("live disk marks left as they were: %s", exc)
        try:
            self.node.retune(
                retention_early_used_percent=eff.diskMaxUsedSpaceRatio,
                scrub_bytes_per_s=eff.scrubBytesPerSec,
            )
        except NodeConfigError as exc:
            logger.warning("live retention and scrub settings left as they were: %s", exc)


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
            assert self.cfg is not None  # effective() was not None
            check_clear(self.cfg, self.ctx.sm.config_overrides, key)
            record = brokerconf.encode_record(brokerconf.OP_CLEAR, key)
        else:
            assert self.cfg is not None  # effective() was not None
            text = check_update(self.cfg, key, value, self.ctx.sm.config_overrides)
            record = brokerconf.encode_record(brokerconf.OP_SET, key, text)
        first, _, _ = await self.ctx.node.propose([record], ENTRY_BROKER_CONFIG)
        now = self.effective()
        assert now is not None
        return config_view(now)[key], first
