"""The ACL rule matcher: wildcards and prefixes, Deny wins, default deny, Super, source IPs."""

from __future__ import annotations

import pytest

from broker.state.auth.model import (
    ALL,
    ALLOW,
    DENY,
    GET,
    NORMAL,
    PUB,
    SUB,
    SUPER,
    Resource,
    Rule,
    User,
    decide,
    parse_actions,
    parse_resource,
    parse_source_ips,
    peer_ip,
    rule_from_doc,
)
from broker.state.errors import InvalidRequestError

ALICE = User("alice", "sealed", NORMAL)


def rule(
    resource: str, actions: tuple[str, ...], decision: str = ALLOW, ips: tuple[str, ...] = ()
) -> Rule:
    return Rule(parse_resource(resource), actions, decision, parse_source_ips(list(ips)))


def t(name: str) -> Resource:
    return Resource("Topic", name)


def test_exact_prefix_and_any_names() -> None:
    assert parse_resource("Topic:orders").matches(t("orders"))
    assert not parse_resource("Topic:orders").matches(t("orders2"))
    assert parse_resource("Topic:order-*").matches(t("order-eu"))
    assert parse_resource("Topic:order-*").matches(t("order-"))
    assert not parse_resource("Topic:order-*").matches(t("orders"))
    assert parse_resource("Topic:*").matches(t("anything"))
    assert not parse_resource("Topic:*").matches(Resource("Group", "anything"))


def test_default_deny_and_allow() -> None:
    rules = [rule("Topic:orders", (PUB,))]
    assert decide(ALICE, rules, [(t("orders"), PUB)], "127.0.0.1") is None
    assert decide(ALICE, rules, [(t("orders"), SUB)], "127.0.0.1") == (t("orders"), SUB)
    assert decide(ALICE, rules, [(t("other"), PUB)], "127.0.0.1") == (t("other"), PUB)
    assert decide(ALICE, [], [(t("orders"), PUB)], "127.0.0.1") == (t("orders"), PUB)


def test_every_pair_must_be_allowed() -> None:
    rules = [rule("Topic:orders", (SUB,))]
    wants = [(t("orders"), SUB), (Resource("Group", "g"), SUB)]
    assert decide(ALICE, rules, wants, "127.0.0.1") == (Resource("Group", "g"), SUB)


def test_deny_wins_over_a_broader_or_narrower_allow() -> None:
    rules = [rule("Topic:*", (ALL,)), rule("Topic:secret-*", (SUB,), DENY)]
    assert decide(ALICE, rules, [(t("secret-x"), PUB)], "1.2.3.4") is None
    assert decide(ALICE, rules, [(t("secret-x"), SUB)], "1.2.3.4") == (t("secret-x"), SUB)
    narrow_allow = [rule("Topic:a", (PUB,)), rule("Topic:*", (PUB,), DENY)]
    assert decide(ALICE, narrow_allow, [(t("a"), PUB)], "1.2.3.4") == (t("a"), PUB)


def test_all_covers_every_action() -> None:
    rules = [rule("Group:g", (ALL,))]
    for action in (PUB, SUB, GET):
        assert decide(ALICE, rules, [(Resource("Group", "g"), action)], "::1") is None


def test_super_may_do_everything() -> None:
    root = User("root", "sealed", SUPER)
    assert decide(root, [rule("Topic:*", (ALL,), DENY)], [(t("x"), PUB)], "") is None


def test_source_ips() -> None:
    rules = [rule("Topic:t", (PUB,), ips=("10.0.0.0/8", "192.168.1.7"))]
    assert decide(ALICE, rules, [(t("t"), PUB)], "10.1.2.3") is None
    assert decide(ALICE, rules, [(t("t"), PUB)], "192.168.1.7") is None
    assert decide(ALICE, rules, [(t("t"), PUB)], "192.168.1.8") is not None
    assert decide(ALICE, rules, [(t("t"), PUB)], "") is not None
    assert peer_ip("ipv4:127.0.0.1:5555") == "127.0.0.1"
    assert peer_ip("ipv6:[::1]:5555") == "::1"
    assert peer_ip("unix:/tmp/x") == ""


@pytest.mark.parametrize(
    "text",
    ["Topic", "Queue:t", "Topic:", "Topic:a*b", "Topic:" + "x" * 256, "Topic:a b", 5, "Topic:**"],
)
def test_bad_resources_are_refused(text: object) -> None:
    with pytest.raises(InvalidRequestError):
        parse_resource(text)


def test_parsing_normalizes_and_bounds() -> None:
    assert parse_resource("topic:T").type == "Topic"
    assert parse_actions(["sub", "Pub", "PUB"]) == (PUB, SUB)
    assert parse_source_ips(["10.1.2.3/8"]) == ("10.0.0.0/8",)
    for bad in ([], ["Publish"], [3]):
        with pytest.raises(InvalidRequestError):
            parse_actions(bad)
    with pytest.raises(InvalidRequestError):
        parse_source_ips(["1.2.3.4"] * 17)
    with pytest.raises(InvalidRequestError):
        parse_source_ips(["not-an-ip"])
    with pytest.raises(InvalidRequestError):
        rule_from_doc({"resource": "Topic:t", "actions": ["Pub"], "decision": "Maybe"})
    with pytest.raises(InvalidRequestError):
        rule_from_doc({"resource": "Topic:t", "actions": ["Pub"] * 9, "decision": "Allow"})
