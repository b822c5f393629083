"""The RocketMQ 5 front end's client table (broker/frontends/v2/clients.py) and the error-code
mapping (broker/frontends/v2/codes.py), without gRPC."""

from __future__ import annotations

import pytest

from broker.frontends.v2.clients import ClientTable, TooManyClientsError, UnknownClientError
from broker.frontends.v2.codes import V2_CODE_BY_ERROR, v2_code_name
from broker.frontends.v2.stubs import load
from broker.state.errors import InvalidRequestError


class Clock:
    def __init__(self) -> None:
        self.ms = 1_000

    def __call__(self) -> int:
        return self.ms


def test_heartbeat_needs_settings_first_and_expires() -> None:
    clock = Clock()
    table = ClientTable(max_clients=10, expiry_ms=100, clock_ms=clock)
    with pytest.raises(UnknownClientError):
        table.seen("c1")
    table.settings("c1", 1, 6, "")
    assert table.seen("c1").client_type == 1
    clock.ms += 99
    table.seen("c1")  # refreshed
    clock.ms += 100
    with pytest.raises(UnknownClientError):
        table.seen("c1")
    assert len(table) == 0


def test_table_is_bounded_and_terminated_clients_go() -> None:
    clock = Clock()
    table = ClientTable(max_clients=2, expiry_ms=1_000, clock_ms=clock)
    table.settings("a", 1, 6, "")
    table.settings("b", 3, 8, "group")
    with pytest.raises(TooManyClientsError):
        table.settings("c", 1, 6, "")
    table.settings("a", 1, 6, "")  # a known client may always refresh
    assert table.terminated("a") and not table.terminated("a")
    table.settings("c", 1, 6, "")
    assert len(table) == 2


@pytest.mark.parametrize("client_id", ["", "x" * 256])
def test_client_ids_are_bounded(client_id: str) -> None:
    with pytest.raises(InvalidRequestError):
        ClientTable().settings(client_id, 1, 6, "")


def test_every_mapped_code_exists_in_the_protocol() -> None:
    v2 = load()[0]
    for name in [*V2_CODE_BY_ERROR.values(), v2_code_name("SOMETHING_NEW")]:
        assert v2.Code.Value(name) > 0


def test_every_rpc_of_the_service_has_a_handler() -> None:
    from broker.frontends.v2.service import MessagingServicer

    service = load()[1].DESCRIPTOR.services_by_name["MessagingService"]
    missing = [m.name for m in service.methods if not callable(getattr(MessagingServicer, m.name))]
    assert missing == []
